"""The built-in arithmetic task and the tiny-arith model shipped for it (offline, CPU)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch

from tinyrl.tasks import get_task
from tinyrl.tasks.arithmetic import carryless_sum, has_carry, is_held_out

ASSET = Path(str(resources.files("tinyrl.assets") / "tiny-arith"))


@pytest.fixture(scope="module")
def task():
    return get_task("arithmetic")


def test_registered(task):
    assert task.name == "arithmetic" and "\n" in task.stop


def test_build_is_deterministic_and_disjoint(task):
    train, held = task.build(num_train=2000, num_eval=200, seed=0)
    assert (train, held) == task.build(num_train=2000, num_eval=200, seed=0)
    assert task.build(num_train=2000, num_eval=200, seed=1)[0] != train
    assert len(train) == 2000 and len(held) == 200
    prompts = [r["prompt"] for r in train]
    assert len(set(prompts)) == len(prompts)
    assert not set(prompts) & {r["prompt"] for r in held}
    # disjoint whatever the seed: held-out rows come from a fixed pool
    other_train, _ = task.build(num_train=2000, num_eval=0, seed=7)
    assert not {r["prompt"] for r in other_train} & {r["prompt"] for r in held}
    assert all(is_held_out(r["a"], r["b"]) for r in held)
    assert task.build(num_train=0, num_eval=200, seed=0)[1] == held  # held-out rows ignore num_train
    for r in train[:50] + held[:50]:
        assert r["prompt"] == f"{r['a']}+{r['b']}=" and r["answer"] == str(r["a"] + r["b"])
        assert 10 <= r["a"] <= 99 and 10 <= r["b"] <= 99


def test_build_digits_and_pool_limits(task):
    train, held = task.build(num_train=100, num_eval=20, seed=0, digits=4)
    assert all(1000 <= r["a"] <= 9999 and 1000 <= r["b"] <= 9999 for r in train + held)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    with pytest.raises(ValueError, match="num_eval"):
        task.build(num_train=10, num_eval=50, seed=0, digits=1)


def test_carry_helpers():
    assert has_carry(37, 48) and has_carry(52, 61) and not has_carry(12, 34)
    assert carryless_sum(37, 48) == 75 and carryless_sum(91, 19) == 0 and carryless_sum(12, 34) == 46


@pytest.mark.parametrize("completion, ok", [
    ("85", True),           # the answer, ended by EOS (decoded away)
    ("85\n", True),         # ended by the newline stop string
    ("75", False),          # wrong
    ("", False),
    ("85 ", False), (" 85", False), ("085", False), ("8 5", False), ("85\n\n", False),  # malformed
    ("85 86", False), ("85\n86", False), ("85 or 86", False), ("85=85", False),  # hedged / extra
    ("eighty-five", False),
])
def test_is_correct(task, completion, ok):
    assert task.is_correct(completion, {"answer": "85"}) is ok


def test_reward_signature(task):
    assert task.reward(["1+2="] * 3, ["3", "4", "3\n"], answer=["3", "3", "3"]) == [1.0, 0.0, 1.0]


# --------------------------------------------------------------------------- shipped model


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ASSET, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(ASSET).eval()
    return tok, model


def test_asset_is_small_and_offline():
    files = {p.name for p in ASSET.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= files
    assert sum(p.stat().st_size for p in ASSET.iterdir()) < 5_000_000
    config = json.loads((ASSET / "config.json").read_text())
    assert config["model_type"] == "llama"
    gen = json.loads((ASSET / "generation_config.json").read_text())
    assert gen["eos_token_id"] == config["eos_token_id"] and gen["pad_token_id"] == config["pad_token_id"]


def test_tokenizer(tiny):
    tok, model = tiny
    assert tok.padding_side == "left" and tok.chat_template is None
    assert tok.eos_token == "</s>" and tok.pad_token == "<pad>" and tok.pad_token_id != tok.eos_token_id
    assert tok.eos_token_id == model.config.eos_token_id and tok.pad_token_id == model.config.pad_token_id
    ids = tok("37+48=85\n", add_special_tokens=False)["input_ids"]
    assert len(ids) == 9 and tok.decode(ids) == "37+48=85\n"  # one token per character
    assert tok("37+48=")["input_ids"] == tok("37+48=", add_special_tokens=False)["input_ids"]  # no BOS
    batch = tok(["1+2=", "37+48="], padding=True, add_special_tokens=False)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2 and batch["attention_mask"][0][:2] == [0, 0]


def test_greedy_generation_format(tiny, task):
    """Held-out greedy completions are digits then EOS (accuracy is not asserted: it is the point of RL)."""
    tok, model = tiny
    _, held = task.build(num_train=0, num_eval=16, seed=0)
    enc = tok([r["prompt"] for r in held], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=6)
    completion_ids = out[:, enc["input_ids"].shape[1]:]
    texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
    for ids, text in zip(completion_ids.tolist(), texts):
        assert text.isdigit() and 1 <= len(text) <= 3, text
        assert ids[len(text)] == tok.eos_token_id  # the answer ends with EOS, then padding


def test_sampling_with_the_task_stop_string(tiny, task):
    """The trainer passes the task's stop strings to `generate`; transformers' stop-string
    matcher must be able to read this char-level vocabulary."""
    tok, model = tiny
    enc = tok(["37+48=", "5+5="], return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=6,
                             num_return_sequences=4, stop_strings=task.stop, tokenizer=tok)
    assert out.shape[0] == 8
