"""The UI in a real browser: headless Debian chromium driven by Playwright (executable_path; never
`playwright install`) looks at the page as a user does. The first test starts two runs of the
default preset: a short one that runs to its end and a long one (its completions cut at 3 tokens,
so the monitor warns) that it stops. While the long one runs, every curve panel must hold drawn
lines with as many points as steps, numeric axes (whole steps on x), and every series in its legend,
the warning marked; the Runs tab follows the processes (Stop greys out when the run ends, an
evaluation's result appears without a reload, the log shows its end); the Compare tab draws both runs.
It saves the Runs and Compare tabs of the finished run (at $TINYRL_UI_SCREENSHOT and
$TINYRL_UI_COMPARE_SCREENSHOT if set: docs/ui.png is made so). A second test reads the memory
planner's verdict on the launch form as a user sees it, for the default on this machine and for a
GPU preset as the card changes (its screenshot goes to $TINYRL_UI_PLAN_SCREENSHOT if set), and types
an unknown preset. Skips, saying why, when chromium is not installed (scripts/install_browser.sh
installs it)."""

import json
import os
import re
import shutil

import pytest

pytest.importorskip("gradio", reason="the UI needs the ui extra: pip install -e '.[ui]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: pip install -e '.[dev]'")

from ui_helpers import QUICK, UIServer, choose, kill_runs, launch, screenshot, wait_for  # noqa: E402

from tinyrl.apps import charts  # noqa: E402
from tinyrl.runs import read_jsonl  # noqa: E402

CHROMIUM = shutil.which("chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]

# Each visible panel as drawn: the vega SVG's line paths (stroke, points, x of each point), its axes'
# tick labels, and the HTML legend under it (series, colour, kind, whether it is laid out visibly).
PANELS_JS = """(prefix) => [...document.querySelectorAll(`[id^="${prefix}box-"]`)]
  .filter(box => box.offsetParent !== null).map(box => {
    const svg = box.querySelector('svg.marks');
    const lines = svg ? [...svg.querySelectorAll('.mark-line path')].map(p => {
      const pts = [...(p.getAttribute('d') || '').matchAll(/[ML]\\s*(-?[0-9.e]+)[ ,](-?[0-9.e]+)/g)];
      return {stroke: p.getAttribute('stroke'), opacity: p.getAttribute('stroke-opacity'),
              points: pts.length, xs: pts.map(m => Math.round(parseFloat(m[1])))};
    }) : [];
    const axis = (which) => [...(svg ? svg.querySelectorAll('g.role-axis') : [])]
      .filter(a => (a.getAttribute('aria-label') || '').startsWith(which))
      .flatMap(a => [...a.querySelectorAll('.role-axis-label text')].map(t => t.textContent));
    const boxRect = box.getBoundingClientRect();
    const legend = [...box.querySelectorAll('.legend .entry')].map(e => {
      const r = e.getBoundingClientRect();
      return {series: e.dataset.series, color: e.dataset.color, kind: e.dataset.kind,
              shown: r.width > 0 && r.left >= boxRect.left - 1 && r.right <= boxRect.right + 1};
    });
    const metric = box.querySelector('.legend .metric');
    return {id: box.id, lines, x: axis('X-axis'), y: axis('Y-axis'), legend,
            metric: metric ? metric.textContent.replace(/:$/, '') : null};
  })"""


def _panels(page, prefix: str) -> list[dict]:
    return page.evaluate(PANELS_JS, prefix)


def _expected_series(rows: list[dict], title: str) -> set[str]:
    """The series a panel must name for a run's metric rows: each metric measured, noisy ones also smoothed."""
    keys = charts.shown_keys(title, rows)
    measured = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)]
    return {k for k in measured} | {k + charts.SMOOTHED for k in measured if k in charts.NOISY}


def _drawn(panel: dict, steps: int, expected: set[str]) -> str | None:
    """Why `panel` does not yet show what a user must see (None when it does)."""
    if not panel["lines"]:
        return "no line drawn"
    if any(ln["stroke"] in (None, "none", "transparent") or ln["opacity"] == "0" for ln in panel["lines"]):
        return f"a line without a stroke colour: {panel['lines']}"
    legend = {e["series"]: e for e in panel["legend"]}
    if not expected <= set(legend):
        return f"legend {sorted(legend)} lacks {sorted(expected - set(legend))}"
    if not all(e["shown"] for e in panel["legend"]):
        return f"a legend entry is cut off: {panel['legend']}"
    strokes = {ln["stroke"] for ln in panel["lines"]}
    if not {e["color"] for e in panel["legend"]} <= strokes:
        return f"a legend colour that no line is drawn in: {panel['legend']} vs {strokes}"
    for name in expected:
        pts = max((ln["points"] for ln in panel["lines"] if ln["stroke"] == legend[name]["color"]), default=0)
        if pts < steps:
            return f"{name}: {pts} points drawn for {steps} steps"
    try:
        xs, ys = [float(t) for t in panel["x"]], [float(t.replace("\u2212", "-")) for t in panel["y"]]
    except ValueError:
        return f"an axis label that is not a number: x {panel['x']}, y {panel['y']}"
    if not xs or not ys or any(x != int(x) for x in xs):
        return f"the step axis is not whole steps: {panel['x']}"
    return None


def _wait_drawn(page, prefix: str, check, what: str, timeout: float = 90) -> list[dict]:
    """The panels once each visible one passes `check` (it returns None, or what is wrong), every core panel shown."""
    last = {}

    def ok():
        panels = _panels(page, prefix)
        last.clear()
        last.update({p["id"]: why for p in panels if (why := check(p))})
        last["panels shown"] = len(panels)
        return panels if len(panels) == len(charts.PANELS) - 1 and len(last) == 1 else None

    try:
        return wait_for(ok, what, timeout)
    except AssertionError as e:
        page.screenshot(path="/tmp/tinyrl_ui_failed.png", full_page=True)
        raise AssertionError(f"{e}; what is wrong: {last} (page: /tmp/tinyrl_ui_failed.png)") from None


def _title(box_id: str, prefix: str) -> str:
    return next(t for t in charts.PANELS if box_id == f"{prefix}box-" + "".join(
        c if c.isalnum() else "-" for c in t.lower()).strip("-"))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (run scripts/install_browser.sh)")
def test_browser_watches_live_curves_and_the_runs_state(tmp_path):
    runs = tmp_path / "runs"
    server = UIServer(runs, tmp_path / "ui.log")
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(server.url)
            page.get_by_text("Runs in runs.").wait_for(timeout=60_000)  # as typed: no machine path
            # a short run to its end (held-out accuracy before/after), then a long one that the monitor warns about
            launch(page, "b1", 12, "log.progress=false")
            launch(page, "b2", 400, QUICK + " rollout.max_new_tokens=3")
            page.locator("#run-status").get_by_text(re.compile(r"b2: running, step ([3-9]|\d\d+)/")).wait_for(timeout=400_000)

            # live curves: every panel drawn, as many points as steps, numeric axes, each series named
            rows = read_jsonl(runs / "b2" / "metrics.jsonl")
            steps = len(rows)
            assert steps >= 3 and {a["name"] for a in read_jsonl(runs / "b2" / "alarms.jsonl")} == {"truncation"}

            panels = _wait_drawn(page, "plot-", lambda p: _drawn(p, steps, _expected_series(rows, _title(p["id"], "plot-"))),
                                 "b2's curves drawn")
            for panel in panels:  # the warning at step 2: a vertical mark on the reward and length panels
                marks = [e for e in panel["legend"] if e["kind"] == "warning"]
                if panel["id"] in ("plot-box-reward", "plot-box-completion-length"):
                    assert [e["series"] for e in marks] == ["warning: truncation (step 2)"], panel["legend"]
                    mark = [ln for ln in panel["lines"] if ln["stroke"] == marks[0]["color"]]
                    assert mark and mark[0]["points"] == 2 and len(set(mark[0]["xs"])) == 1
                else:
                    assert not marks
            assert page.locator("#stop-btn").is_enabled() and page.locator("#resume-btn").is_disabled()

            page.locator("#stop-btn").click()
            page.locator("#action-msg").get_by_text("sent SIGTERM").wait_for(timeout=60_000)
            wait_for(lambda: (s := runs / "b2" / "summary.json").exists() and json.loads(s.read_text()),
                     "the stopped run's summary", timeout=300)
            assert json.loads((runs / "b2" / "summary.json").read_text())["interrupted"] is True
            page.locator("#run-status").get_by_text("b2: interrupted").wait_for(timeout=60_000)
            # the run ended: Stop is grey, Resume works (a checkpoint, nothing running), the old message went
            wait_for(lambda: page.locator("#stop-btn").is_disabled() and page.locator("#resume-btn").is_enabled()
                     and "SIGTERM" not in page.locator("#action-msg").inner_text(), "the controls of a stopped run", 30)

            choose(page, "run-select", "b1")
            page.locator("#run-status").get_by_text("b1: finished, step 12/12").wait_for(timeout=400_000)
            wait_for(lambda: page.locator("#stop-btn").is_disabled() and page.locator("#eval-btn").is_enabled(),
                     "Stop grey and Evaluate on for a finished run", 30)
            page.locator("#accuracy").get_by_text("held-out accuracy (greedy pass@1): before").wait_for()
            if not read_jsonl(runs / "b1" / "alarms.jsonl"):  # an empty alarms table says so in words
                page.locator("#alarms-words").get_by_text("no alarms: the monitor checked 12 steps").wait_for()
            page.locator("#eval-btn").click()
            page.locator("#action-msg").get_by_text("evaluating b1").wait_for(timeout=60_000)
            # the evaluation's result appears when its process exits: no reload
            page.locator("#eval-result").get_by_text(
                re.compile(r"held-out accuracy \(greedy pass@1\): [0-9.]+% on 200 prompts")).wait_for(timeout=300_000)
            wait_for(lambda: "evaluating" not in page.locator("#action-msg").inner_text(), "the message to go", 30)
            table = page.locator("#runs-table").inner_text()
            assert re.search(r"b1\s+finished\s+12/12\s+[0-9.]+\s+[0-9.]+ \(step \d+\)\s+[0-9.]+\s+[0-9.]+% → [0-9.]+%",
                             table), table
            wait_for(lambda: page.evaluate("""() => { const t = document.querySelector('#log-tail textarea');
                return t.scrollTop + t.clientHeight >= t.scrollHeight - 30; }"""), "the log to show its end", 30)
            assert "run folder: runs/b1" in page.locator("#log-tail textarea").input_value()
            rows = read_jsonl(runs / "b1" / "metrics.jsonl")
            _wait_drawn(page, "plot-", lambda p: _drawn(p, 12, _expected_series(rows, _title(p["id"], "plot-"))),
                        "b1's curves drawn")
            page.wait_for_timeout(2500)  # one more timer tick: the screenshot shows settled plots
            screenshot(page, tmp_path, "ui_runs.png", "TINYRL_UI_SCREENSHOT")

            page.get_by_role("tab", name="Compare").click()
            choose(page, "compare-select", "b1")
            choose(page, "compare-select", "b2")
            page.locator("#compare-plots").click(position={"x": 2, "y": 2})  # leave the dropdown
            both = {**{k: read_jsonl(runs / k / "metrics.jsonl") for k in ("b1", "b2")}}

            def compared(panel):
                key = panel["metric"]
                if key not in charts.PANELS[_title(panel["id"], "cmp-")]:
                    return f"the metric named above the legend, {key!r}, is not the panel's"
                names = {n + (charts.SMOOTHED if key in charts.NOISY else "") for n in both} | set(both)
                steps = min(len([r for r in rows if isinstance(r.get(key), (int, float))]) for rows in both.values())
                return _drawn(panel, steps, names)

            _wait_drawn(page, "cmp-", compared, "both runs drawn on every Compare panel")
            page.wait_for_timeout(2500)
            screenshot(page, tmp_path, "ui_compare.png", "TINYRL_UI_COMPARE_SCREENSHOT")
            browser.close()
    finally:
        server.close()
        kill_runs(runs)


VERDICT = re.compile(r"verdict: (FITS|DOES NOT FIT): [0-9.]+ (MiB|GiB) of [0-9.]+ GiB")


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

    # a wait, not a speed check: on 2 loaded cores the form's first plan of a GPU preset took over 60 s
    return wait_for(settled, f"a memory verdict with {words}", timeout=180, every=0.5,
                    shown=lambda: f"card {page.locator('#card input').input_value()!r}, {busy.count()} checks running, "
                                  f"the panel: {seen[-1] if seen else None!r}")


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

            choose(page, "preset", "qwen2.5-7b_grpo_math_gpu")
            page.locator("#preset-header").get_by_text("qwen2.5-7b_grpo_math_gpu").wait_for(timeout=30_000)
            wait_for(lambda: "7B" in page.locator("#f-model textarea, #f-model input").first.input_value(), "the 7B preset's fields", 30)
            choose(page, "card", "4090, 23.99 GiB")
            small = _verdict(page, "--gpu 4090")
            assert VERDICT.search(small).groups() == ("DOES NOT FIT", "GiB") and "23.99 GiB" in small
            choose(page, "card", "H100, 79.65 GiB")
            big = _verdict(page, "--gpu H100")
            assert VERDICT.search(big).groups() == ("FITS", "GiB") and big != small
            page.locator("#memory-table-box").get_by_text("memory plan: every component").click()
            page.locator("#memory-table").get_by_text("total at peak").wait_for(timeout=30_000)

            choose(page, "profile", "24gb")  # a profile names its card (24gb: L4) and the plan follows
            assert wait_for(lambda: card.input_value().startswith("L4"), "the card to follow the profile", 30)
            _verdict(page, "--gpu L4")

            choose(page, "card", "4090, 23.99 GiB")
            page.locator("#preset-header").click()  # leave the dropdown, as a user moves on
            _verdict(page, "--gpu 4090")
            shot = tmp_path / "ui_plan.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get("TINYRL_UI_PLAN_SCREENSHOT"):
                shutil.copy(shot, os.environ["TINYRL_UI_PLAN_SCREENSHOT"])

            # a preset name typed that is no preset: an error on the form, not a silent revert to the default
            page.locator("#preset input").fill("no_such_preset")
            page.locator("#preset input").press("Enter")
            page.locator("#validation").get_by_text("preset 'no_such_preset': not a shipped preset").wait_for(
                timeout=30_000)
            page.locator("#preset-header").get_by_text("not a shipped preset").wait_for(timeout=30_000)
            assert page.locator("#preset input").input_value() == "no_such_preset"
            browser.close()
    finally:
        server.close()
