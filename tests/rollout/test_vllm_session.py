"""Decode sessions on the vLLM engine (vLLM's CPU build, in .venv-vllm; skipped where vllm is missing).

The engine is the one tests/rollout/test_vllm_engine.py builds (its fixtures, imported): a trainer
with rollout.engine=vllm on a tiny random Llama.
"""

import pytest

pytest.importorskip("vllm")

from tests.rollout.test_decode_session import run  # noqa: E402
from tests.rollout.test_vllm_engine import PROMPTS, trainer, vllm, vllm_model_dir  # noqa: E402, F401, F811  (fixtures)
from tinyrl.rollout.base import SamplingParams  # noqa: E402

EXTRA = ["5+5=", "12+7=", "3", "88+11="]


def ids(tr, texts):
    return [tr.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "streams"])
def test_a_session_joined_before_its_first_step_draws_what_sample_draws(trainer, greedy):  # noqa: F811
    eng = trainer.engine
    ctx = ids(trainer, PROMPTS + EXTRA)
    p = SamplingParams(max_new_tokens=10, stream=None if greedy else 5)
    n = 1 if greedy else 2  # vLLM refuses n > 1 under greedy decoding
    want = eng.sample(ctx, p, n=n, greedy=greedy)
    with eng.session(p, greedy) as s:
        got = run(s, {0: [(i, c, 10, n, None if greedy else 5 + i) for i, c in enumerate(ctx)]})
    assert len(got) == n * len(ctx)
    for i, group in enumerate(want):
        for j, w in enumerate(group):
            assert got[i, j].token_ids == w.token_ids and got[i, j].finish == w.finish
            assert got[i, j].logprobs == pytest.approx(w.logprobs, abs=1e-5)


def test_requests_joining_a_running_batch_decode_as_if_alone(trainer):  # noqa: F811
    eng = trainer.engine
    ctx = ids(trainer, PROMPTS + EXTRA)
    p = SamplingParams(max_new_tokens=12)
    plan = {0: [("a", ctx[0], 3), ("b", ctx[1], 12)], 3: [("c", ctx[2], 8), ("d", ctx[3], 6)],
            7: [("e", ctx[4], 5), ("f", ctx[5], 12)], 30: [("g", ctx[6], 4)]}
    live_at = {}
    with eng.session(p, greedy=True) as s:
        got = run(s, plan, live_at)
    assert len(got) == 7 and live_at[3] > 0 and live_at[30] == 0  # joined a running batch, and an empty one
    for key, context, budget in (a for adds in plan.values() for a in adds):
        alone = eng.sample([context], p, greedy=True, max_new=[budget])[0][0]
        assert got[key, 0].token_ids == alone.token_ids and got[key, 0].finish == alone.finish
        assert got[key, 0].logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_pause_aborts_the_requests_and_returns_their_tokens_so_far(trainer):  # noqa: F811
    eng = trainer.engine
    p = SamplingParams(max_new_tokens=12)
    full = {c: eng.sample([c], p, greedy=True)[0][0] for c in map(tuple, ids(trainer, PROMPTS + EXTRA))}
    long = [c for c, smp in full.items() if len(smp.token_ids) >= 5]
    assert long, "no greedy completion of 5+ tokens to pause"
    with eng.session(p, greedy=True) as s:
        s.add("a", list(long[0]), 12)
        for _ in range(3):
            assert s.step() == []
        s.add("q", list(long[0]), 12, 2)  # two samples, greedy: two requests of n = 1
        paused = {(k, j): smp for k, j, smp in s.pause()}
        assert len(s) == 0 and s.step() == []
    assert not eng.llm.llm_engine.has_unfinished_requests()  # aborted in vLLM too
    assert set(paused) == {("a", 0), ("q", 0), ("q", 1)} and all(x.finish == "paused" for x in paused.values())
    part, want = paused["a", 0], full[long[0]]
    assert 0 < len(part.token_ids) < len(want.token_ids) and part.token_ids == want.token_ids[:len(part.token_ids)]
    assert part.logprobs == pytest.approx(want.logprobs[:len(part.token_ids)], abs=1e-4)
    assert all(x.token_ids == want.token_ids[:len(x.token_ids)] for x in (paused["q", 0], paused["q", 1]))
    rest = eng.sample([list(long[0]) + part.token_ids], p, greedy=True, max_new=[12 - len(part.token_ids)])[0][0]
    assert part.token_ids + rest.token_ids == want.token_ids


def test_one_session_at_a_time_and_no_sample_inside_it(trainer):  # noqa: F811
    """A session's requests share vLLM's queue with everything else: LLM.generate (sample) would step
    them to the end and drop their outputs, a second session would take the first one's outputs."""
    eng = trainer.engine
    with eng.session(SamplingParams(max_new_tokens=4), greedy=True) as s:
        s.add("a", ids(trainer, PROMPTS[:1])[0], 4)
        with pytest.raises(RuntimeError, match="one decode session at a time"):
            with eng.session(SamplingParams()):
                pass
        with pytest.raises(RuntimeError, match="inside an open session"):
            eng.sample(ids(trainer, PROMPTS[:1]), SamplingParams(max_new_tokens=4))
        assert len(s) == 1
    assert not eng.llm.llm_engine.has_unfinished_requests()  # the exit aborted what was still running
    assert eng.sample(ids(trainer, PROMPTS[:1]), SamplingParams(max_new_tokens=4), greedy=True)[0][0].token_ids
