"""The UI in a real browser: headless Debian chromium driven by Playwright (executable_path; never
`playwright install`) opens the page, starts the default preset, sees the reward curve get a point,
presses Stop, and saves a screenshot in the test's tmp dir (and at $TINYRL_UI_SCREENSHOT if set,
which is how docs/ui.png is made). A second test reads the memory planner's verdict on the launch
form as a user sees it, for the default on this machine and for a GPU preset as the card changes
(its screenshot goes to $TINYRL_UI_PLAN_SCREENSHOT if set). Skips, saying why, when chromium is not
installed (scripts/install_browser.sh installs it)."""

import json
import os
import re
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


VERDICT = re.compile(r"verdict: (FITS|DOES NOT FIT): [0-9.]+ (MiB|GiB) of [0-9.]+ GiB")


def _choose(page, elem_id: str, option: str) -> None:
    """Pick `option` in a gradio dropdown the way a user does: open it, click the entry."""
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


def _verdict(page, *words: str) -> str:
    """The memory panel's text once it holds a verdict with every one of `words` and has stopped changing
    (the same for a second, and no event of the launch form still running)."""
    panel, seen = page.locator("#memory"), []
    busy = page.locator("#memory, #memory-table, #command, #validation").locator(
        '[data-testid="status-tracker"]:not(.hide)')

    def settled():
        seen.append(panel.inner_text())
        ok = VERDICT.search(seen[-1]) and all(w in seen[-1] for w in words) and busy.count() == 0
        return seen[-1] if ok and seen[-3:] == [seen[-1]] * 3 else None

    return wait_for(settled, f"a memory verdict with {words}", timeout=60, every=0.5)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (run scripts/install_browser.sh)")
def test_browser_shows_the_memory_verdict_and_it_follows_the_card(tmp_path):
    server = UIServer(tmp_path / "runs", tmp_path / "ui.log")
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(server.url)
            card = page.locator("#card input")
            # the default preset, planned on this machine: its CUDA card, else the RAM (tens of MiB of it)
            here = card.input_value()
            assert here.startswith("detected: ")
            text = _verdict(page, "budget  this machine's")
            if "CPU (RAM)" in here:
                assert "this machine's RAM" in text and VERDICT.search(text).groups() == ("FITS", "MiB")
            assert "largest that fit" in text

            _choose(page, "preset", "qwen2.5-7b_grpo_math_gpu")
            page.locator("#preset-header").get_by_text("qwen2.5-7b_grpo_math_gpu").wait_for(timeout=30_000)
            wait_for(lambda: "7B" in page.locator("#f-model textarea, #f-model input").first.input_value(), "the 7B preset's fields", 30)
            _choose(page, "card", "4090, 23.99 GiB")
            small = _verdict(page, "--gpu 4090")
            assert VERDICT.search(small).groups() == ("DOES NOT FIT", "GiB") and "23.99 GiB" in small
            _choose(page, "card", "H100, 79.65 GiB")
            big = _verdict(page, "--gpu H100")
            assert VERDICT.search(big).groups() == ("FITS", "GiB") and big != small
            page.locator("#memory-table-box").get_by_text("memory plan: every component").click()
            page.locator("#memory-table").get_by_text("total at peak").wait_for(timeout=30_000)

            _choose(page, "profile", "24gb")  # a profile names its card (24gb: L4) and the plan follows
            assert wait_for(lambda: card.input_value().startswith("L4"), "the card to follow the profile", 30)
            _verdict(page, "--gpu L4")

            _choose(page, "card", "4090, 23.99 GiB")
            page.locator("#preset-header").click()  # leave the dropdown, as a user moves on
            _verdict(page, "--gpu 4090")
            shot = tmp_path / "ui_plan.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get("TINYRL_UI_PLAN_SCREENSHOT"):
                shutil.copy(shot, os.environ["TINYRL_UI_PLAN_SCREENSHOT"])
            browser.close()
    finally:
        server.close()
