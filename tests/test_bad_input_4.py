"""Reliability round 4 (issue 49): the bad-input table grown by the newest surfaces, class by class: null gold
answers, empty held-out sets, templates that reach past a row's columns, sizes without a bound, YAML bombs, pipes
and devices as data, empty and truncated files, huge sample counts, missing optional packages, API arguments of
the wrong type, a local preset named like a shipped one, `tinyrl report` on a folder that is no run, and a stop
request whose step never ends. The same harness as tests/test_bad_input.py (its `Case`, run in-process and, slow,
as subprocesses); every row here failed (a traceback, a silent wrong result or a hang) before this round.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_bad_input import (  # noqa: F401
    REPO,
    TINY,
    Case,
    after,
    finished,
    fx,
    representatives,
    run_folder,
    runs,
    train,
    truncate,
    write,
)
from tinyrl.errors import ConfigError

ME = "tests.test_bad_input_4"


def rows(n: int, null: set[int]):
    return "".join(json.dumps({"question": f"{i}+{i}=", "answer": None if i in null else str(2 * i)}) + "\n"
                   for i in range(n))


def dataset(text, *extra, name="d.jsonl"):
    return lambda tmp, f: ["train", *TINY, runs(tmp), f"data.dataset={write(tmp, name, text)}",
                            "data.columns={prompt: question}", *extra]


def fifo(tmp, f):
    path = tmp / "pipe.jsonl"
    os.mkfifo(path)
    return ["train", *TINY, runs(tmp), f"data.dataset={path}", "data.columns={prompt: question}"]


def deep_yaml(depth):
    return lambda tmp, f: ["train", str(write(tmp, "deep.yaml", "train:\n  steps: " + "[" * depth + "]" * depth + "\n")),
                            runs(tmp)]


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def plain_folder(tmp) -> Path:
    (tmp / "plain").mkdir()
    return write(tmp / "plain", "notes.txt", "mine").parent


def nothing_written(tmp):
    assert sorted(p.name for p in (tmp / "plain").iterdir()) == ["notes.txt"]


def trained(tmp):
    (folder,) = (tmp / "runs").iterdir()
    assert [m["step"] for m in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())] == [1, 2]


CASES = [
    # silent wrong -> an error, or a correct result
    Case("null_answers_all", dataset(rows(12, set(range(12)))), 2, ["data.columns.answer", "null or empty"]),
    Case("null_answer_one_of_40", dataset(rows(40, {7})), 0, ["1 of", "null or empty answer column 'answer'"],
         fresh=False, check=trained),
    Case("code_task_memory_zero", lambda tmp, f: ["train", "tiny_code_cpu", runs(tmp), "data.task_args.memory_mb=0"],
         2, ["data.task_args.memory_mb", "from 64 to 65536"]),
    Case("code_task_wall_negative", lambda tmp, f: ["train", "tiny_code_cpu", runs(tmp), "data.task_args.wall_s=-1"],
         2, ["data.task_args.wall_s"]),
    Case("code_task_memory_lots", lambda tmp, f: ["train", "tiny_code_cpu", runs(tmp), "data.task_args.memory_mb=lots"],
         2, ["data.task_args.memory_mb"]),
    Case("no_held_out_rows", train("train.eval_before_after=true", "data.num_eval=0"), 2,
         ["train.eval_before_after", "holds no prompt out"]),
    Case("one_row_dataset_held_out", dataset(rows(1, set()), "train.eval_before_after=true"), 2,
         ["train.eval_before_after", "held-out set", "empty"]),
    Case("template_attribute", train("data.prompt_template='{question.__class__.__mro__}'"), 2,
         ["data.prompt_template", "not attributes or items"]),
    Case("template_item", train("data.prompt_template='{question[__class__]}'"), 2,
         ["data.prompt_template", "not attributes or items"]),
    Case("template_width", train("data.prompt_template='{question:>2000000000}'"), 2,
         ["data.prompt_template", "short format spec"]),
    Case("code_task_template_attribute",
         lambda tmp, f: ["train", "tiny_code_cpu", runs(tmp), "data.task_args.prompt='{text.__class__}'"], 2,
         ["data.task_args.prompt"]),
    # hangs -> refused up front
    Case("inflight_groups_huge", train("rollout.max_staleness=1", "rollout.inflight_groups=100000"), 2,
         ["rollout.inflight_groups", "must be in [1, 65536]"]),
    Case("inflight_groups_many_steps_worth", train("rollout.max_staleness=1", "rollout.inflight_groups=1000"), 2,
         ["rollout.inflight_groups", "at most 8 x train.prompts_per_step = 16"]),
    Case("max_staleness_huge", train("rollout.max_staleness=1000000000"), 2,
         ["rollout.max_staleness", "must be in [0, 64]"]),
    Case("yaml_alias_bomb", lambda tmp, f: ["train", str(write(tmp, "bomb.yaml", BOMB)), runs(tmp)], 2,
         ["bomb.yaml", "alias bomb"]),
    Case("yaml_nested_20000_deep", deep_yaml(20_000), 2, ["deep.yaml", "nested too deeply"]),
    Case("dataset_is_a_fifo", fifo, 2, ["data.dataset", "not a regular file or folder"]),
    Case("dataset_is_dev_zero", lambda tmp, f: ["train", *TINY, runs(tmp), "data.dataset=/dev/zero"], 2,
         ["data.dataset", "not a regular file or folder"]),
    # tracebacks -> one clear line
    Case("dataset_empty_file", dataset(""), 2, ["data.dataset", "is empty (0 bytes)"]),
    Case("export_truncated_adapter", lambda tmp, f: [
        "export", str(run_folder(lambda d: truncate(d / "adapter" / "adapter_model.safetensors", 0.01))(tmp, f)),
        "--merged", str(tmp / "out")], 2, ["the adapter is corrupt (adapter_model.safetensors is truncated"], fresh=False),
    Case("eval_samples_huge", lambda tmp, f: ["eval", "tiny_grpo_cpu", "--samples", "100000000"], 2,
         ["--samples: at most 1024"]),
    # noisy -> right
    Case("local_preset_named_like_its_shipped_base", lambda tmp, f: [
        "train", str(write(tmp, "tiny_grpo_cpu.yaml", "base: tiny_grpo_cpu\ntrain: {steps: 2}\n")), *TINY[1:], runs(tmp)],
        0, [], fresh=False, check=trained),
    Case("report_on_a_folder_that_is_no_run", lambda tmp, f: ["report", str(plain_folder(tmp))], 2,
         ["not a tinyrl run folder", "nothing is written into it"], check=nothing_written),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_round_4_in_process(case, tmp_path, fx, capsys, caplog):  # noqa: F811
    from tinyrl.cli import main

    argv = case.build(tmp_path, fx)
    with caplog.at_level(logging.INFO):
        rc = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err + caplog.text, f"{case.id}:\n{(out.err + caplog.text)[-3000:]}"
    after(case, tmp_path, rc, out.err + out.out + caplog.text)


@pytest.mark.slow
@pytest.mark.parametrize("case", representatives([c for c in CASES if c.rc]), ids=lambda c: c.id)
def test_round_4_as_a_subprocess(case, tmp_path, fx):  # noqa: F811
    proc = subprocess.run([sys.executable, "-m", "tinyrl", *case.build(tmp_path, fx)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in proc.stderr, f"{case.id}:\n{proc.stderr[-3000:]}"
    after(case, tmp_path, proc.returncode, proc.stderr + proc.stdout)


# --------------------------------------------------------------------------- beside the table


@pytest.mark.parametrize("field, value, package", [("model.quantization", "int8", "torchao"),
                                                   ("rollout.engine", "vllm", "vllm")])
def test_a_missing_optional_package_is_one_line_naming_the_extra(field, value, package, tmp_path, monkeypatch, capsys):
    import importlib.util

    from tinyrl.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    rc = main(["train", *TINY, runs(tmp_path), f"{field}={value}"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{field}: this run needs {package}" in err and "pip install 'tinyrl-rlvr[" in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("kwargs, says", [
    ({"samples": 4, "k": "3"}, "k: a list of whole numbers"), ({"samples": 2.5}, "samples: a whole number"),
    ({"samples": 4, "temperature": "hot"}, "temperature: a number > 0"), ({"samples": True}, "samples: a whole number")])
def test_evaluate_refuses_arguments_of_the_wrong_type(kwargs, says):
    import tinyrl

    with pytest.raises(ConfigError, match=says):
        tinyrl.evaluate("tiny_grpo_cpu", **kwargs)


@pytest.mark.parametrize("kwargs, says", [({"run_dir": None, "merged": "out"}, "run_dir must be a path"),
                                          ({"merged": 5}, "merged must be a path"),
                                          ({"merged": "out", "dtype": None}, "dtype: must be one of")])
def test_export_refuses_arguments_of_the_wrong_type(kwargs, says, finished):  # noqa: F811
    import tinyrl

    with pytest.raises(ConfigError, match=says):
        tinyrl.export(**{"run_dir": finished, **kwargs})


def test_a_step_that_never_ends_is_abandoned_after_the_stop_deadline(tmp_path, monkeypatch):
    """SIGTERM inside a step that never ends: past train.stop_timeout_s the step is abandoned, the run returns
    interrupted with its last checkpoint (a `timeout 90 tinyrl train` ends); it used to wait forever."""
    import tinyrl
    import tinyrl.trainer as trainer_module

    real, stuck = trainer_module.Trainer.update, threading.Event()

    def update(self, batch):
        if self.state.step == 1:  # the second step hangs (in Python: the interrupt can reach it)
            os.kill(os.getpid(), signal.SIGTERM)
            stuck.set()
            while True:
                time.sleep(0.01)
        return real(self, batch)

    monkeypatch.setattr(trainer_module.Trainer, "update", update)
    from tinyrl.config import parse_override

    o = {".".join(k): v for k, v in map(parse_override, TINY)}
    started = time.monotonic()
    run = tinyrl.train(**{**o, "train.steps": 2, "train.save_every": 1, "train.stop_timeout_s": 2,
                          "log.run_dir": str(tmp_path / "runs")})
    assert stuck.is_set() and run.interrupted and run.resumable
    assert time.monotonic() - started < 120
    assert [c.name for c in Path(run.path, "checkpoints").iterdir()] == ["step-000001"]
