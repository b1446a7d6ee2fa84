"""ReST-EM and STaR on the shipped tiny model: restart from the base every iteration, no hint in
STaR's kept rows, resume mid-iteration with the same result, the arithmetic hint, the metrics."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tinyrl.api import train
from tinyrl.cli import main
from tinyrl.methods import selfimprove
from tinyrl.runs import read_jsonl
from tinyrl.tasks.arithmetic import has_carry, is_held_out, operand_range

SMALL = {"selfimprove.iterations": 2, "selfimprove.prompts_per_iter": 16, "selfimprove.samples_per_prompt": 4,
         "sft.epochs": 1, "sft.batch_size": 8, "sft.lr": 1e-3, "data.num_train": 64, "data.num_eval": 16,
         "train.prompts_per_step": 8, "log.progress": False}


def small(run_root, name, **extra):
    return {**SMALL, "log.run_dir": run_root, "log.name": name, **extra}


def lora_state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def test_arithmetic_hint_is_the_same_answer_without_a_carry():
    covered = 0
    for a in operand_range(2):
        for b in operand_range(2):
            row = {"prompt": f"{a}+{b}=", "answer": str(a + b), "a": a, "b": b}
            hint = selfimprove.arithmetic_hint(row)
            if a + b >= 100 or a + b < 20:
                assert hint is None  # no carry-free sum of two 2-digit numbers makes these
                continue
            x, y = map(int, hint.prompt[:-1].split("+"))
            assert x + y == a + b and not has_carry(x, y) and 10 <= x <= 99 and 10 <= y <= 99
            assert hint.text in hint.prompt and str(a + b) not in hint.text.split("+")
            covered += 1
    assert covered > 0


def test_rest_em_fine_tunes_the_base_every_iteration_and_samples_the_latest_iterate(run_root, monkeypatch):
    at_fit, sampled_from = [], []
    real_fit, real_sample = selfimprove.fit, selfimprove.SelfImprove.sample

    def spy_fit(cfg, model, tok, rows, folder):
        at_fit.append(lora_state(model))  # the adapter the M-step starts from
        return real_fit(cfg, model, tok, rows, folder)

    def spy_sample(self, k, adapter):
        sampled_from.append((k, adapter))
        return real_sample(self, k, adapter)

    monkeypatch.setattr(selfimprove, "fit", spy_fit)
    monkeypatch.setattr(selfimprove.SelfImprove, "sample", spy_sample)
    run = train("tiny_rest_em_cpu", **small(run_root, "rest"))
    assert len(at_fit) == 2
    first_iterate = load_file(str(run.path / "iterations" / "001" / "sft" / "adapter" / "adapter_model.safetensors"))
    for state in at_fit:
        assert all(torch.equal(state[k], at_fit[0][k]) for k in state)  # each M-step starts from the same weights
        assert all(not v.any() for k, v in state.items() if "lora_B" in k)  # ... the base's: LoRA B = 0
    trained_b = [v for k, v in first_iterate.items() if "lora_B" in k]
    assert any(v.abs().sum() > 0 for v in trained_b)  # and iteration 1's iterate is not that
    assert sampled_from == [(1, None), (2, str(run.path / "iterations" / "001" / "sft" / "adapter"))]


def test_rest_em_run_folder_metrics_and_summary(run_root):
    run = train("tiny_rest_em_cpu", **small(run_root, "folder", **{"selfimprove.max_per_prompt": 2}))
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and [r["iteration"] for r in rows] == [0, 1, 2]
    assert rows[0]["samples_used"] == 0 and "kept_frac" not in rows[0]  # the base: nothing sampled yet
    for r in rows[1:]:
        assert r["samples"] == 16 * 4 and 0 < r["kept_frac"] <= 1 and 0 <= r["eval_acc"] <= 1
        assert r["kept"] <= 16 * 2  # the per-prompt cap
    assert [r["samples_used"] for r in rows] == [0, 64, 128]
    for k in (1, 2):
        records = read_jsonl(run.path / "iterations" / f"{k:03d}" / "samples.jsonl")
        assert len(records) == 64
        kept = [r for r in records if r["kept"]]
        assert len(kept) == rows[k]["kept"] and all(r["reward"] == 1.0 for r in kept)
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["eval_before"] == rows[0]["eval_acc"] and summary["eval_after"] == rows[-1]["eval_acc"]
    assert summary["details"]["samples_used"] == 128 and summary["details"]["iterations"] == 2
    assert (run.path / "adapter" / "adapter_config.json").is_file() and (run.path / "report.txt").is_file()


def test_star_keeps_rationales_without_the_hint(run_root, monkeypatch):
    trained_on = []
    real_fit = selfimprove.fit

    def spy_fit(cfg, model, tok, rows, folder):
        trained_on.extend(rows)
        return real_fit(cfg, model, tok, rows, folder)

    monkeypatch.setattr(selfimprove, "fit", spy_fit)
    # one sample per prompt: the tiny base misses many carrying sums, so many prompts get a hint
    run = train("tiny_star_cpu", **small(run_root, "star", **{
        "selfimprove.iterations": 1, "selfimprove.prompts_per_iter": 32, "selfimprove.samples_per_prompt": 1,
        "selfimprove.hint_samples": 2}))
    records = read_jsonl(run.path / "iterations" / "001" / "samples.jsonl")
    hinted = [r for r in records if r["hinted"]]
    rationalized = [r for r in hinted if r["kept"]]
    assert rationalized, "the hint made the tiny model right on some failed prompts"
    for r in rationalized:
        assert r["rendered"] == r["prompt"] and r["hint"] != r["prompt"]  # kept under the original prompt
        assert r["completion"] == str(eval(r["prompt"][:-1]))  # the original sum's answer
    hints = {r["hint"] for r in hinted}
    assert len(trained_on) == sum(r["kept"] for r in records)
    for row in trained_on:
        assert set(row) == {"rendered", "completion"}
        assert row["rendered"] not in hints and not any(h[:-1] in row["completion"] for h in hints)
    stats = read_jsonl(run.path / "metrics.jsonl")[-1]
    assert stats["rationalized"] == len(rationalized) and stats["hint_samples"] == len(hinted)
    assert stats["samples_used"] == 32 + len(hinted)  # hinted samples count against the budget


def test_killed_mid_iteration_resumes_to_the_same_result(run_root, monkeypatch):
    whole = train("tiny_star_cpu", **small(run_root, "whole"))

    calls = []
    real_fit = selfimprove.fit

    def crash_in_second_m_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")  # iteration 2: sampling done, SFT not
        return real_fit(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(selfimprove, "fit", crash_in_second_m_step)
        with pytest.raises(RuntimeError, match="killed"):
            train("tiny_star_cpu", **small(run_root, "cut"))
    cut = whole.path.parent / "cut"
    second = cut / "iterations" / "002"
    assert (second / "samples.jsonl").exists() and not (second / "stats.json").exists()
    assert "killed" in json.loads((cut / "summary.json").read_text())["error"]
    sampled_before = (second / "samples.jsonl").read_text()

    resampled = []
    real_sample = selfimprove.SelfImprove.sample
    monkeypatch.setattr(selfimprove.SelfImprove, "sample",
                        lambda self, k, a: resampled.append(k) or real_sample(self, k, a))
    resumed = train(resume=cut)
    assert resampled == []  # both E-steps were done: none ran again
    assert (second / "samples.jsonl").read_text() == sampled_before
    drop = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]  # noqa: E731
    assert drop(read_jsonl(resumed.path / "metrics.jsonl")) == drop(read_jsonl(whole.path / "metrics.jsonl"))
    a = load_file(str(whole.adapter / "adapter_model.safetensors"))
    b = load_file(str(resumed.adapter / "adapter_model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    assert resumed.eval_after == whole.eval_after and resumed.eval_before == whole.eval_before


def test_tinyrl_train_cli_runs_rest_em(tmp_path, capsys):
    code = main(["train", "tiny_rest_em_cpu", f"log.run_dir={tmp_path}", "log.name=cli",
                 *[f"{k}={v}" for k, v in SMALL.items()], "selfimprove.iterations=1"])
    assert code == 0
    out = capsys.readouterr().out
    assert "held-out accuracy (greedy pass@1)" in out and "before" in out and "after" in out
    assert [r["iteration"] for r in read_jsonl(tmp_path / "cli" / "metrics.jsonl")] == [0, 1]


def test_held_out_sums_are_never_sampled_for_training(run_root):
    run = train("tiny_rest_em_cpu", **small(run_root, "pools", **{"selfimprove.iterations": 1}))
    for r in read_jsonl(run.path / "iterations" / "001" / "samples.jsonl"):
        a, b = map(int, r["prompt"][:-1].split("+"))
        assert not is_held_out(a, b)


@pytest.mark.slow
def test_rest_em_beats_the_base_on_held_out_sums(run_root):
    run = train("tiny_rest_em_cpu", **{"log.run_dir": run_root, "log.progress": False, "selfimprove.iterations": 1})
    assert run.eval_before == pytest.approx(0.435)
    assert run.eval_after >= run.eval_before + 0.2, (run.eval_before, run.eval_after)
