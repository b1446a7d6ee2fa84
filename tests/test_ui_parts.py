"""The UI's parts without a server: path safety, exposure rules, the launch form's validation
(the same words as the CLI), run-folder reading, and the message when gradio is missing."""

import doctest
import json
import os
import re
import subprocess
import sys
import time

import pytest

from tinyrl.apps import forms, paths, procs, runs_view, server
from tinyrl.config import ConfigError
from tinyrl.planner import GPUS
from tinyrl.planner.report import run as tinyrl_plan


@pytest.mark.parametrize("module", [paths, forms, runs_view, server], ids=lambda m: m.__name__)
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
    assert "pip install 'tinyrl[ui]'" in out.stderr and "Traceback" not in out.stderr


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


def test_curves_skip_missing_and_null_values_and_label_runs_when_comparing(tmp_path):
    _run(tmp_path, "a", metrics=[{"step": 1, "reward_mean": 0.1, "reward/answer": 0.2, "entropy": None},
                                 {"step": 2, "reward_mean": 0.3, "entropy": 1.5}])
    _run(tmp_path, "b", metrics=[{"step": 1, "reward_mean": 0.4}])
    one = runs_view.curves(tmp_path, ["a"])
    assert one["reward"] == [{"step": 1, "value": 0.1, "series": "reward_mean"},
                             {"step": 2, "value": 0.3, "series": "reward_mean"},
                             {"step": 1, "value": 0.2, "series": "reward/answer"}]
    assert one["entropy"] == [{"step": 2, "value": 1.5, "series": "entropy"}]
    both = runs_view.curves(tmp_path, ["a", "b"])
    assert {p["series"] for p in both["reward"]} == {"a · reward_mean", "a · reward/answer", "b · reward_mean"}
    assert {p["series"] for p in both["entropy"]} == {"a"}


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
