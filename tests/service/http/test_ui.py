"""The pages the service serves, against a real uvicorn server with the tiny model: their security
headers (a strict Content-Security-Policy, no framing, no sniffing) and, in a real browser
(Debian's Chromium, ``apt-get install chromium chromium-driver``, which ``.ci/run`` installs,
driven by Selenium), that they work under them with no error logged — the browser logs every CSP
violation — and load nothing from another origin (air-gapped hosts).

``GET /ui``: a ``.pt`` file of latents goes in; the fragmented MP4 plays (its ``currentTime``
advancing) while the last decode step is still held back, so before the answer has ended, and the
page counts this request's frames as they arrive, then offers the video for download; it says the
model has random weights, scales the video to the page, shows no canvas, and draws the mesh for one
device and for eight; it reports no error. ``GET /docs`` (Swagger UI) and ``GET /redoc`` (Redoc) render the operations
from the package's own copies of their scripts."""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.service_helpers import HeldRunner, latents, thread_server
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
def page_server(tiny_vae):
    with thread_server(tiny_vae, runner_factory=HeldRunner, max_batch=1, max_frames=41) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    with chromium(tmp_path_factory.mktemp("profile")) as browser:
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
    HeldRunner.release.clear()
    assets = [httpx.get(page_server.url + f"/ui/app.{kind}").headers["content-type"] for kind in ("js", "css")]
    browser.get_log("browser")  # what earlier pages logged
    browser.get(page_server.url + "/ui")
    wait_for(browser, "return window.vaeserveUi.model")
    assert not browser.find_element(By.ID, "banner").is_displayed()  # a checkpoint's weights
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
                                "frames: ui.framesReceived, download: ui.download}")
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
    # Eight devices (drawn from what GET /v1/models says of a mesh): 720p latents, split by width.
    eight = browser.execute_script(
        "window.vaeserveUi.drawMesh({dp: 1, tp: 8, devices: [...Array(8).keys()].map(i => `TPU_${i}`)}, "
        "[1, 16, 21, 90, 160]); const bands = document.getElementById('bands'); return [bands.className, "
        "bands.children.length, document.getElementById('mesh-note').textContent]")
    # A model with random weights (what GET /v1/models says of the embedded default) is flagged.
    banner = browser.execute_script(
        "const ui = window.vaeserveUi; ui.showModel({...ui.model, random_weights: true}); "
        "const banner = document.getElementById('banner'); return [banner.checkVisibility(), banner.textContent]")
    logs = browser.get_log("browser")
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
    assert [entry for entry in logs if entry["level"] == "SEVERE"] == []
    assert _foreign_resources(browser, page_server.url) == []
    assert assets[0].startswith("text/javascript") and assets[1].startswith("text/css")


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
