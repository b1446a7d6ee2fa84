"""Expert demonstrations for an agent's SFT cold start (tinyrl.agents.demonstrations): the search
task's scripted steps, their replay through the run's real tools (the observation is what the
engine itself would splice in, marked), and `sft.data: demonstrations` end to end on the shipped
tiny search model: TRL's labels cover the model's own turns and never the tool's text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tinyrl.agents.demonstrations import Answer, Call
from tinyrl.agents.formats import HermesFormat, SearchR1Format
from tinyrl.config import ConfigError, load_config
from tinyrl.methods import sft_data, sft_trl
from tinyrl.model import load_policy
from tinyrl.tasks import get_task
from tinyrl.tasks.search_qa import demonstrate, world_dir

DEMO = {"sft.data": "demonstrations", "data.num_train": 40, "data.num_eval": 8, "log.progress": False}


def world_rows(split: str) -> list[dict]:
    return [json.loads(line) for line in (Path(world_dir()) / f"{split}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def setup():
    _, cfg = load_config("tiny_search_cpu", DEMO)
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model, cfg.lora)
    return cfg, model, tok, sft_data.agent_for(cfg, tok)


def test_search_qa_demonstrates_one_and_two_hop_questions_from_the_world_table():
    people = {r["metadata"]["entity"]: r for r in world_rows("train") if r["metadata"]["type"] == "teacher"}
    for row in world_rows("train")[:25]:
        steps = demonstrate(row)
        entity = row["metadata"]["entity"]
        queries = [entity] + ([people[entity]["golden_answers"][0]] if row["metadata"]["hops"] == 2 else [])
        assert steps == [Call("search", {"query": q}) for q in queries] + [Answer(row["golden_answers"][0])]
    row = world_rows("test")[0]
    assert demonstrate({**row, "golden_answers": ["not what the world says"]}) is None
    assert demonstrate({"question": "who wrote Hamlet?", "golden_answers": ["Shakespeare"]}) is None
    assert get_task("search_qa").demonstrate is demonstrate and get_task("arithmetic").demonstrate is None


@pytest.mark.parametrize("fmt", [SearchR1Format(), HermesFormat()], ids=lambda f: f.name)
def test_a_written_call_parses_back_to_the_same_call(fmt):
    text = fmt.call_text("search", {"query": "Brenna Tillen"})
    (call,) = fmt.parse(text)
    assert (call.name, call.arguments, call.error) == ("search", {"query": "Brenna Tillen"}, None)
    assert any(text.endswith(s) for s in fmt.stop)  # generation would stop exactly there
    assert fmt.parse(fmt.answer_text("Kelmora")) is None  # the answer is no call


def test_replay_splices_in_the_engines_own_observation_and_marks_it(setup):
    cfg, _, tok, agent = setup
    row = next(r for r in world_rows("train") if r["metadata"]["hops"] == 2)
    steps = demonstrate(row)
    prompt = tok(agent.render(row["question"], cfg.data), add_special_tokens=False)["input_ids"]
    ids, obs = agent.replay(prompt, row, steps, budget=10_000)
    assert len(ids) == len(obs)
    spans, cur = [], []  # the model's turns and the observations, in order
    for i, o in zip(ids, obs):
        if cur and cur[-1][1] != o:
            spans.append(cur)
            cur = []
        cur.append((i, o))
    spans.append(cur)
    assert [s[0][1] for s in spans] == [0, 1, 0, 1, 0]  # call, observation, call, observation, answer
    turns = [[i for i, _ in s] for s in spans[::2]]
    texts = [SearchR1Format().call_text(s.name, s.arguments) if isinstance(s, Call) else f"<answer> {s.text} </answer>"
             for s in steps]
    assert turns[:2] == [tok(t, add_special_tokens=False)["input_ids"] for t in texts[:2]]  # each step encoded alone
    assert turns[2] == tok(texts[2], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    env = agent.env_factory(row)  # the observation is what the real tool answers for that call
    for call_text, span in zip(texts[:2], spans[1::2]):
        expected = agent._observation_ids(env.step(SearchR1Format().parse(call_text)))
        assert [i for i, _ in span] == expected and len(expected) <= cfg.agent.max_obs_tokens
    first_obs = tok.decode([i for i, _ in spans[1]])
    assert row["metadata"]["entity"].split()[0] in first_obs  # the person's document came back
    assert agent.replay(prompt, row, steps, budget=len(ids) - 1) is None  # longer than the budget: no demo


def test_sft_labels_cover_the_models_turns_and_never_the_observation(setup, tmp_path, monkeypatch):
    cfg, model, tok, agent = setup
    monkeypatch.chdir(tmp_path)
    rows = sft_data.sft_rows(cfg)
    assert len(rows) == cfg.data.num_train  # every question of the shipped world can be demonstrated
    dataset = sft_data.tokenize(rows[:4], tok, cfg.data, agent, cfg.rollout.max_new_tokens)
    trainer = sft_trl.make_trainer(cfg, model, tok, dataset, tmp_path / "ckpt")
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    for b, row in enumerate(rows[:4]):
        prompt = tok(agent.render(row["prompt"], cfg.data), add_special_tokens=False)["input_ids"]
        ids, obs = agent.replay(prompt, row["row"], row["steps"], cfg.rollout.max_new_tokens)
        labels = batch["labels"][b].tolist()
        n = len(prompt) + len(ids)
        assert batch["input_ids"][b, :n].tolist() == prompt + ids
        assert labels[: len(prompt)] == [-100] * len(prompt)
        assert labels[len(prompt): n] == [-100 if o else i for i, o in zip(ids, obs)]
        learned = tok.decode([t for t in labels if t != -100])
        assert "<information>" not in learned and "Doc 1" not in learned
        assert learned.count("<search>") == row["row"]["metadata"]["hops"] and "<answer>" in learned


def test_demonstrations_need_an_agent_and_a_task_that_has_them(setup):
    _, cfg = load_config("tiny_sft_cpu", {"sft.data": "demonstrations"})
    with pytest.raises(ConfigError, match="agent.enabled"):
        sft_data.sft_rows(cfg)
    _, cfg = load_config("tiny_search_cpu", {**DEMO, "data.task": "arithmetic", "data.task_args": {}})
    with pytest.raises(ConfigError, match="no expert demonstrations"):
        sft_data.sft_rows(cfg)
    cfg, _, tok, agent = setup
    with pytest.raises(ConfigError, match="rollout.max_new_tokens=8"):
        sft_data.tokenize(sft_data.sft_rows(cfg)[:2], tok, cfg.data, agent, budget=8)


def test_a_demonstration_cold_start_teaches_the_call_format(tmp_path):
    """`stages: [sft]` with demonstrations on the tiny search model, a few steps: the held-out
    evaluation runs multi-turn with the task's tools, and the loss falls."""
    from tinyrl.api import train

    run = train("tiny_search_cpu", **{**DEMO, "stages": ["sft"], "sft.max_steps": 6, "sft.batch_size": 8,
                                      "sft.lr": 1e-3, "log.run_dir": str(tmp_path), "log.name": "demo"})
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["details"]["rows"] == 40 and summary["steps"] == 6
    assert summary["eval_before"] is not None and summary["eval_after"] is not None
    losses = [r["loss"] for r in run.metrics if "loss" in r]
    assert len(losses) == 6 and losses[-1] < losses[0]
