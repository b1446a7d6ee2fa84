"""`tinyrl eval` end to end, and prompt data from a jsonl file and through a chat template."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tinyrl.config import DataConfig
from tinyrl.data import load_rows, render_prompt


@pytest.mark.slow
def test_eval_cli_reports_the_same_accuracy_as_the_api_and_the_trainer(tmp_path):
    import tinyrl

    run = tinyrl.train(**{"log.run_dir": str(tmp_path), "log.name": "r", "log.progress": False, "train.steps": 3,
                          "data.num_eval": 40})
    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "eval", "tiny_grpo_cpu", "--adapter", str(run.path),
                          "data.num_eval=40"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("held-out accuracy")][0]
    assert line == f"held-out accuracy (greedy pass@1): {100 * run.eval_after:.1f}%"
    base = tinyrl.evaluate("tiny_grpo_cpu", **{"data.num_eval": 40})
    assert base == pytest.approx(run.eval_before)  # no adapter: the base model's accuracy


def test_eval_cli_missing_adapter_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "eval", "tiny_grpo_cpu", "--adapter",
                          str(tmp_path / "nope")], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr and "nope" in out.stderr


def test_jsonl_rows_split_and_column(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(50)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")  # a blank line is skipped
    cfg = DataConfig(task="jsonl", path=str(path), prompt_column="question", num_train=30, num_eval=5)
    train, held, task = load_rows(cfg)
    assert task is None and len(train) == 30 and len(held) == 5
    assert all(r["prompt"] == r["question"] for r in train + held)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}  # disjoint
    assert load_rows(cfg)[0] == train  # deterministic for a seed
    with pytest.raises(ValueError, match="no 'text' column"):
        load_rows(DataConfig(task="jsonl", path=str(path), prompt_column="text"))


class ChatTok:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class PlainTok:
    chat_template = None


def test_chat_templating_modes():
    auto = DataConfig(system_prompt="Be brief.")
    assert render_prompt(ChatTok(), "2+2?", auto) == "<system>Be brief.<user>2+2?<assistant>"
    assert render_prompt(PlainTok(), "2+2?", auto) == "Be brief.\n2+2?"
    assert render_prompt(ChatTok(), "2+2?", DataConfig(chat_template="never")) == "2+2?"
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(PlainTok(), "2+2?", DataConfig(chat_template="always"))


def test_chat_template_of_a_real_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    assert render_prompt(tok, "1+1=", DataConfig()) == "[user]1+1=[assistant]"
