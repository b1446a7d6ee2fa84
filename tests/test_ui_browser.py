"""The UI in a real browser: headless Debian chromium driven by Playwright (executable_path; never
`playwright install`) opens the page, starts the default preset, sees the reward curve get a point,
presses Stop, and saves a screenshot in the test's tmp dir (and at $TINYRL_UI_SCREENSHOT if set,
which is how docs/ui.png is made). Skips, saying why, when chromium is not installed
(scripts/install_browser.sh installs it)."""

import json
import re
import os
import shutil

import pytest

pytest.importorskip("gradio", reason="the UI needs the ui extra: pip install -e '.[ui]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: pip install -e '.[dev]'")

from ui_helpers import QUICK, UIServer, kill_runs, wait_for  # noqa: E402

from tinyrl.runs import read_jsonl  # noqa: E402

CHROMIUM = shutil.which("chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _reward_points(page) -> int:
    """Points in the reward plot as the page draws them: the marks vega put in its scenegraph."""
    return page.evaluate("""() => {
        const el = document.querySelector('#plot-reward');
        if (!el) return -1;
        const svgMarks = el.querySelectorAll('svg .mark-line path, svg .mark-symbol path');
        const canvas = el.querySelector('canvas');
        return svgMarks.length + (canvas && canvas.width > 0 ? 1 : 0);
    }""")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (run scripts/install_browser.sh)")
def test_browser_starts_a_run_sees_a_curve_and_stops_it(tmp_path):
    runs = tmp_path / "runs"
    server = UIServer(runs, tmp_path / "ui.log")
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(server.url)
            page.locator("#f-steps input").fill("400")
            page.locator("#run-name input, #run-name textarea").first.fill("b1")
            page.locator("#overrides textarea").fill(QUICK)
            page.locator("#validation").get_by_text("valid:").wait_for(timeout=60_000)
            page.locator("#start-btn").click()
            # Start switches to the Runs tab (the Launch tab's message is then hidden, but there)
            page.locator("#start-msg").get_by_text("started").wait_for(state="attached", timeout=60_000)

            wait_for(lambda: len(read_jsonl(runs / "b1" / "metrics.jsonl")) >= 2, "two metrics rows", timeout=400)
            page.locator("#run-status").get_by_text(re.compile(r"running, step [1-9]")).wait_for(timeout=60_000)
            wait_for(lambda: _reward_points(page) > 0, "a drawn point in the reward plot", timeout=60)
            page.wait_for_timeout(3000)  # one more timer tick: the screenshot shows settled plots
            shot = tmp_path / "ui.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get("TINYRL_UI_SCREENSHOT"):
                shutil.copy(shot, os.environ["TINYRL_UI_SCREENSHOT"])

            page.locator("#stop-btn").click()
            page.locator("#action-msg").get_by_text("sent SIGTERM").wait_for(timeout=60_000)
            wait_for(lambda: (s := runs / "b1" / "summary.json").exists() and json.loads(s.read_text()),
                     "the stopped run's summary", timeout=300)
            assert json.loads((runs / "b1" / "summary.json").read_text())["interrupted"] is True
            assert list((runs / "b1" / "checkpoints").glob("step-*"))
            page.locator("#run-status").get_by_text("interrupted").wait_for(timeout=60_000)
            browser.close()
    finally:
        server.close()
        kill_runs(runs)
