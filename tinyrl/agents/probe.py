"""A reference multi-turn sampler, to measure an agent: EM, pass@k, searches and turns per question.

This is not the training loop (that is `tinyrl.rollout.agent`, batched and exact about token ids
and masks); it is the smallest honest sampler of the same protocol, for checking a model before
and after training: the model generates until a stop string of the call format (or a final one,
EOS, or the budget), the environment answers the turn's calls, the observation's tokens are
appended, and generation continues, up to `max_turns` turns. One `model.generate` call per turn
for all live trajectories; the context is re-read each turn (no KV reuse).

>>> # probe(model, tok, rows, setup, n=8)  ->  {"greedy_em": ..., "pass@8": ..., "searches": ...}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tinyrl.agents.environments import AgentSetup, safe_step
from tinyrl.rewards.qa import em_check, extract_answer


@dataclass
class Episode:
    row: dict
    ids: list[int]  # completion token ids: model tokens and observation tokens, in order
    obs_mask: list[int]  # 1 on observation tokens
    text: str = ""  # the decoded completion (model turns and observations)
    turns: int = 0
    calls: list[str] = field(default_factory=list)  # tool name per call
    tool_errors: int = 0
    done: bool = False

    @property
    def answer(self) -> str | None:
        return extract_answer(self.text)

    @property
    def correct(self) -> bool:
        return em_check(self.answer, self.row.get("golden_answers"))


class _StopOnNewText:
    """Stop a row once the text it generated in this call contains a stop string."""

    def __init__(self, tokenizer, stop: list[str], start: int):
        self.tokenizer, self.stop, self.start = tokenizer, stop, start

    def __call__(self, input_ids, scores, **kwargs):
        texts = self.tokenizer.batch_decode(input_ids[:, self.start:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def _generate_turn(model, tokenizer, contexts: list[list[int]], stop: list[str], max_new: int,
                   greedy: bool, temperature: float) -> list[list[int]]:
    """One turn for each context: the sampled ids, up to and including the stop / EOS."""
    from transformers import StoppingCriteriaList

    pad = tokenizer.pad_token_id
    width = max(map(len, contexts))
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    attn = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    out = model.generate(
        input_ids=ids, attention_mask=attn, max_new_tokens=max_new, do_sample=not greedy,
        temperature=None if greedy else temperature, top_k=None if greedy else 0, top_p=None if greedy else 1.0,
        stopping_criteria=StoppingCriteriaList([_StopOnNewText(tokenizer, stop, width)]),
        pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
    turns = []
    for row in out[:, width:].tolist():
        kept = []
        for t in row:
            kept.append(t)
            text = tokenizer.decode(kept, skip_special_tokens=True)
            if t == tokenizer.eos_token_id or any(s in text for s in stop):
                break
        while kept and kept[-1] == pad and pad != tokenizer.eos_token_id:
            kept.pop()
        turns.append(kept)
    return turns


def run_episodes(model, tokenizer, rows: list[dict], setup: AgentSetup, n: int = 1, greedy: bool = False,
                 temperature: float = 1.0, max_turns: int = 4, max_new_tokens: int = 256,
                 max_obs_tokens: int = 256, turn_tokens: int = 64, seed: int = 0) -> list[Episode]:
    """Run n episodes per row (prompt-major); each row needs a rendered prompt in `rendered`."""
    fmt = setup.format
    stop = list(fmt.stop) + list(fmt.final)
    eps = [Episode(r, [], []) for r in rows for _ in range(n)]
    envs = [setup.make_env(e.row) for e in eps]
    prompts = [_encode(tokenizer, e.row["rendered"]) for e in eps]
    was_training = model.training
    model.eval()
    gen = torch.random.fork_rng()
    gen.__enter__()
    torch.manual_seed(seed)
    try:
        for _ in range(max_turns):
            live = [i for i, e in enumerate(eps) if not e.done and len(e.ids) < max_new_tokens]
            if not live:
                break
            budget = min(turn_tokens, max_new_tokens - min(len(eps[i].ids) for i in live))
            turns = _generate_turn(model, tokenizer, [prompts[i] + eps[i].ids for i in live], stop, budget,
                                   greedy, temperature)
            calls_of = {}
            for i, new in zip(live, turns):
                e = eps[i]
                new = new[: max_new_tokens - len(e.ids)]
                e.ids += new
                e.obs_mask += [0] * len(new)
                e.turns += 1
                turn_text = tokenizer.decode(new, skip_special_tokens=True)
                e.text += turn_text
                calls = fmt.parse(turn_text)
                ended = (not new or new[-1] == tokenizer.eos_token_id or calls is None
                         or len(e.ids) >= max_new_tokens)
                if ended:
                    e.done = True
                else:
                    calls_of[i] = calls
            for i, calls in calls_of.items():
                e = eps[i]
                results = safe_step(envs[i], calls)
                e.calls += [c.name for c in calls]
                e.tool_errors += sum(r.error is not None for r in results)
                obs = _encode(tokenizer, fmt.observation(results, tokenizer))[:max_obs_tokens]
                obs = obs[: max_new_tokens - len(e.ids)]
                e.ids += obs
                e.obs_mask += [1] * len(obs)
                e.text += tokenizer.decode(obs, skip_special_tokens=True)
    finally:
        gen.__exit__(None, None, None)
        model.train(was_training)
    return eps


def summarize(eps: list[Episode], n: int) -> dict:
    """EM (mean over episodes), pass@n (any correct among a row's n), calls / turns / errors per episode."""
    rows = len(eps) // n
    hits = [sum(e.correct for e in eps[i * n:(i + 1) * n]) for i in range(rows)]
    mean = lambda xs: sum(xs) / len(xs) if xs else math.nan  # noqa: E731
    return {
        "em": mean([e.correct for e in eps]),
        f"pass@{n}": mean([h > 0 for h in hits]),
        "searches": mean([e.calls.count("search") for e in eps]),
        "calls": mean([len(e.calls) for e in eps]),
        "turns": mean([e.turns for e in eps]),
        "tool_error_rate": sum(e.tool_errors for e in eps) / max(1, sum(len(e.calls) for e in eps)),
        "answered": mean([e.answer is not None for e in eps]),
        "obs_token_frac": sum(sum(e.obs_mask) for e in eps) / max(1, sum(len(e.ids) for e in eps)),
    }


def probe(model, tokenizer, rows: list[dict], setup: AgentSetup, n: int = 8, temperature: float = 1.0,
          by: str | None = None, **kw) -> dict:
    """Greedy EM and searches, and EM / pass@n at `temperature`, over `rows` (optionally per `by` group)."""
    greedy = run_episodes(model, tokenizer, rows, setup, n=1, greedy=True, **kw)
    sampled = run_episodes(model, tokenizer, rows, setup, n=n, temperature=temperature, **kw)
    out = {"greedy": summarize(greedy, 1), "sampled": summarize(sampled, n)}
    if by is not None:
        groups: dict = {}
        for i, r in enumerate(rows):
            groups.setdefault(_group(r, by), []).append(i)
        out["by_" + by] = {g: {"greedy_em": summarize([greedy[i] for i in idx], 1)["em"],
                               **summarize([sampled[i * n + j] for i in idx for j in range(n)], n)}
                           for g, idx in sorted(groups.items(), key=lambda kv: str(kv[0]))}
    return out


def _group(row: dict, key: str):
    return row.get(key, (row.get("metadata") or {}).get(key))
