"""The toolkit's real call formats, environments and search tool drive the multi-turn loop
(tinyrl.rollout.agent.AgentEngine) end to end, on a tiny random model: what the loop splices in is
exactly what the real environment answers for the call the model wrote; failures (no tool, bad
JSON, a raising environment) are masked observations, counted, never a crash.

The model is a tiny Llama over a small word-level vocabulary (the tags and the words of a
five-document corpus, so every observation encodes without <unk>), trained for a few steps from
random towards the call shapes so that sampling writes calls, well- and ill-formed."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.conftest import Recording
from tinyrl.agents.environments import build_agent
from tinyrl.agents.formats import HermesFormat
from tinyrl.agents.tools import ToolCall
from tinyrl.config.schema_agent import AgentConfig
from tinyrl.rollout.agent import AgentEngine
from tinyrl.rollout.base import SamplingParams
from tinyrl.rollout.hf import HFEngine

PEOPLE = [("Bales Bavax", "Grisimor", "tailor"), ("Gelo Homak", "Neliton", "baker"),
          ("Sunir Fali", "Helemor", "miner"), ("Duva Reses", "Samemor", "smith"), ("Levin Kenes", "Disuton", "fisher")]
PIECE = r"</?[a-z_]+>|[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A five-person corpus in Search-R1's format, and question rows about it."""
    path = tmp_path_factory.mktemp("world") / "corpus.jsonl"
    docs = [{"id": str(i), "contents": f'"{n}"\n{n} was born in {c}. {n} works as a {j}.'}
            for i, (n, c, j) in enumerate(PEOPLE)]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    rows = [{"question": f"where was {n} born?", "golden_answers": [c], "prompt": f"Question: where was {n} born?\n"}
            for n, c, _ in PEOPLE[:3]]
    return path, docs, rows


@pytest.fixture(scope="module")
def policy(world):
    """A tiny Llama over a word-level tokenizer of the tags, the corpus and the error lines (LoRA on),
    nudged by 60 optimiser steps towards the call shapes (`<search> name </search>`, `<tool_call> ...
    </tool_call>`, `<answer> x </answer>`) so that sampling at T=1 makes calls, good and bad ones."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from tinyrl.agents.formats import SearchR1Format
    from tinyrl.agents.retrieval import BM25Retriever, format_passages
    from tinyrl.agents.tools import ERROR_KINDS, ToolResult, error_text
    from tinyrl.config import LoraConfig, ModelConfig
    from tinyrl.model import load_policy

    _, docs, rows = world
    texts = [d["contents"] for d in docs] + [r["prompt"] for r in rows] + [
        "<search> </search> <answer> </answer> <information> </information> <tool_call> </tool_call>",
        "<tool_response> </tool_response> Doc 1 2 3 ( Title : ) No results . Error : unknown tool . Available tools :"
        " { } name , \" [ ]"] + [error_text(k, ["search"]) for k in ERROR_KINDS] + [error_text("unknown_tool")]
    pieces = sorted({p for t in texts for p in re.findall(PIECE, t)})
    vocab = {t: i for i, t in enumerate(["<pad>", "</s>", "<unk>"] + pieces)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                pre_tokenizers.Split(Regex(PIECE), behavior="isolated")])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                  padding_side="left")
    path = world[0].parent / "model"
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    model = LlamaForCausalLM(cfg)
    fmt, ret = SearchR1Format(), BM25Retriever(docs)
    episodes = []
    for n, c, j in PEOPLE:
        obs = fmt.observation([ToolResult(format_passages(ret.search([n], 2)[0]))])
        episodes.append(f"Question: where was {n} born? <search> {n} </search> {obs} <answer> {c} </answer>")
        episodes.append(f"Question: what does {n} do? <tool_call> {{ \" name \" : \" search \" }} </tool_call> "
                        f"<answer> {j} </answer>")
    enc = [tok(e, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for e in episodes]
    width = max(map(len, enc))
    ids = torch.tensor([e + [tok.pad_token_id] * (width - len(e)) for e in enc])
    labels = ids.masked_fill(ids == tok.pad_token_id, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):  # short of memorising: samples still wander
        model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(path)
    return load_policy(ModelConfig(name=str(path)), LoraConfig(r=4, alpha=8))



def make_agent(policy, world, **agent):
    """AgentEngine built the way a run builds it: `build_agent(cfg.agent, task)` gives the format and the
    environment factory; the AgentConfig itself is the loop's `agent_cfg`."""
    model, tok = policy
    cfg = AgentConfig(enabled=True, corpus=str(world[0]), top_k=2, max_obs_tokens=200, **agent)
    setup = build_agent(cfg)
    inner = Recording(HFEngine(model, tok, seed=0))
    return AgentEngine(inner, tok, setup.format, setup.make_env, cfg), setup, inner


def segments(batch, i):
    """[(is_observation, ids)] runs of row i's completion."""
    n = int(batch.completion_mask[i].sum())
    ids, obs = batch.completion_ids[i, :n].tolist(), batch.observation_mask[i, :n].tolist()
    out = []
    for t, o in zip(ids, obs):
        if not out or out[-1][0] != o:
            out.append((o, []))
        out[-1][1].append(t)
    return out


PARAMS = SamplingParams(max_new_tokens=120)


def test_search_r1_with_the_search_tool_end_to_end(policy, world):
    _, tok = policy
    _, _, rows = world
    eng, setup, inner = make_agent(policy, world)
    b = eng.generate([r["prompt"] for r in rows], n=4, params=PARAMS, columns=rows)
    assert b.num_rows == 12
    calls = sum(t["tool_calls"] for t in b.trajectories)
    assert calls >= 3, "the random model made almost no search call: the test sees nothing"
    sampled = {tuple(s.token_ids) for s in inner.samples}
    answered_by_search = 0
    for i, info in enumerate(b.trajectories):
        segs = segments(b, i)
        model_turns = [ids for o, ids in segs if not o]
        assert all(tuple(ids) in sampled for ids in model_turns)  # the sampled ids, verbatim
        assert len(model_turns) == info["turns"]
        observations = [ids for o, ids in segs if o]
        logged = [e for e in info["turn_log"] if e["role"] == "assistant" and "calls" in e]
        assert len(observations) == len(logged) == info["tool_calls"]
        for entry, obs_ids in zip(logged, observations):
            # the observation is the real environment's answer to the call the model wrote, tokenised alone
            (call,) = setup.format.parse(entry["text"])
            assert entry["calls"] == [{"name": "search", "arguments": call.arguments}]
            env = setup.make_env(rows[i // 4])
            expected = tok(setup.format.observation(env.step([call]), tok), add_special_tokens=False)["input_ids"]
            assert obs_ids == expected[: len(obs_ids)]
            text = tok.decode(obs_ids)
            assert text.startswith("<information>")
            if call.error is None and env.step([call])[0].text.startswith("Doc 1"):
                answered_by_search += 1
        assert info["tool_calls"] <= 4
        assert (b.loss_mask[i] * b.observation_mask[i]).sum() == 0
        assert (b.sampling_logprobs[i][b.observation_mask[i].bool()] == 0).all()
        assert int(b.completion_mask[i].sum()) <= PARAMS.max_new_tokens
    assert answered_by_search > 0, "no call retrieved a document: the search tool was never exercised"
    # what the trainer scores is the decoded completion (model turns and observations in order)
    assert any("<information>" in c for c in b.completions)


def test_search_disabled_every_call_is_an_unknown_tool_observation(policy, world):
    _, tok = policy
    _, _, rows = world
    eng, setup, _ = make_agent(policy, world, tools=[])
    assert setup.format.stop == ["</search>"]  # <search> still ends a turn: the call reaches no tool
    b = eng.generate([r["prompt"] for r in rows], n=4, params=PARAMS, columns=rows)
    made = [t for t in b.trajectories if t["tool_calls"]]
    assert made
    expected = tok.decode(tok(setup.format.observation(setup.make_env({}).step([ToolCall("search", {"query": "x"})])),
                              add_special_tokens=False)["input_ids"])
    assert "Error : unknown tool . Available tools : none ." in expected
    for i, t in enumerate(b.trajectories):
        assert t["tool_errors"] == t["tool_calls"]  # each call counted as an error ...
        for o, ids in segments(b, i):
            if o:  # ... and answered with the same fixed observation
                assert tok.decode(ids) in (expected, tok.decode(tok(setup.format.observation(
                    setup.make_env({}).step([ToolCall("search", {}, error="empty <search>")])),
                    add_special_tokens=False)["input_ids"]))
        errors = [e for e in t["turn_log"] if e["role"] == "tool"]
        assert all(e["errors"] and set(e["errors"]) <= {"unknown_tool", "parse_error"} for e in errors)


def test_hermes_unreadable_calls_are_parse_error_observations(policy, world):
    _, tok = policy
    _, _, rows = world
    eng, setup, _ = make_agent(policy, world, format="hermes")
    assert isinstance(setup.format, HermesFormat) and setup.format.stop == ["</tool_call>"]
    prompts = [f"Question: what does {n} do?" for n, _, _ in PEOPLE[:3]]  # the model's tool_call prompts
    b = eng.generate(prompts, n=6, params=PARAMS, columns=rows)
    calls = [t for t in b.trajectories if t["tool_calls"]]
    assert calls, "the model never closed a <tool_call>"
    for i, t in enumerate(b.trajectories):
        for e in t["turn_log"]:
            if e["role"] == "tool":  # word-level text is never the JSON of a call: each call is a parse error
                assert set(e["errors"]) == {"parse_error"}
                assert "Error : the tool call could not be parsed ." in e["text"] and "<tool_response>" in e["text"]
        assert t["tool_errors"] == t["tool_calls"]
        assert (b.loss_mask[i] * b.observation_mask[i]).sum() == 0


def test_a_raising_environment_does_not_stop_the_loop(policy, world):
    _, _, rows = world
    eng, _, _ = make_agent(policy, world, tools=[], environment="tests.agents.test_environments:Broken")
    b = eng.generate([r["prompt"] for r in rows], n=4, params=PARAMS, columns=rows)
    made = [t for t in b.trajectories if t["tool_calls"]]
    assert made and all(t["tool_errors"] == t["tool_calls"] for t in b.trajectories)
    assert all(set(e["errors"]) <= {"exception", "parse_error"}
               for t in made for e in t["turn_log"] if e["role"] == "tool")


def test_logprobs_match_the_trainer_on_real_format_trajectories(policy, world):
    from tinyrl.update import score

    model, _ = policy
    _, _, rows = world
    eng, _, _ = make_agent(policy, world)
    b = eng.generate([r["prompt"] for r in rows], n=4, params=PARAMS, columns=rows)
    assert b.observation_mask.any()
    s = score(model, b, 1.0, micro_batch=4, chunk_size=16, impl="torch")
    m = b.action_mask.bool()
    assert torch.allclose(s.logprobs[m], b.sampling_logprobs[m], atol=1e-4)
