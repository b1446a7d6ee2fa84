"""What every method shares (tinyrl/methods/common.py): one summary.json schema, and a resume that
reports only the changes a user made (not an `auto` the run decided, nor a monitor action it took,
which survives the resume)."""

import dataclasses
import json
import logging

import pytest

from tinyrl.api import build_trainer, train
from tinyrl.methods.common import Summary
from tinyrl.runs import read_jsonl
from tinyrl.trainer import Trainer

SCHEMA = {f.name for f in dataclasses.fields(Summary)}
TINY = {"log.progress": False, "data.num_train": 32, "data.num_eval": 8, "train.prompts_per_step": 4,
        "rollout.num_generations": 4, "train.micro_batch_size": 16}
METHODS = {  # preset -> overrides that make it a few seconds long
    "tiny_grpo_cpu": {"train.steps": 1},
    "tiny_sft_cpu": {"sft.max_steps": 1, "sft.batch_size": 8},
    "tiny_rest_em_cpu": {"selfimprove.iterations": 1, "selfimprove.prompts_per_iter": 4,
                         "selfimprove.samples_per_prompt": 2, "sft.max_steps": 1, "sft.batch_size": 8},
    "tiny_star_cpu": {"selfimprove.iterations": 1, "selfimprove.prompts_per_iter": 4,
                      "selfimprove.samples_per_prompt": 2, "selfimprove.hint_samples": 1, "sft.max_steps": 1,
                      "sft.batch_size": 8},
    "tiny_sft_grpo_cpu": {"train.steps": 1, "sft.max_steps": 1, "sft.batch_size": 8},
}


@pytest.mark.slow
def test_every_method_writes_the_same_summary_schema(run_root):
    methods = {}
    for preset, extra in METHODS.items():
        run = train(preset, **{**TINY, **extra, "log.run_dir": run_root, "log.name": preset})
        summary = json.loads((run.path / "summary.json").read_text())
        assert set(summary) == SCHEMA, (preset, sorted(set(summary) ^ SCHEMA))
        assert summary["steps"] >= 1 and summary["interrupted"] is False and summary["error"] is None
        assert summary["eval_before"] is not None and summary["eval_after"] is not None
        methods[preset] = summary["method"]
        for stage in summary["details"].get("stages", []):  # a chain's stages: each the same schema
            assert SCHEMA <= set(stage), (preset, stage["stage"])
    assert methods == {"tiny_grpo_cpu": "grpo", "tiny_sft_cpu": "sft", "tiny_rest_em_cpu": "rest_em",
                       "tiny_star_cpu": "star", "tiny_sft_grpo_cpu": "chain"}


# --------------------------------------------------------------------------- resume


def collapsing(tiny_model_dir, run_root, name, steps=4):
    """A random model on the arithmetic task: every group's rewards are equal (all wrong), so the
    monitor's advantage_collapse fires at step 1, and its automatic action turns on dynamic sampling."""
    return {**TINY, "model.name": tiny_model_dir, "log.run_dir": run_root, "log.name": name,
            "train.steps": steps, "train.save_every": 1, "train.eval_before_after": False,
            "rollout.max_new_tokens": 4, "algo.max_sampling_rounds": 1, "train.micro_batch_size": 8,
            "monitor.window": 1, "monitor.auto_dynamic_sampling": True}


def test_a_resume_with_no_change_reports_none(tiny_model_dir, run_root, caplog):
    run = train(**{**collapsing(tiny_model_dir, run_root, "same", steps=1), "monitor.auto_dynamic_sampling": False})
    with caplog.at_level(logging.WARNING):
        t = build_trainer(resume=run.path)
        t.run.unlock()
    assert "differs" not in caplog.text
    assert read_jsonl(run.path / "resumes.jsonl")[-1]["changed"] == {}
    # the run decided model.gradient_checkpointing (auto) at both starts; the user's 'auto' stays on disk
    assert t.cfg.model.gradient_checkpointing is False
    assert "gradient_checkpointing: auto" in (run.path / "config.yaml").read_text()


def test_a_monitor_action_survives_a_kill_and_resume_and_is_not_a_user_change(tiny_model_dir, run_root, caplog,
                                                                               monkeypatch):
    whole = train(**collapsing(tiny_model_dir, run_root, "whole"))
    fired = read_jsonl(whole.path / "alarms.jsonl")
    assert fired[0]["name"] == "advantage_collapse" and fired[0]["step"] == 1
    assert "turned on algo.dynamic_sampling" in fired[0]["applied"]
    assert json.loads((whole.path / "summary.json").read_text())["details"]["config_patches"] == \
        {"algo.dynamic_sampling": True}

    real_step = Trainer.train_step

    def killed_in_step_3(self):
        if self.state.step == 2:
            raise KeyboardInterrupt  # a second Ctrl-C: the step is abandoned, checkpoint step-2 is the last
        return real_step(self)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", killed_in_step_3)
        cut = train(**collapsing(tiny_model_dir, run_root, "cut"))
    assert cut.interrupted and cut.path.joinpath("checkpoints", "step-000002").is_dir()

    with caplog.at_level(logging.WARNING):
        t = build_trainer(resume=cut.path)
    assert t.state.step == 2 and t.cfg.algo.dynamic_sampling is True  # the action, restored
    assert t.base_cfg.algo.dynamic_sampling is False  # ... over the user's config, which it did not edit
    assert "differs" not in caplog.text and read_jsonl(cut.path / "resumes.jsonl")[-1]["changed"] == {}
    assert "dynamic_sampling: false" in (cut.path / "config.yaml").read_text()
    try:
        t.train()
    finally:
        t.run.unlock()
    key = lambda rows: [(r["step"], r["sampling_rounds"], r["reward_mean"], r["loss"]) for r in rows]  # noqa: E731
    assert key(read_jsonl(cut.path / "metrics.jsonl")) == key(read_jsonl(whole.path / "metrics.jsonl"))
