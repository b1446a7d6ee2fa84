"""The shipped tiny code model (tiny-code) and its code world (tinyrl/assets/code-world).

The world's held-out compositions never appear in train, every row's reference solution passes its
own asserts in the real sandbox while the shortcut the model was pretrained to prefer fails them,
the shipped files are what scripts/make_code_world.py writes, the tokenizer round-trips the plain
prompt and solution of every row exactly (the asserts are not in its vocabulary: the model never
reads them), and a short tiny_code_cpu run trains and logs the sandbox's outcomes. Nothing downloads.
"""

import importlib.util
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from tinyrl.tasks import code_world as cw

ROOT = Path(__file__).resolve().parents[1]
WORLD = Path(str(resources.files("tinyrl.assets") / "code-world"))
MODEL = Path(str(resources.files("tinyrl.assets") / "tiny-code"))


def rows(split: str) -> list[dict]:
    return [json.loads(line) for line in (WORLD / f"{split}.jsonl").read_text().splitlines() if line.strip()]


def test_world_rows_are_mbpp_style_and_held_out_by_composition():
    train, test = rows("train"), rows("test")
    assert len(train) > 500 and len(test) > 50
    for r in train + test:
        assert set(r) >= {"task_id", "text", "test_list", "entry_point"}
        assert len(r["test_list"]) == cw.NUM_TESTS and all(t.startswith(f"assert {r['entry_point']}(") for t in r["test_list"])
        assert f"{r['entry_point']}(" in r["text"]
    train_pairs = {r["composition"] for r in train}
    test_pairs = {r["composition"] for r in test}
    assert not train_pairs & test_pairs
    assert not {r["entry_point"] for r in train} & {r["entry_point"] for r in test}
    # every operation of a held-out pair is trained in the same position: held out is the pairing only
    firsts, seconds = {p.split("+")[0] for p in train_pairs}, {p.split("+")[1] for p in train_pairs}
    assert all(p.split("+")[0] in firsts and p.split("+")[1] in seconds for p in test_pairs)
    assert len({r["task_id"] for r in train + test}) == len(train) + len(test)


def test_shipped_world_is_what_the_script_writes(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_code_world.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for split in ("train", "test"):
        assert (tmp_path / f"{split}.jsonl").read_text() == (WORLD / f"{split}.jsonl").read_text()


def test_reference_solutions_pass_their_asserts_in_the_sandbox_and_the_shortcut_fails():
    from tinyrl.rewards.code import run_completions

    every = rows("train") + rows("test")
    by_code: dict[str, list[str]] = {}  # one sandbox run per composition: its code against all its rows' asserts
    for r in every:
        by_code.setdefault(r["code"], []).extend(r["test_list"])
    codes = list(by_code)
    results = run_completions(codes, [by_code[c] for c in codes], workers=4)
    bad = [(c, res.status, res.score) for c, res in zip(codes, results) if res.status != "ok" or res.score != 1.0]
    assert not bad, bad[:5]
    assert all(len(res.passed) == len(by_code[c]) for c, res in zip(codes, results))
    for r in every:  # our own generated code, run in-process: the shortcut must fail at least one assert
        first, second = (cw.BY_KEY[k] for k in r["composition"].split("+"))
        assert r["code"] == cw.program(first, second)
        scope: dict = {}
        exec(cw.program(first, second, skip_first=True), scope)  # noqa: S102
        with pytest.raises(AssertionError):
            for t in r["test_list"]:
                exec(t, scope)  # noqa: S102


def test_shipped_model_loads_and_its_tokenizer_round_trips_the_world():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinyrl.model.load import resolve_model

    assert Path(resolve_model("tiny-code").path) == MODEL
    tok = AutoTokenizer.from_pretrained(str(MODEL))
    model = AutoModelForCausalLM.from_pretrained(str(MODEL))
    n = sum(p.numel() for p in model.parameters())
    assert 100_000 < n < 1_000_000
    info = json.loads((MODEL / "pretrain_info.json").read_text())
    held = info["held_out"]
    assert held["t1_pass"] > held["greedy_pass@1"] or held["pass@8"] > held["greedy_pass@1"]
    from tinyrl.tasks.code import PLAIN_PROMPT

    for r in rows("test") + rows("train")[:100]:  # what the model reads and writes: the plain prompt, the code
        text = PLAIN_PROMPT.format(text=r["text"], entry_point=r["entry_point"], example="") + r["code"] + "```"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text


needs_task = pytest.mark.skipif(importlib.util.find_spec("tinyrl.tasks.code") is None, reason="the code task is not here")


@needs_task
@pytest.mark.slow
def test_tiny_code_cpu_runs_and_logs_sandbox_outcomes(tmp_path):
    import tinyrl

    run = tinyrl.train("tiny_code_cpu", **{"train.steps": 3, "data.num_eval": 16, "log.run_dir": str(tmp_path),
                                          "log.progress": False})
    assert len(run.metrics) == 3
    for m in run.metrics:
        counts = {k: v for k, v in m.items() if k.startswith("sandbox/") and k != "sandbox/exit_call"}
        assert counts, sorted(m)
        assert sum(counts.values()) == 8 * 8  # every completion of the step has one outcome
    assert run.eval_before is not None and run.eval_after is not None
