"""The UI's parts without a server: path safety, exposure rules, the launch form's validation
(the same words as the CLI), run-folder reading, the curves' frames (typed, smoothed, alarms marked),
the status logic (controls, messages, evaluation), the runs table's figures, the handlers on a folder
with live processes, and the message when gradio is missing."""

import doctest
import json
import os
import re
import subprocess
import sys
import time

import pytest

from tinyrl.apps import adapters, charts, data_form, evals, exports, forms, paths, procs, runs_table, runs_view, server
from tinyrl.apps import status as st
from tinyrl.config import ConfigError
from tinyrl.plan_report import run as tinyrl_plan
from tinyrl.planner import GPUS


@pytest.mark.parametrize("module", [paths, forms, runs_view, runs_table, server, charts, st, adapters, evals, exports,
                                    data_form], ids=lambda m: m.__name__)
def test_doctests_of_the_ui_modules(module):
    # apps/ is mapped to tinyrl.apps, so pytest's own --doctest-modules (testpaths) does not see it
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert attempted > 0 and failed == 0


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize("name", ["../x", "..", "a/b", "/etc", ".hidden", "", "x/../../y", "a\\b", "ok\n"])
def test_names_from_the_page_that_leave_the_runs_dir_are_refused(tmp_path, name):
    with pytest.raises(paths.UnsafePathError, match="not a run name"):
        paths.resolve_run(tmp_path, name)


def test_a_symlink_out_of_the_runs_dir_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "sneaky").symlink_to(outside)
    with pytest.raises(paths.UnsafePathError, match="outside the runs directory"):
        paths.resolve_run(runs, "sneaky")
    assert paths.resolve_run(runs, "fine") == (runs / "fine").resolve()


# --------------------------------------------------------------------------- exposure


@pytest.mark.parametrize("host,share", [("0.0.0.0", False), ("192.168.1.5", False), ("example.org", False),
                                        ("127.0.0.1", True)])
def test_exposed_without_auth_is_refused(host, share):
    with pytest.raises(server.ExposureError, match="without a password"):
        server.check_exposure(host, share, None)


def test_auth_is_user_colon_password():
    assert server.check_exposure("0.0.0.0", True, "ann:pw:with:colons") == ("ann", "pw:with:colons")
    assert server.check_exposure("127.0.0.1", False, None) is None
    for bad in ("ann", "ann:", ":pw"):
        with pytest.raises(server.ExposureError, match="USER:PASS"):
            server.check_exposure("127.0.0.1", False, bad)


def test_cli_ui_on_a_public_host_without_auth_exits_2_before_binding(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "ui", "--host", "0.0.0.0", "--runs-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("tinyrl: error: refusing to serve the UI on host '0.0.0.0'")
    assert "--auth USER:PASS" in out.stderr and "Traceback" not in out.stderr


def test_missing_gradio_names_the_extra(tmp_path):
    # gradio is installed here: hide it the way a missing package looks (a None entry in sys.modules)
    code = ("import sys; sys.modules['gradio'] = None; from tinyrl.cli import main; "
            f"sys.exit(main(['ui', '--runs-dir', {str(tmp_path)!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "pip install 'tinyrl-rlvr[ui]'" in out.stderr and "Traceback" not in out.stderr


# --------------------------------------------------------------------------- the launch form


def test_form_fields_become_overrides_only_where_they_differ():
    values = forms.form_values("tiny_grpo_cpu", None)
    assert forms.form_overrides("tiny_grpo_cpu", None, values) == []
    values.update({"train.steps": 3.0, "train.lr": 2e-3, "algo.recipe": "dapo"})
    assert forms.form_overrides("tiny_grpo_cpu", None, values) == ["train.steps=3", "train.lr=0.002",
                                                                    "algo.recipe=dapo"]


def test_a_bad_override_gets_the_clis_own_message():
    with pytest.raises(ConfigError) as e:
        forms.validate("tiny_grpo_cpu", None, {}, "algo.scale=groups")
    cli = subprocess.run([sys.executable, "-m", "tinyrl.cli", "train", "algo.scale=groups"],
                         capture_output=True, text=True, timeout=120)
    assert cli.stderr.strip() == f"tinyrl: error: {e.value}"
    assert "algo.scale" in str(e.value) and "'group'" in str(e.value)


def test_a_bad_form_field_names_the_field():
    with pytest.raises(ConfigError, match="train.prompts_per_step"):
        forms.validate("tiny_grpo_cpu", None, {"train.prompts_per_step": 0}, "")


def test_the_ui_decides_where_runs_go():
    with pytest.raises(ConfigError, match="log.run_dir: set by the UI"):
        forms.validate("tiny_grpo_cpu", None, {}, "log.run_dir=/tmp/elsewhere")


def test_only_shipped_presets_come_from_the_page():
    with pytest.raises(ConfigError, match="not a shipped preset"):
        forms.check_preset("/etc/passwd")


def test_plan_command_is_the_cli_command():
    plan = forms.validate("tiny_grpo_cpu", None, {"train.steps": 5}, "algo.beta=0.04  # a comment")
    assert plan.overrides == ["train.steps=5", "algo.beta=0.04"]
    assert plan.shown() == "tinyrl train tiny_grpo_cpu train.steps=5 algo.beta=0.04"
    assert plan.config.train.steps == 5 and plan.config.algo.beta == 0.04


def test_preset_header_is_its_comment_block():
    header = forms.preset_header("tiny_grpo_cpu")
    assert header.startswith("tiny_grpo_cpu") and "Memory:" in header and "description:" not in header


# --------------------------------------------------------------------------- the memory plan

VERDICT = re.compile(r"verdict: (FITS|DOES NOT FIT): [0-9.]+ (MiB|GiB) of [0-9.]+ GiB")


def test_memory_estimate_of_the_default_is_tinyrl_plan_on_this_machine():
    est = forms.memory_estimate(forms.validate("tiny_grpo_cpu", None, {}, "").config)
    device, _, label = forms.detected()
    assert est.fits is True and VERDICT.search(est.summary).group(1) == "FITS"
    assert est.summary.startswith(f"budget  {label} = ") and "largest that fit" in est.summary
    if device == "cpu":  # the tiny run's peak is tens of MiB of the machine's RAM
        assert label == "this machine's RAM" and VERDICT.search(est.summary).group(2) == "MiB"
    _, printed = tinyrl_plan("tiny_grpo_cpu", [])  # `tinyrl plan tiny_grpo_cpu`: the same card, the same words
    assert est.table == printed and set(est.summary.splitlines()) <= set(printed.splitlines())


def test_memory_estimate_of_a_gpu_preset_follows_the_card():
    cfg = forms.validate("qwen2.5-7b_grpo_math_gpu", None, {}, "").config
    small, big = forms.memory_estimate(cfg, "4090"), forms.memory_estimate(cfg, "H100")
    assert small.fits is False and VERDICT.search(small.summary).groups() == ("DOES NOT FIT", "GiB")
    assert big.fits is True and VERDICT.search(big.summary).groups() == ("FITS", "GiB")
    assert small.summary.startswith("budget  --gpu 4090 = 23.99 GiB") and "--gpu H100" in big.summary
    assert "rollout.num_generations=" in big.summary
    assert big.table == tinyrl_plan("qwen2.5-7b_grpo_math_gpu", [], gpu="H100")[1]
    # a profile sets the processes per run, as `tinyrl plan --profile 8xh100` does (each rank: its prompts)
    cfg8 = forms.validate("qwen2.5-7b_grpo_math_gpu", "8xh100", {}, "").config
    eight = forms.memory_estimate(cfg8, forms.card_for_profile("8xh100"), "8xh100")
    assert eight.table == tinyrl_plan("qwen2.5-7b_grpo_math_gpu", [], profile="8xh100", gpu="H100")[1]


def test_memory_estimate_of_an_unplannable_run_says_why():
    cfg = forms.validate("tiny_grpo_cpu", None, {"model.name": "no-such-org/no-such-model"}, "").config
    est = forms.memory_estimate(cfg, "4090")
    assert est.fits is None and est.table == ""
    assert est.summary.startswith("no memory plan: model.name 'no-such-org/no-such-model': no config.json")
    assert "--gpu 'Z80': must be one of" in forms.memory_estimate(cfg, "Z80").summary


def test_card_choices_are_this_machine_then_the_planners_cards():
    choices = forms.card_choices()
    assert choices[0][1] == forms.DETECTED and choices[0][0].startswith("detected: ")
    assert [v for _, v in choices[1:]] == list(GPUS)
    assert forms.card_for_profile("24gb") == "L4" and forms.card_for_profile("") is None


# --------------------------------------------------------------------------- run folders


def _run(tmp_path, name, metrics=(), summary=None, ckpt=False):
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  steps: 4\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    if ckpt:
        (run / "checkpoints" / "step-000002").mkdir(parents=True)
    return run


def test_status_is_read_from_the_folder(tmp_path):
    _run(tmp_path, "done", summary={"interrupted": False, "error": None})
    _run(tmp_path, "stopped", summary={"interrupted": True, "error": None}, ckpt=True)
    _run(tmp_path, "broke", summary={"interrupted": False, "error": "boom"})
    _run(tmp_path, "killed", ckpt=True)  # no summary: killed -9 after a checkpoint
    _run(tmp_path, "died")  # no summary, nothing to resume
    live = _run(tmp_path, "live", metrics=[{"step": 1, "reward_mean": 0.5}])
    procs.write_pidfile(live / "train.pid", os.getpid(), ["x"], "train")
    got = {n: runs_view.status(tmp_path, n) for n in ("done", "stopped", "broke", "killed", "died", "live")}
    assert got == {"done": "finished", "stopped": "interrupted", "broke": "failed", "killed": "interrupted",
                   "died": "failed", "live": "running"}


def test_a_recycled_pid_is_not_the_run(tmp_path):
    run = _run(tmp_path, "old")
    info = procs.write_pidfile(run / "train.pid", os.getpid(), ["x"], "train")
    assert procs.alive(info)
    assert not procs.alive({**info, "start_ticks": info["start_ticks"] + 1})
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not procs.alive({"pid": child.pid})


def test_latest_samples_have_per_component_rewards(tmp_path):
    run = _run(tmp_path, "s")
    rows = [{"step": 1, "prompt": "1+1=", "completion": "3", "reward": 0.0, "reward/answer": 0.0},
            {"step": 2, "prompt": "2+2=", "completion": "4", "reward": 1.0, "reward/answer": 1.0, "reward/fmt": 1.0}]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    headers, table = runs_view.latest_samples(run)
    assert headers == ["step", "prompt", "completion", "reward", "reward/answer", "reward/fmt"]
    assert table == [[2, "2+2=", "4", 1.0, 1.0, 1.0]]


def test_log_tail_collapses_progress_bar_redraws(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("start\nstep 1/9\rstep 2/9\rstep 3/9\nend\n")
    assert runs_view.log_tail(log) == "start\nstep 3/9\nend"
    assert runs_view.log_tail(log, lines=1) == "end"
    assert runs_view.log_tail(tmp_path / "absent.log") == ""


def test_runs_list_newest_first(tmp_path):
    _run(tmp_path, "first")
    time.sleep(0.02)
    _run(tmp_path, "second")
    (tmp_path / "not-a-run").mkdir()
    assert runs_view.run_names(tmp_path) == ["second", "first"]


def test_runs_list_ordered_by_a_start_time_that_a_resume_does_not_move(tmp_path):
    old = _run(tmp_path, "old")
    (old / "train.log").write_text("=== tinyrl ui: train at 2026-01-02 03:04:05\n$ tinyrl train\n")
    _run(tmp_path, "new")
    t0 = runs_view.started(tmp_path, "old")
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)) == "2026-01-02 03:04:05"
    # a resume rewrites config.yaml and appends its own banner to train.log: the start stays
    (old / "config.yaml").write_text("train:\n  steps: 8\n")
    with open(old / "train.log", "a") as f:
        f.write("=== tinyrl ui: resume at 2026-03-04 05:06:07\n")
    assert runs_view.started(tmp_path, "old") == t0
    assert runs_table.info(tmp_path, "old").started == "2026-01-02 03:04:05"
    assert runs_view.run_names(tmp_path) == ["new", "old"]
    # a run started by `tinyrl train` (no UI log): its first resume dates it at the latest
    cli = _run(tmp_path, "cli")
    (cli / "resumes.jsonl").write_text(json.dumps({"time": "2026-02-03 04:05:06"}) + "\n")
    assert runs_table.info(tmp_path, "cli").started == "2026-02-03 04:05:06"


# --------------------------------------------------------------------------- the curves


ROWS = [{"step": 1, "reward_mean": 0.1, "reward/answer": 0.2, "entropy": None, "step_time": 2.0},
        {"step": 2, "reward_mean": 0.5, "entropy": 1.5, "step_time": 4.0},
        {"step": 3, "reward_mean": 0.3, "reward/answer": 0.6, "step_time": 3.0}]


@pytest.mark.parametrize("points", [[], [{"step": 1, "value": 0.5, "series": "a"}]], ids=["empty", "data"])
def test_frames_are_typed_so_the_plot_reads_numeric_axes(points):
    # the cause of curves that never drew: an untyped empty frame is all-object, so gradio calls `step`
    # nominal and the chart keeps categorical axes after data arrives
    gr = pytest.importorskip("gradio")
    import pandas as pd

    plot = gr.LinePlot(x="step", y="value", color="series")
    assert plot.postprocess(pd.DataFrame([], columns=charts.COLUMNS)).datatypes["step"] == "nominal"
    frame = charts.frame(points)
    assert frame.dtypes.astype(str).tolist() == ["int64", "float64", "str"] and len(frame) == len(points)
    assert plot.postprocess(frame).datatypes == {"step": "quantitative", "value": "quantitative",
                                                 "series": "nominal"}


def test_a_run_panel_has_raw_and_smoothed_series_each_coloured_and_in_the_legend():
    chart = charts.run_chart("reward", ROWS)
    series = {p["series"] for p in chart.points}
    assert series == {"reward_mean", "reward_mean (smoothed)", "reward/answer"}
    assert set(chart.colors) == series and {e.label for e in chart.legend} == series
    raw = [p["value"] for p in chart.points if p["series"] == "reward_mean"]
    smoothed = [p["value"] for p in chart.points if p["series"] == "reward_mean (smoothed)"]
    assert raw == [0.1, 0.5, 0.3] and smoothed == pytest.approx(charts.smooth(raw)) and smoothed[0] == 0.1
    assert chart.colors["reward_mean"] == charts.lighter(chart.colors["reward_mean (smoothed)"])
    assert [p["step"] for p in chart.points if p["series"] == "reward/answer"] == [1, 3]  # a missing value: no point
    assert chart.x_lim == [0, 20] and chart.y_lim is None
    entropy = charts.run_chart("entropy", ROWS)  # null is not measured: left out, never drawn as 0
    assert [(p["step"], p["value"]) for p in entropy.points if p["series"] == "entropy"] == [(2, 1.5)]
    assert entropy.y_lim == [1.35, 1.65]  # one value: a y range around it, not a one-tick axis
    step_time = charts.run_chart("step time (s)", ROWS)  # not a noisy metric: no smoothed twin
    assert {p["series"] for p in step_time.points} == {"step_time"}
    style = chart.style()
    assert style["colors"] == chart.colors and [e["label"] for e in style["legend"]][0] == "reward_mean"
    html = charts.legend_html(style)
    assert html.count('class="entry') == 3 and 'data-series="reward_mean (smoothed)"' in html


def test_alarms_are_vertical_marks_on_the_reward_panel_and_their_metrics_panel():
    alarms = [{"step": 2, "name": "truncation", "severity": "warning"}, {"step": 3, "name": "echo_trap"},
              {"step": 3, "name": "echo_trap"}]  # a duplicate row is one mark
    rows = [{**r, "completion_len": 3.0 + r["step"]} for r in ROWS]
    reward = charts.run_chart("reward", rows, alarms)
    marks = [p for p in reward.points if "@" in p["series"]]
    assert sorted({p["series"] for p in marks}) == ["alarm: echo_trap @ 3", "warning: truncation @ 2"]
    low, high = min(p["value"] for p in reward.points), max(p["value"] for p in reward.points)
    trunc = [p for p in marks if p["series"].startswith("warning")]
    assert [p["step"] for p in trunc] == [2, 2] and {p["value"] for p in trunc} == {low, high}  # spans the panel
    assert reward.colors["warning: truncation @ 2"] == charts.MARK_COLORS["warning"]
    assert [(e.label, e.kind) for e in reward.legend if e.kind in ("alarm", "warning")] == [
        ("warning: truncation (step 2)", "warning"), ("alarm: echo_trap (step 3)", "alarm")]
    length = charts.run_chart("completion length", rows, alarms)
    assert {p["series"] for p in length.points if "@" in p["series"]} == {"warning: truncation @ 2"}
    assert not [p for p in charts.run_chart("KL", rows, alarms).points]  # no data there: no mark either


def test_compare_draws_one_metric_per_panel_with_short_run_names():
    runs = {"tiny-20261206-0714-ab": ROWS, "tiny-20261206-0802-cd": ROWS[:2]}
    chart = charts.charts(runs, {"tiny-20261206-0802-cd": [{"step": 2, "name": "kl_blowup"}]}, compare=True)["reward"]
    assert chart.title == "reward_mean"
    assert {p["series"] for p in chart.points} == {"…0714-ab", "…0714-ab (smoothed)", "…0802-cd",
                                                   "…0802-cd (smoothed)", "…0802-cd · alarm: kl_blowup @ 2"}
    flat = [{"step": 1, "clip_frac": 0.0, "update_clip_frac": 0.1}, {"step": 2, "clip_frac": 0.0,
                                                                     "update_clip_frac": 0.3}]
    assert charts.compare_chart("clip fraction", {"a": flat}, {}).title == "update_clip_frac"  # the one that varies
    assert charts.charts({"a": ROWS}, {})["reward"].title == ""  # one run on the Runs tab: every metric


# --------------------------------------------------------------------------- status


@pytest.mark.parametrize("state,eval_running,ckpt,adapter,expected", [
    ("running", False, True, True, (True, False, True, True)),  # evaluate a checkpoint's adapter meanwhile
    ("starting", False, False, False, (True, False, False, False)),
    ("finished", False, True, True, (False, True, True, True)),
    ("finished", True, True, True, (False, False, False, True)),  # an evaluation runs: no resume, no second one
    ("interrupted", False, True, True, (False, True, True, True)),
    ("failed", False, False, False, (False, False, False, False)),
])
def test_controls_follow_the_runs_state(state, eval_running, ckpt, adapter, expected):
    c = st.controls(state, eval_running, ckpt, adapter)
    assert (c.stop, c.resume, c.evaluate, c.download) == expected


def test_runs_table_figures(tmp_path):
    run = _run(tmp_path, "r", metrics=[{"step": s, "reward_mean": r, "step_time": 2.0 + (s == 3) * 100}
                                       for s, r in ((1, 0.25), (2, 0.75), (3, 0.5))],
               summary={"interrupted": False, "error": None, "eval_before": 0.435, "eval_after": 0.7})
    row = dict(zip(runs_table.TABLE_HEADERS, runs_table.info(tmp_path, "r").row()))
    assert row["step"] == "3/4" and row["reward"] == "0.500" and row["best reward"] == "0.750 (step 2)"
    assert row["s/step"] == "2.00"  # the median: one slow step does not swing it
    assert row["ETA"] == "" and row["held-out"] == "43.5% → 70.0%"  # finished: no ETA
    procs.write_pidfile(run / "train.pid", os.getpid(), ["x"], "train")  # alive again (a resume): 1 step left
    (run / "summary.json").unlink()
    row = dict(zip(runs_table.TABLE_HEADERS, runs_table.info(tmp_path, "r").row()))
    assert row["status"] == "running" and row["ETA"] == "2s" and row["held-out"] == ""
    assert [st.duration(s) for s in (0.4, 59, 61, 3600 * 2 + 65)] == ["0s", "59s", "1m 01s", "2h 01m"]


def _adapter(run, where="adapter"):
    """A (fake) adapter folder: what adapters.py and evals.py look at."""
    d = run / where
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text("{}")
    (d / "adapter_model.safetensors").write_bytes(b"w" * 16)
    return d


def _eval_log(run, *lines, key="adapter", where="adapter"):
    """An evaluation the UI started (its record, its log); returns the record."""
    rec = evals.new_record(run, key, run / where, 0, [], None)
    evals.log_path(run, rec).write_text("=== tinyrl ui: eval adapter at 2026-12-06 07:15:00\n$ python -m tinyrl.cli "
                                        "eval\n" + "".join(line + "\n" for line in lines))
    return rec


def test_eval_status_reads_the_last_evaluation(tmp_path):
    run = _run(tmp_path, "r")
    _adapter(run)
    _adapter(run, "checkpoints/step-000002/adapter")
    assert evals.status(tmp_path, "r")["state"] == "none"
    _eval_log(run, "INFO tinyrl: tool_error_rate 0", "held-out accuracy (greedy pass@1): 70.5%", "  prompts: 200")
    ev = evals.status(tmp_path, "r")
    assert (ev["state"], ev["accuracy"], ev["prompts"], ev["adapter"], ev["error"]) == ("done", 0.705, 200,
                                                                                         "final adapter", None)
    assert st.eval_line(ev).endswith("held-out accuracy (greedy pass@1): 70.5% on 200 prompts")
    assert runs_table.info(tmp_path, "r").held_out == "70.5% (eval)"
    time.sleep(1.01)  # a record per second (its id is the time)
    # a second evaluation that failed: its error, not the old result
    _eval_log(run, "tinyrl: error: model.name 'x': no config.json", key="step-000002",
              where="checkpoints/step-000002/adapter")
    ev = evals.status(tmp_path, "r")
    assert ev["result"] is None and ev["adapter"] == "checkpoint step 2"
    assert "ended without a result: `tinyrl: error: model.name 'x'" in st.eval_line(ev)
    assert runs_table.info(tmp_path, "r").held_out == "70.5% (eval)"  # the newest result that still holds


# --------------------------------------------------------------------------- the handlers on live processes


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


@pytest.fixture
def app(tmp_path):
    pytest.importorskip("gradio")
    from tinyrl.apps.handlers import App

    children = []
    yield App(tmp_path), children
    for c in children:
        c.kill()
        c.wait()


def gr_skip():
    import gradio as gr

    return gr.skip()


def _view(app, out):
    """tick's outputs as {name: value}: the fixed part of the Runs view, the action message."""
    from tinyrl.apps.handlers import N_VIEW, VIEW_FIXED

    view = out[3: 3 + N_VIEW]
    return {**dict(zip(VIEW_FIXED, view)), "action": out[3 + N_VIEW], "plots": view[len(VIEW_FIXED):]}


def test_the_view_follows_the_processes_without_a_reload(app, tmp_path):
    app, children = app
    run = _run(tmp_path, "r", metrics=ROWS)
    _adapter(run, "checkpoints/step-000002/adapter")
    children.append(train := _sleeper())
    procs.write_pidfile(run / "train.pid", train.pid, ["x"], "train")
    from tinyrl.apps.handlers import N_VIEW

    chosen = app.selected("r", {})  # the dropdown: the same view, the action message cleared, the styles
    assert len(chosen) == N_VIEW + 6 == len(app.selected("", {})) and chosen[N_VIEW] == ""
    out = app.tick("r", [], {})
    seen, styles, v = out[-3], out[-2], _view(app, out)
    assert chosen[N_VIEW + 2] == styles
    assert "running, step 3/4" in v["status"] and v["action"] is not None
    assert (v["stop"].interactive, v["resume"].interactive, v["evaluate"].interactive) == (True, False, True)
    assert v["alarms_md"].startswith("**no alarms**: the monitor checked 3 steps") and v["alarms"].visible is False
    assert v["plots"][0].value["datatypes"]["step"] == "quantitative"
    # the styles go with the data; restyle sends them after it (the Compare tab's: nothing compared, skipped)
    assert set(styles) == set(charts.PANELS) and out[-1] == gr_skip()
    restyled = app.restyle(styles, None)
    assert restyled[0].color_map == charts.run_chart("reward", ROWS).colors and restyled[0].x_lim == [0, 20]
    assert 'data-series="reward_mean (smoothed)"' in restyled[2 * len(charts.PANELS)]  # the reward legend
    assert all(o == gr_skip() for o in restyled[len(charts.PANELS): 2 * len(charts.PANELS)])

    again = app.tick("r", [], seen)  # nothing changed: nothing sent
    assert all(o == gr_skip() for i, o in enumerate(again) if i != len(again) - 3)

    # the run ends (SIGTERM'd by Stop, say): Stop goes grey, Resume works, the old action message goes
    train.kill()
    train.wait()
    (run / "summary.json").write_text(json.dumps({"interrupted": True, "error": None}))
    out = app.tick("r", [], again[-3])
    v = _view(app, out)
    assert "interrupted" in v["status"] and v["action"] == ""
    assert (v["stop"].interactive, v["resume"].interactive) == (False, True)

    # an evaluation runs, then exits: its result shows at the next tick, no reload
    children.append(ev := _sleeper())
    procs.write_pidfile(run / "eval.pid", ev.pid, ["x"], "eval")
    rec = _eval_log(run, key="step-000002", where="checkpoints/step-000002/adapter")
    out = app.tick("r", [], out[-3])
    v = _view(app, out)
    assert "running" in v["eval"] and v["evaluate"].interactive is False and v["resume"].interactive is False
    with open(evals.log_path(run, rec), "a") as f:
        f.write("held-out accuracy (greedy pass@1): 68.0%\n  prompts: 200\n")
    ev.kill()
    ev.wait()
    out = app.tick("r", [], out[-3])
    v = _view(app, out)
    assert v["eval"].endswith("held-out accuracy (greedy pass@1): 68.0% on 200 prompts") and v["action"] == ""
    assert v["evaluate"].interactive is True


def test_an_unknown_preset_gets_an_error_not_a_silent_revert(app):
    app, _ = app
    import gradio as gr

    header, *rest, pending = app.form.preset_changed("no_such_preset", None)
    assert "not a shipped preset" in header and all(r == gr.skip() for r in rest)  # the form stays
    shown, command = app.form.validate("no_such_preset", "", *[None] * len(forms.KEYS), "", "")
    assert "preset 'no_such_preset': not a shipped preset" in shown and command == ""
    with pytest.raises(gr.Error, match="not a shipped preset"):
        app.form.start("no_such_preset", "", *[None] * len(forms.KEYS), "", "")


def test_the_page_shows_the_runs_dir_as_given_and_no_interpreter_path(tmp_path):
    pytest.importorskip("gradio")
    from tinyrl.apps.handlers import App

    app = App(tmp_path)
    app.shown_dir = "runs"
    assert app.shown(f"$ {sys.executable} -m tinyrl.cli train log.run_dir={tmp_path.resolve()}") == \
        "$ python -m tinyrl.cli train log.run_dir=runs"
