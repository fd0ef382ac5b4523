"""The page of ``GET /ui`` in a real browser: Debian's Chromium (``apt-get install chromium
chromium-driver``, which ``.ci/run`` installs), driven by Selenium, against a real uvicorn server
with the tiny model. A ``.pt`` file of latents goes in; the fragmented MP4 plays (its
``currentTime`` advancing) while the last decode step is still held back, so before the answer
has ended; the page reports no error and the browser logs none."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator

import pytest

from tests.helpers.service_helpers import HeldRunner, latents, thread_server

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
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


def test_the_page_plays_a_fragmented_mp4_before_the_answer_ends(tiny_vae, tmp_path):
    torch = pytest.importorskip("torch")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    x = latents((1, 16, 11, 4, 4), seed=21)  # 41 frames of 32x32: 2.6 s at 16 fps
    torch.save(torch.from_numpy(x), tmp_path / "latents.pt")
    HeldRunner.release.clear()
    with thread_server(tiny_vae, runner_factory=HeldRunner, max_batch=1, max_frames=41) as srv, \
            chromium(tmp_path / "profile") as browser:
        browser.get(srv.url + "/ui")
        browser.find_element(By.ID, "file").send_keys(str(tmp_path / "latents.pt"))
        wait_for(browser, "return !document.getElementById('decode').disabled")
        assert browser.execute_script("return window.vaeserveUi.latents.shape") == [1, 16, 11, 4, 4]
        Select(browser.find_element(By.ID, "output")).select_by_value("mp4-stream")
        browser.find_element(By.ID, "decode").click()
        # Playing while the last step is held: the answer cannot have ended.
        first = wait_for(browser, "return document.getElementById('video').currentTime")
        wait_for(browser, f"return document.getElementById('video').currentTime > {first}")
        assert browser.execute_script("return window.vaeserveUi.responseEnded") is False
        HeldRunner.release.set()
        wait_for(browser, "return window.vaeserveUi.responseEnded")
        ui = browser.execute_script("const ui = window.vaeserveUi; return {status: ui.status, errors: ui.errors}")
        duration = browser.execute_script("return document.getElementById('video').duration")
        logs = browser.get_log("browser")
    assert ui == {"status": 200, "errors": []}
    # The whole video arrived (the media timeline starts at the first frame's composition time,
    # which B-frames put two frames in: MSE does not apply the file's edit list).
    assert 41 / 16 <= duration <= 44 / 16
    assert [entry for entry in logs if entry["level"] == "SEVERE"] == []
