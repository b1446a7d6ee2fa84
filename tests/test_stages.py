"""`stages: [sft, grpo]`: one command, the GRPO stage starts from the SFT adapter, resume skips
finished stages; `model.adapter` starts GRPO from a trained adapter."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tinyrl.api import train
from tinyrl.cli import main
from tinyrl.config import ConfigError, load_config
from tinyrl.methods import chain, grpo
from tinyrl.methods.registry import METHODS
from tinyrl.runs import RunDir, read_jsonl
from tinyrl.trainer import Trainer

SMALL = {"sft.max_steps": 3, "sft.batch_size": 8, "train.steps": 2, "train.prompts_per_step": 4,
         "rollout.num_generations": 4, "train.micro_batch_size": 16, "data.num_train": 64, "data.num_eval": 16,
         "log.progress": False}


def small(run_root, name, **extra):
    return {**SMALL, "log.run_dir": run_root, "log.name": name, **extra}


def weights(folder):
    return load_file(str(folder / "adapter" / "adapter_model.safetensors"))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def evaluations(monkeypatch) -> list[str]:
    """The GRPO trainer's held-out evaluations, in order ("before", "after")."""
    seen, real = [], Trainer.evaluate
    monkeypatch.setattr(Trainer, "evaluate", lambda self, when: seen.append(when) or real(self, when))
    return seen


def test_grpo_stage_starts_from_the_sft_adapter_and_its_held_out_score(run_root, monkeypatch):
    evaluated = evaluations(monkeypatch)
    run = train("tiny_sft_grpo_cpu", **small(run_root, "zero", **{"train.steps": 0}))
    sft_dir, grpo_dir = run.path / "stages" / "01-sft", run.path / "stages" / "02-grpo"
    # zero GRPO steps: the GRPO stage's adapter is exactly the one it started from
    assert same(weights(grpo_dir), weights(sft_dir))
    grpo_summary = json.loads((grpo_dir / "summary.json").read_text())
    sft_summary = json.loads((sft_dir / "summary.json").read_text())
    # the same policy on the same held-out rows: SFT's "after" is carried as GRPO's "before", not measured again
    assert evaluated == ["after"]
    assert grpo_summary["eval_before"] == sft_summary["eval_after"]
    assert grpo_summary["details"]["eval_before_from"] == "stages/01-sft"
    assert sft_summary["eval_after"] != sft_summary["eval_before"]  # ... which SFT did move

    # and the GRPO trainer the stage builds holds the SFT weights before its first step, and measures that score
    _, cfg = load_config("tiny_sft_grpo_cpu", small(run_root, "unused"))
    cfg = chain.stage_config(cfg, str(sft_dir / "adapter"))
    trainer = grpo.build(cfg, RunDir(run.path / "probe"))
    state = {k.replace(".default", ""): v for k, v in trainer.model.state_dict().items() if "lora_" in k}
    assert same(state, weights(sft_dir))
    assert trainer.state.eval_before is None  # a folder of its own: nothing carried
    assert trainer.evaluate("before") == sft_summary["eval_after"]


def test_a_stage_with_pass_at_k_measures_its_own_before(run_root, monkeypatch):
    evaluated = evaluations(monkeypatch)
    run = train("tiny_sft_grpo_cpu", **small(run_root, "sampled", **{"train.steps": 0, "train.eval_samples": 2}))
    grpo_summary = json.loads((run.path / "stages" / "02-grpo" / "summary.json").read_text())
    assert evaluated == ["before", "after"]  # pass@k before is not in SFT's summary: nothing is carried
    assert "eval_before_from" not in grpo_summary["details"] and "before" in grpo_summary["details"]["eval_sampled"]


def test_sft_then_grpo_is_one_command(tmp_path, capsys):
    code = main(["train", "tiny_sft_grpo_cpu", f"log.run_dir={tmp_path}", "log.name=chain",
                 *[f"{k}={v}" for k, v in SMALL.items()]])
    assert code == 0
    assert "held-out accuracy (greedy pass@1)" in capsys.readouterr().out
    run = tmp_path / "chain"
    assert [r["step"] for r in read_jsonl(run / "stages" / "01-sft" / "metrics.jsonl")] == [1, 2, 3]
    assert [r["step"] for r in read_jsonl(run / "stages" / "02-grpo" / "metrics.jsonl")] == [1, 2]
    assert not same(weights(run / "stages" / "02-grpo"), weights(run / "stages" / "01-sft"))  # GRPO trained
    assert same(weights(run), weights(run / "stages" / "02-grpo"))  # the run's adapter is the last stage's
    summary = json.loads((run / "summary.json").read_text())
    stages = summary["details"]["stages"]
    assert [s["stage"] for s in stages] == ["sft", "grpo"]
    assert summary["eval_before"] == stages[0]["eval_before"]
    assert summary["eval_after"] == stages[1]["eval_after"] is not None


def test_an_interrupted_chain_resumes_in_its_grpo_stage(run_root, monkeypatch):
    whole = train("tiny_sft_grpo_cpu", **small(run_root, "whole", **{"train.steps": 3}))

    real_step = Trainer.train_step

    def ctrl_c_at_step_2(self):
        if self.state.step == 1:
            raise KeyboardInterrupt
        return real_step(self)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", ctrl_c_at_step_2)
        cut = train("tiny_sft_grpo_cpu", **small(run_root, "cut", **{"train.steps": 3}))
    assert cut.interrupted and json.loads((cut.path / "summary.json").read_text())["interrupted"]

    sft_runs = []
    real_sft = METHODS["sft"]
    monkeypatch.setitem(METHODS, "sft", lambda cfg, run, **kw: sft_runs.append(run) or real_sft(cfg, run, **kw))
    resumed = train(resume=cut.path)
    assert sft_runs == []  # the finished SFT stage is not run again
    assert same(weights(resumed.path), weights(whole.path))
    rewards = lambda p: [r["reward_mean"] for r in read_jsonl(p / "stages" / "02-grpo" / "metrics.jsonl")]  # noqa: E731
    assert rewards(resumed.path) == rewards(whole.path) and len(rewards(whole.path)) == 3


def test_unknown_stage_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"stages\[1\]: must be one of \['grpo', 'rest_em', 'sft', 'star'\]"):
        load_config("tiny_grpo_cpu", {"stages": ["sft", "ppo"]})
