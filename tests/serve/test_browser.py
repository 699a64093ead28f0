"""The page in a real browser: Debian's headless Chromium, driven by Playwright (no browser
download: it runs the system's `chromium`). Submits prompts for the tiny models, watches the
progress bar and the streamed chunks, plays the mp4, and takes a screenshot (docs/serve.png, the
README's, is rewritten only with VIDAX_SCREENSHOT=1, so a test run leaves the tree clean)."""

import os
import shutil
from pathlib import Path

import pytest
from tests.serve.conftest import CAUSAL, TINY

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "serve.png"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium)")


@pytest.fixture(scope="module")
def page():
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable,
            headless=True,
            args=["--autoplay-policy=no-user-gesture-required"],
        )
        page = browser.new_page(viewport={"width": 1180, "height": 700})
        yield page
        browser.close()


def _generate(page, settings: dict, prompt: str) -> dict:
    page.select_option("#model", settings["model"])
    page.fill("#prompt", prompt)
    for field in ("frames", "height", "width", "steps"):
        if field in settings:
            page.fill(f"#{field}", str(settings[field]))
    page.evaluate("window.vidax.progress = []; window.vidax.chunks = 0; window.vidax.done = null")
    page.click("#submit")
    page.wait_for_function("window.vidax.done !== null", timeout=120_000)
    assert page.inner_text("#error") == ""
    return page.evaluate("window.vidax.done")


def _played_seconds(page) -> float:
    """The player's duration once it has played past its start (it loops)."""
    page.wait_for_function(
        "(() => { const v = document.querySelector('#player');"
        " return v.readyState >= 2 && !v.paused && v.currentTime > 0; })()",
        timeout=30_000,
    )
    return page.evaluate("document.querySelector('#player').duration")


def test_the_page_makes_plays_and_streams_videos(page, server, tmp_path):
    page.goto(server.url)
    page.wait_for_selector("#model option[value='tiny-causal']", state="attached")
    assert page.input_value("#model") == "tiny"
    fps = page.evaluate("models.tiny.fps")

    # A non-causal model: the bar moves with the denoising steps, then the mp4 plays.
    video = _generate(page, {**TINY, "steps": 4}, "a red circle bouncing")
    progress = page.evaluate("window.vidax.progress")
    assert any(0 < p < 1 for p in progress), progress  # seen moving, not only 0 and 1
    assert progress[-1] == 1 and page.eval_on_selector("#progress", "e => e.value") == 1
    assert video["settings"]["frames"] == 9
    assert _played_seconds(page) == pytest.approx(9 / fps, abs=0.5 / fps)

    # The causal model: its chunks reach the page while the rest is made.
    video = _generate(page, CAUSAL, "a green square moving right")
    assert page.evaluate("window.vidax.chunks") == 2
    assert video["timings"]["first_chunk_seconds"] < video["timings"]["total_seconds"]
    assert _played_seconds(page) == pytest.approx(21 / fps, abs=0.5 / fps)

    # Bad input: the command line's one-line message under the form.
    page.select_option("#model", "tiny")
    page.fill("#frames", "9")
    page.fill("#height", "30")
    page.fill("#width", "32")
    page.click("#submit")
    page.wait_for_function("document.querySelector('#error').textContent !== ''")
    assert page.inner_text("#error").startswith("422: height and width must be positive multiples")

    rows = page.locator("#history tr")
    assert rows.count() >= 2
    assert page.locator("#history a[download]").count() >= 2
    # The form as it was for the causal video on screen.
    page.select_option("#model", "tiny-causal")
    page.fill("#prompt", "a green square moving right")
    page.fill("#frames", "21")
    page.evaluate("document.querySelector('#error').textContent = ''")
    screenshot = (
        DOCS_SCREENSHOT if os.environ.get("VIDAX_SCREENSHOT") == "1" else tmp_path / "s.png"
    )
    page.screenshot(path=str(screenshot))
    assert screenshot.stat().st_size > 10_000  # a rendered page, not an empty image
