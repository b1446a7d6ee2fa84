"""The agent wired into a run: `agent.enabled` makes the trainer and `tinyrl.evaluate` roll out
multi-turn episodes against the real `search` tool (bm25 over the shipped search world).

The policy is a random Llama over a printable-ASCII tokenizer, so it never writes
`</search>` by chance; a call format registered for the test ends a tool call at any of a few
characters (which the flat random head emits often) and searches for the words of a fixed query
(random text would match no document). Everything after the parse is the real path: toolbox,
retriever, environment factory, AgentEngine, the trainer's masks, metrics and samples.
"""

import json
from pathlib import Path

import pytest

import tinyrl
from tests.conftest import make_char_model
from tinyrl.agents.formats import FORMATS
from tinyrl.agents.tools import ToolCall


class BracketFormat:
    """A turn ending in "]" or one of six lowercase letters calls search; "!" ends the episode."""

    name = "bracket"

    def __init__(self, tool_names=None, arguments=None):
        self.stop, self.final = ["]", "a", "e", "i", "o", "s", "t"], ["!"]

    def parse(self, text):
        return [ToolCall("search", {"query": "Bales Bavax taught"}, text[-4:])]

    def observation(self, results, tokenizer=None):
        return "<information>" + " ".join(r.text for r in results) + "</information>"

    def instructions(self, toolbox, tokenizer=None):
        return None


@pytest.fixture(autouse=True)
def bracket_format(monkeypatch):
    monkeypatch.setitem(FORMATS, "bracket", BracketFormat)


@pytest.fixture(scope="module")
def char_model(tmp_path_factory):
    return make_char_model(tmp_path_factory.mktemp("char-random-agent"), max_positions=1024)  # the agent prompt (612 chars) + 96 new tokens fit


def overrides(model, root, **more):
    o = {"model.name": model, "log.run_dir": str(root), "log.name": "agent", "log.progress": False,
         "data.task": "search_qa", "data.num_train": 8, "data.num_eval": 4, "data.chat_template": "never",
         "agent.enabled": True, "agent.format": "bracket", "agent.max_turns": 2, "agent.max_obs_tokens": 64,
         "rollout.max_new_tokens": 96, "rollout.temperature": 1.0, "train.steps": 2, "train.prompts_per_step": 2,
         "rollout.num_generations": 2, "train.micro_batch_size": 4, "train.eval_before_after": False,
         "lora.r": 4, "lora.alpha": 8}
    return {**o, **more}


def test_a_run_with_the_agent_on_calls_the_search_tool_and_masks_what_it_returns(char_model, tmp_path):
    run = tinyrl.train(**overrides(char_model, tmp_path))
    rows = [json.loads(x) for x in (Path(run.path) / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert all(r["tool_calls_per_traj"] > 0 for r in rows), rows
    assert all(0 < r["obs_token_frac"] < 1 for r in rows), rows
    samples = [json.loads(x) for x in (Path(run.path) / "samples.jsonl").read_text().splitlines()]
    observed = [s for s in samples if "<information>" in s["completion"]]
    assert observed, samples[:2]
    assert any("Doc 1(Title:" in s["completion"] for s in observed)  # passages of the shipped world's corpus
    assert all("turns" in s for s in samples)


def test_the_trainer_masks_observation_tokens_out_of_the_loss(char_model, tmp_path):
    from tinyrl.api import build_trainer

    trainer = build_trainer(overrides=overrides(char_model, tmp_path))
    try:
        batch, _ = trainer.collect_batch()
    finally:
        trainer.run.unlock()
    obs = batch.observation_mask.bool()
    assert obs.any()
    assert not (batch.loss_mask.bool() & obs).any()  # no observation token is trained on
    assert (batch.sampling_logprobs[obs] == 0).all()  # nothing was sampled there
    assert ((batch.loss_mask.bool() | obs) == batch.completion_mask.bool()).all()


def test_evaluate_reports_em_f1_and_tool_use_for_an_agent_preset(char_model, tmp_path):
    report = tinyrl.evaluate(report=True, **overrides(char_model, tmp_path))
    assert report.n == 4
    assert set(report.scores) == {"em", "f1"}
    assert report.agent["tool_calls_per_question"] > 0
    assert 0 <= report.agent["tool_error_rate"] <= 1
