"""The pages the service serves, against a real uvicorn server with a tiny model: their security
headers (a strict Content-Security-Policy, no framing, no sniffing) and, in a real browser
(Debian's Chromium, ``apt-get install chromium chromium-driver``, which ``.ci/run`` installs,
driven by Selenium), that they work under them with no error logged — the browser logs every CSP
violation — and load nothing from another origin (air-gapped hosts).

``GET /ui`` with a video model: a ``.pt`` file of latents goes in; while the server compiles the
size (its first request) the page says so, not "sending"; the fragmented MP4 plays (its
``currentTime`` advancing) while the last decode step is still held back, so before the answer has
ended, and the page counts this request's frames as they arrive, then offers the video for
download; it says the model has random weights, scales the video to the page, shows no canvas,
and draws the mesh for one device and for eight; a 5-frame clip of the size now compiled goes
straight to decoding, and the player's own clock reads its 0.31 s. With an image model (Flux.1's
architecture): a batch of two shows two PNGs (made by the page from the raw frames, pixel for pixel
the server's decode), one image the server's own PNG; the page says "compiling this size", then
"decoding" with a running clock while the decode is held, and a size already compiled goes straight
to decoding. Neither page says "null" anywhere, nor scrolls sideways at 1400 px; neither reports
an error. A server of several models: the page offers them in a select and shows the one chosen
(with one model it offers none). ``GET /docs`` (Swagger UI) and ``GET /redoc`` (Redoc) render the operations from the
package's own copies of their scripts."""

from __future__ import annotations

import base64
import contextlib
import io
import re
import shutil
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.helpers.image_reference import FLUX1_TINY
from tests.helpers.service_helpers import HeldRunner, latents, thread_server
from vaeserve import models
from vaeserve.service.http.middleware import PAGE_POLICY, REDOC_POLICY

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                                   reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--autoplay-policy=no-user-gesture-required"]


@contextlib.contextmanager
def chromium(profile) -> Iterator:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(DRIVER))  # no driver download
    try:
        yield browser
    finally:
        browser.quit()


def wait_for(browser, script: str, timeout: float = 60):
    """The first truthy value of ``script`` (JavaScript, returning a value), polled."""
    deadline = time.monotonic() + timeout
    while not (value := browser.execute_script(script)):
        assert time.monotonic() < deadline, f"never true: {script}"
        time.sleep(0.05)
    return value


@pytest.fixture(scope="module")
def page_server(tiny_model_dir):
    """The tiny model, loaded for this server alone: its programs are compiled by its own requests
    (the session's ``tiny_vae`` keeps the programs other test files compiled, and the page says
    whether a size was compiled before)."""
    with thread_server(models.load_vae(str(tiny_model_dir)), runner_factory=HeldRunner, max_batch=1,
                       max_frames=41) as srv:
        yield srv


@pytest.fixture(scope="module")
def image_server():
    """A Flux.1-architecture image model (2x spatial, random weights) whose decode is held until released."""
    with thread_server(models.init_vae(FLUX1_TINY, seed=0), runner_factory=HeldRunner, max_batch=2) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    with chromium(tmp_path_factory.mktemp("profile")) as browser:
        browser.set_window_size(1400, 900)  # the width at which a stray scrollbar once showed
        yield browser


PAGES = {"/ui": PAGE_POLICY, "/docs": PAGE_POLICY, "/redoc": REDOC_POLICY}


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_carries_a_strict_policy_and_no_inline_script(page_server, path):
    page = httpx.get(page_server.url + path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == PAGES[path]
    assert "frame-ancestors 'none'" in PAGES[path] and "script-src 'self';" in PAGES[path]
    assert page.headers["x-frame-options"] == "DENY" and page.headers["x-content-type-options"] == "nosniff"
    # No inline script, style element, style attribute or event handler (the policy would block them).
    html = page.text
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S)
    assert scripts and all("src=" in attributes and not body.strip() for attributes, body in scripts), scripts
    assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=", html), html
    # What it loads is served here, with the type the browser will insist on (nosniff).
    for url in re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html):
        asset = httpx.get(f"{page_server.url}/{url.lstrip('/')}")
        kind = "javascript" if url.endswith(".js") else "css"
        assert asset.status_code == 200 and kind in asset.headers["content-type"], url
        assert asset.headers["x-content-type-options"] == "nosniff"


@needs_browser
def test_the_page_plays_a_fragmented_mp4_before_the_answer_ends(page_server, browser, tmp_path):
    torch = pytest.importorskip("torch")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    x = latents((1, 16, 11, 4, 4), seed=21)  # 41 frames of 32x32: 2.6 s at 16 fps
    torch.save(torch.from_numpy(x), tmp_path / "latents.pt")
    torch.save(torch.from_numpy(latents((1, 16, 2, 4, 4), seed=22)), tmp_path / "short.pt")  # 5 frames
    HeldRunner.release.clear()
    assets = [httpx.get(page_server.url + f"/ui/app.{kind}").headers["content-type"] for kind in ("js", "css")]
    browser.get_log("browser")  # what earlier pages logged
    browser.get(page_server.url + "/ui")
    wait_for(browser, "return window.vaeserveUi.model")
    assert not browser.find_element(By.ID, "banner").is_displayed()  # a checkpoint's weights
    assert not browser.find_element(By.ID, "model-label").is_displayed()  # one model: nothing to choose
    assert [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "output")).options] == [
        "mp4-stream", "mp4", "frames"]
    model = browser.find_element(By.ID, "model").text
    assert "4x temporal: T latent frames make 1 + 4(T − 1) frames" in model and "41 frames" in model, model
    browser.find_element(By.ID, "file").send_keys(str(tmp_path / "latents.pt"))
    wait_for(browser, "return !document.getElementById('decode').disabled")
    assert browser.execute_script("return window.vaeserveUi.latents.shape") == [1, 16, 11, 4, 4]
    Select(browser.find_element(By.ID, "output")).select_by_value("mp4-stream")
    browser.find_element(By.ID, "decode").click()
    # Playing while the last step is held: the answer cannot have ended.
    first = wait_for(browser, "return document.getElementById('video').currentTime")
    wait_for(browser, f"return document.getElementById('video').currentTime > {first}")
    assert browser.execute_script("return window.vaeserveUi.responseEnded") is False
    # This request's frames, counted from the stream: some of the 41, not all (the last step is held).
    held = browser.execute_script("const ui = window.vaeserveUi; return [ui.framesReceived, ui.framesTotal, "
                                  "document.getElementById('progress').max]")
    assert 1 <= held[0] < 41 and held[1:] == [41, 41]
    HeldRunner.release.set()
    wait_for(browser, "return window.vaeserveUi.responseEnded")
    ui = browser.execute_script("const ui = window.vaeserveUi; return {status: ui.status, errors: ui.errors, "
                                "frames: ui.framesReceived, download: ui.download, phases: ui.phases, said: ui.said}")
    duration = browser.execute_script("return document.getElementById('video').duration")
    link = browser.find_element(By.ID, "download")
    link = [link.is_displayed(), link.get_attribute("href"), link.get_attribute("download")]
    shown = browser.execute_script(
        "const px = id => document.getElementById(id).getBoundingClientRect().width; return {"
        "canvas: getComputedStyle(document.getElementById('canvas')).display, video: px('video'), "
        "column: document.querySelector('main').clientWidth}")
    one_device = browser.execute_script(
        "return [document.getElementById('mesh').textContent, [...document.getElementById('bands').children]"
        ".map(band => band.textContent), document.getElementById('mesh-note').textContent]")
    text, sideways = _page_text(browser), _sideways(browser)
    # Eight devices (drawn from what GET /v1/models says of a mesh): 720p latents, split by width.
    eight = browser.execute_script(
        "window.vaeserveUi.drawMesh({dp: 1, tp: 8, devices: [...Array(8).keys()].map(i => `TPU_${i}`)}, "
        "[1, 16, 21, 90, 160]); const bands = document.getElementById('bands'); return [bands.className, "
        "bands.children.length, document.getElementById('mesh-note').textContent]")
    # A model with random weights (what GET /v1/models says of the embedded default) is flagged.
    banner = browser.execute_script(
        "const ui = window.vaeserveUi; ui.showModel({...ui.model, random_weights: true}); "
        "const banner = document.getElementById('banner'); return [banner.checkVisibility(), banner.textContent]")
    # The first request of this size compiled its programs: the page said so once the latents were sent.
    assert ui.pop("phases") == ["sending", "compiling", "answering"], ui
    said = ui.pop("said")
    assert said[1].startswith("compiling this size (first request)") and "decoding" in said[2], said
    assert banner[0] is True and "has random weights: it decodes noise, not video" in banner[1]
    assert ui == {"status": 200, "errors": [], "frames": 41, "download": {"name": "video.mp4", "bytes": ui["download"]["bytes"]}}
    assert link[0] is True and link[1].startswith("blob:") and link[2] == "video.mp4" and ui["download"]["bytes"] > 1000
    # The whole video arrived: 41 frames at 16 fps (no B-frames: the timeline starts at 0).
    assert duration == pytest.approx(41 / 16, abs=0.01)
    # No phantom canvas; the 32-pixel video scaled to the column.
    assert shown["canvas"] == "none" and shown["column"] * 0.8 <= shown["video"] <= shown["column"]
    assert one_device[0].startswith("dp = 1 × tp = 1 on 1 device") and one_device[1] == ["device 0: the whole frame"]
    assert "One device decodes" in one_device[2]
    assert eight[:2] == ["bands by-width", 8] and "split by width into 8 bands of 20 latent columns" in eight[2]
    assert "null" not in text and sideways == [], (text, sideways)

    # A 5-frame clip of the size now compiled: straight to decoding; the player's clock reads 0.31 s.
    browser.find_element(By.ID, "file").send_keys(str(tmp_path / "short.pt"))
    wait_for(browser, "return window.vaeserveUi.latents.shape[2] === 2")
    browser.find_element(By.ID, "decode").click()
    wait_for(browser, "return window.vaeserveUi.responseEnded && document.getElementById('video').ended")
    short = browser.execute_script("const ui = window.vaeserveUi; return [ui.phases, ui.framesReceived, "
                                   "document.getElementById('clock').textContent, document.getElementById('video').controls]")
    assert short == [["sending", "decoding", "answering"], 5, "0.31 s of 0.31 s · frame 5 of 5 at 16 fps", False]
    logs = browser.get_log("browser")
    assert [entry for entry in logs if entry["level"] == "SEVERE"] == []
    assert _foreign_resources(browser, page_server.url) == []
    assert assets[0].startswith("text/javascript") and assets[1].startswith("text/css")


@needs_browser
def test_the_page_shows_an_image_models_pngs_and_says_when_it_compiles(image_server, browser, tmp_path):
    from PIL import Image
    from safetensors.numpy import save_file
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    batch = latents((2, 16, 12, 20), seed=31)  # two images of 40x24 (2x spatial)
    np.save(tmp_path / "batch.npy", batch)
    save_file({"latents": batch[:1]}, str(tmp_path / "one.safetensors"))
    HeldRunner.release.clear()
    browser.get_log("browser")  # what earlier pages logged
    browser.get(image_server.url + "/ui")
    wait_for(browser, "return window.vaeserveUi.model")
    banner = browser.find_element(By.ID, "banner")
    assert banner.is_displayed() and "it decodes noise, not images" in banner.text, banner.text
    assert [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "output")).options] == ["png"]
    assert not browser.find_element(By.ID, "fps").is_displayed()
    model = browser.find_element(By.ID, "model").text
    assert "(B, C, H, W), 16 channels" in model and "2x spatial; images, no time axis" in model, model

    # A batch, on its first request: compiling, then (the program listed, the decode held) decoding, its clock running.
    _decode_in_page(browser, tmp_path / "batch.npy")
    wait_for(browser, "return window.vaeserveUi.phase === 'decoding'")
    progress = browser.execute_script("const bar = document.getElementById('progress'); return [bar.hidden, "
                                      "bar.hasAttribute('value'), document.getElementById('frames').textContent]")
    ticking = wait_for(browser, "const text = document.getElementById('status').textContent; "
                                "return /^decoding: [1-9]\\d* s/.test(text) && text")
    assert browser.execute_script("return window.vaeserveUi.responseEnded") is False
    HeldRunner.release.set()
    pngs = _pngs_shown(browser)
    ui = browser.execute_script("const ui = window.vaeserveUi; return [ui.status, ui.phases, ui.said, ui.images]")
    text, sideways = _page_text(browser), _sideways(browser)
    assert progress == [False, False, "2 images, answered whole once decoded"]
    assert "(this size compiled in" in ticking, ticking
    assert ui[:2] == [200, ["sending", "compiling", "decoding", "answering"]], ui
    assert ui[2][1].startswith("compiling this size (first request)"), ui[2]
    assert [image["name"] for image in ui[3]] == ["image-1.png", "image-2.png"]
    # The page's PNGs are the server's decode, pixel for pixel (made here from its raw frames).
    decoded = np.load(io.BytesIO(_decode(image_server.url, batch, "npy")))
    assert decoded.shape == (2, 24, 40, 3)
    for index, png in enumerate(pngs):
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), decoded[index])
    assert "null" not in text and sideways == [], (text, sideways)

    # The same size again: no compiling; then one image (batch 1: a size of its own) is the server's PNG.
    _decode_in_page(browser, tmp_path / "batch.npy")
    wait_for(browser, "return window.vaeserveUi.responseEnded")
    again = browser.execute_script("return window.vaeserveUi.phases")
    _decode_in_page(browser, tmp_path / "one.safetensors")
    single = _pngs_shown(browser)
    one = browser.execute_script("const ui = window.vaeserveUi; return [ui.phases, ui.images.map(i => i.name), "
                                 "ui.download.name, document.getElementById('download').checkVisibility()]")
    assert again == ["sending", "decoding", "answering"]
    assert one[0][:2] == ["sending", "compiling"] and one[0][-1] == "answering"  # decoding, if seen, between
    assert one[1:] == [["image.png"], "image.png", True]
    assert single == [_decode(image_server.url, batch[:1], "png")]
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []
    assert _foreign_resources(browser, image_server.url) == []


def _decode(url: str, x: np.ndarray, output_type: str) -> bytes:
    """What the server answers a client other than the page for raw latents ``x``."""
    HeldRunner.release.set()
    answer = httpx.post(url + "/v1/decode", content=x.tobytes(), timeout=120, headers={"Content-Type": "application/octet-stream"},
                        params={"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": output_type})
    assert answer.status_code == 200, answer.text
    return answer.content


def _decode_in_page(browser, path) -> None:
    from selenium.webdriver.common.by import By

    browser.execute_script("window.vaeserveUi.latents = null; document.getElementById('file').value = ''")
    browser.find_element(By.ID, "file").send_keys(str(path))
    wait_for(browser, f"const l = window.vaeserveUi.latents; return l && l.name === '{path.name}' && "
                      "!document.getElementById('decode').disabled")
    browser.find_element(By.ID, "decode").click()


def _pngs_shown(browser) -> list[bytes]:
    """The PNG files of the images the page shows, once its answer has ended."""
    wait_for(browser, "return window.vaeserveUi.responseEnded")
    encoded = browser.execute_async_script(
        "const done = arguments[0]; const shown = [...document.querySelectorAll('#images img')];"
        "Promise.all(shown.map(img => img.decode())).then(() => Promise.all(window.vaeserveUi.pngs.map(async png => {"
        "const bytes = new Uint8Array(await png.arrayBuffer()); let text = '';"
        "for (const b of bytes) text += String.fromCharCode(b); return btoa(text); })))"
        ".then(pngs => done({shown: shown.length, pngs}), error => done({error: String(error)}))")
    assert "error" not in encoded and encoded["shown"] == len(encoded["pngs"]), encoded
    return [base64.b64decode(item) for item in encoded["pngs"]]


def _page_text(browser) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.TAG_NAME, "body").text


def _sideways(browser) -> list[str]:
    """The page and the elements on it that scroll sideways (their content wider than their box)."""
    return browser.execute_script(
        "return [document.scrollingElement, ...document.querySelectorAll('*')].filter(e => e.scrollWidth > e.clientWidth "
        "&& (e === document.scrollingElement || ['auto', 'scroll'].includes(getComputedStyle(e).overflowX)))"
        ".map(e => `${e.tagName}#${e.id}: ${e.scrollWidth} > ${e.clientWidth}`)")


@needs_browser
def test_the_page_offers_the_models_of_a_server_of_several(browser):
    """A server of a video and an image model: the page offers both (GET /v1/models' ids) and shows
    the one chosen, with that model's outputs."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    served = {"wan": models.init_vae(models.WanVAEConfig(base_dim=8, num_res_blocks=1), seed=0),
              "flux1": models.init_vae(FLUX1_TINY, seed=0)}
    with thread_server(served) as server:
        browser.get(server.url + "/ui")
        wait_for(browser, "return window.vaeserveUi.model")
        choice = Select(browser.find_element(By.ID, "model-choice"))
        assert browser.find_element(By.ID, "model-label").is_displayed()
        assert [option.get_attribute("value") for option in choice.options] == ["wan", "flux1"]
        assert browser.execute_script("return window.vaeserveUi.model.id") == "wan"
        choice.select_by_value("flux1")
        wait_for(browser, "return window.vaeserveUi.model.id === 'flux1'")
        assert [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "output")).options] == ["png"]
        assert "flux1" in browser.find_element(By.ID, "model").text
        assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []


@needs_browser
@pytest.mark.parametrize("path,rendered", [("/docs", ".opblock"), ("/redoc", "[data-section-id]")])
def test_the_api_docs_render_offline_under_their_policy(page_server, browser, path, rendered):
    browser.get_log("browser")  # what earlier pages logged
    browser.get(page_server.url + path)
    # Every operation of the OpenAPI document is on the page (from /openapi.json, read here).
    operations = sum(len(methods) for methods in httpx.get(page_server.url + "/openapi.json").json()["paths"].values())
    wait_for(browser, f"return document.querySelectorAll('{rendered}').length >= {operations}")
    assert _foreign_resources(browser, page_server.url) == []
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []


def _foreign_resources(browser, origin: str) -> list[str]:
    """What the page loaded from anywhere but the service (blob: and data: URLs aside)."""
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return [url for url in loaded if not url.startswith((origin + "/", "blob:", "data:"))]
