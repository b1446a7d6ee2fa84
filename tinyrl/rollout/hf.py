"""The transformers rollout engine: the training model itself, with tinyrl's own decode loop.

The CPU path and the fallback everywhere. Why its own loop and not `model.generate`: a GRPO
rollout needs the exact sampled ids, the logprob of each under the sampling distribution,
per-row token budgets and stop strings (the agent's `</search>`), and it runs every step, so
generate's per-step machinery (logits processors, stopping criteria over the whole sequence,
full-vocabulary score copies) is overhead. The loop here does per step: one decoder step over
the live rows, the lm_head on their last position only, one log-softmax (the recorded logprob
and the sampling distribution are the same tensor), a draw from a seeded generator, and drops
finished rows from the batch and the KV cache, so short answers stop costing compute.

On a CPU the LoRA-adapted linears decode as one matmul over W + dW each, and 4-bit linears over a
copy dequantised once per call (`model.merged_lora_linears`, rebuilt each call from the current
adapter, copies within an eighth of the RAM; the base weights are not touched), and a
Llama-shaped decoder's step runs written out (`rollout.decode_step`).

Each context is read once: the contexts' first L-1 tokens are prefilled into a KV cache that is
repeated n times (prompt-major rows), then decoding starts from each context's last token. A
prefix common to the contexts is prefilled once where that saves enough (`model.prompt_cache`).
When the caller names a stream (`params.stream`; the trainer: the prompt's position in the run's
prompt stream), context i samples from its own generator seeded by (`seed`, stream + i), so a prompt
draws the same samples in whichever batch or process it lands; else one generator per call
(`seed`, `calls`).
A resumed run draws the same samples; the global torch RNG is not touched.

The loop is a session (`HFEngine.session`, `HFSession`): contexts may join the running batch at any
step (a multi-turn episode whose tool call returned; prefilled once, their cache stacked onto the
live one with left padding), and `pause` ends every row with its tokens so far. `sample` is a
session whose contexts all join before its first step.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tinyrl.model.forward import cache_kwarg, lm_head_of, merged_lora_linears, output_projection, prompt_cache, trunk_of
from tinyrl.rollout.base import Sample, SamplingParams, StopStrings, pad_to, stream_seed
from tinyrl.rollout.decode_step import DecodeStep
from tinyrl.rollout.engine import SamplingEngine


class HFEngine(SamplingEngine):
    """Generate with the (peft) training model; `sync` is a no-op: it *is* the trained model."""

    def __init__(self, model, tokenizer, seed: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.seed = seed
        self.calls = 0  # sampling seed position; saved in checkpoints

    @torch.no_grad()
    def sample(self, contexts: list[list[int]], params: SamplingParams, n: int = 1, greedy: bool = False,
               max_new: list[int] | None = None) -> list[list[Sample]]:
        """Every context joins one session before its first step, which then runs until every row ended."""
        budgets = max_new if max_new is not None else [params.max_new_tokens] * len(contexts)
        out: list[list[Sample]] = [[None] * n for _ in contexts]
        with self.session(params, greedy) as s:
            for i, (c, m) in enumerate(zip(contexts, budgets)):
                s.add(i, c, m, n, stream=None if params.stream is None else params.stream + i)
            while len(s):
                for i, j, smp in s.step():
                    out[i][j] = smp
        return out

    @contextlib.contextmanager
    def session(self, params: SamplingParams, greedy: bool = False) -> Iterator[HFSession]:
        """A decode session (`rollout.session.DecodeSession`): contexts join its running batch at any
        step. Holds eval mode and the merged LoRA linears for its duration; the training mode after."""
        was_training = self.model.training
        self.model.eval()
        try:
            with merged_lora_linears(self.model, dequantize=True):
                yield HFSession(self, params, greedy)
        finally:
            self.model.train(was_training)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def release(self) -> None:
        pass

    def sync(self, model) -> None:
        self.model = model

    def bound_to(self, model) -> "HFEngine":
        """This engine over `model` (another copy of the policy), at the same sampling position."""
        out = HFEngine(model, self.tokenizer, seed=self.seed)
        out.calls = self.calls
        return out

    def state_dict(self) -> dict:
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.calls = state["seed"], state["calls"]


def _prefill(trunk, tok, contexts: list[list[int]], n: int, device):
    """KV cache of each context but its last token, repeated n times; (cache, attention mask, last
    tokens [R, 1], their positions [R]) for R = len(contexts) * n rows. Left padding."""
    L = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), L), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(contexts), L), dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, L - len(c):] = torch.tensor(c, dtype=torch.long)
        attn[i, L - len(c):] = 1
    ids, attn = ids.to(device), attn.to(device)
    cache, cols = prompt_cache(trunk, ids[:, :-1], attn[:, :-1], decode_cache())
    make = getattr(cache, "layer_class_to_replicate", None)
    while make is not None and len(cache.layers) < trunk.config.num_hidden_layers:  # one-token contexts:
        cache.layers.append(make())  # nothing prefilled, and `DecodeStep` updates layers by index
    attn = torch.cat([cols, attn[:, -1:]], 1)  # the cache's real columns (a shared prefix moves the padding)
    if n > 1 and L > 1:
        cache.batch_repeat_interleave(n)
    last_pos = torch.tensor([len(c) - 1 for c in contexts], device=device)
    return (cache, attn.repeat_interleave(n, 0), ids[:, -1:].repeat_interleave(n, 0),
            last_pos.repeat_interleave(n))


@dataclass
class _Row:
    key: Any
    j: int  # sample j of context `key`
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class HFSession:
    """The HF engine's `DecodeSession`: one decode loop whose batch rows may join at any step.

    A step admits the queued contexts (one prefill of theirs, `_prefill`, its cache joined to the
    live one: the shorter left-padded with masked columns, then stacked by rows), runs one decoder
    step over every live row, draws, and drops the rows that ended from the batch and the cache.
    Between steps the state is: cache [R, ., C, .], attn [R, C + 1] (the pending token's column
    last), cur [R, 1] (the token the next step reads), pos [R], left [R] (tokens still allowed),
    owner [R] (the generator of each row: 0 the session's own, else its context's stream)."""

    def __init__(self, engine: HFEngine, params: SamplingParams, greedy: bool):
        model, self.device = engine.model, engine.device
        self.tok, self.params, self.greedy = engine.tokenizer, params, greedy
        self.trunk, self.head = trunk_of(model), _vocab_projection(model)
        self.step_fn = _step_function(self.trunk, self.device)
        self.stops = StopStrings(self.tok, params.stop)
        self.temperature = 1.0 if greedy else params.temperature
        self.seed = engine.seed
        self.gens = [torch.Generator(device=self.device).manual_seed(engine.seed * 1_000_003 + engine.calls)]
        engine.calls += 1
        self.queue: list[tuple[Any, list[int], int, int, int]] = []  # key, context, max_new, n, generator
        self._clear()

    def _clear(self) -> None:
        self.rows: list[_Row] = []
        self.cache = self.attn = self.cur = self.pos = self.left = self.owner = None

    def __len__(self) -> int:
        return len(self.rows) + sum(q[3] for q in self.queue)

    def add(self, key, context: list[int], max_new: int, n: int = 1, stream: int | None = None) -> None:
        gen = 0
        if stream is not None:  # as `sample`: the context's own generator, keyed by its stream
            self.gens.append(torch.Generator(device=self.device).manual_seed(stream_seed(self.seed, "prompt", stream)))
            gen = len(self.gens) - 1
        self.queue.append((key, list(context), int(max_new), n, gen))

    @torch.no_grad()
    def step(self) -> list[tuple[Any, int, Sample]]:
        ended = self._admit()
        if not self.rows:
            return ended
        self.attn = torch.cat([self.attn, self.attn.new_ones(self.attn.shape[0], 1)], 1)
        h = self.step_fn(self.cur, self.attn, self.pos, self.cache)
        logp = torch.log_softmax(self.head(h).float() / self.temperature, -1)
        if self.greedy:
            nxt = logp.argmax(-1)
        else:
            nxt = _draw_per_context(logp, self.params.top_p, self.gens, self.owner)
        chosen = logp.gather(-1, nxt[:, None]).squeeze(-1)
        self.left -= 1
        for row, t, lp in zip(self.rows, nxt.tolist(), chosen.tolist()):
            row.ids.append(t)
            row.logprobs.append(lp)
        done = nxt.cpu() == self.tok.eos_token_id
        why = ["eos" if d else None for d in done.tolist()]
        if self.stops:
            for j, hit in enumerate(self.stops.hit([row.ids for row in self.rows])):
                if hit and why[j] is None:
                    why[j], done[j] = "stop", True
        done |= self.left <= 0
        ended += [(row.key, row.j, Sample(row.ids, row.logprobs, why[j] or "length"))
                  for j, row in enumerate(self.rows) if done[j]]
        self.cur, self.pos = nxt[:, None], self.pos + 1
        if done.any():
            self._keep(torch.nonzero(~done).squeeze(-1))
        return ended

    def pause(self) -> list[tuple[Any, int, Sample]]:
        out = [(row.key, row.j, Sample(row.ids, row.logprobs, "paused")) for row in self.rows]
        out += [(key, j, Sample([], [], "paused")) for key, _, _, n, _ in self.queue for j in range(n)]
        self.queue = []
        self._clear()
        return out

    def _keep(self, keep: torch.Tensor) -> None:
        """Only rows `keep` stay in the batch (and its cache)."""
        if keep.numel() == 0:
            return self._clear()
        dev = keep.to(self.device)
        self.cache.batch_select_indices(dev)
        self.rows = [self.rows[j] for j in keep.tolist()]
        self.left, self.owner = self.left[keep], self.owner[keep]
        self.attn, self.cur, self.pos = self.attn[dev], self.cur[dev], self.pos[dev]

    def _admit(self) -> list[tuple[Any, int, Sample]]:
        """Prefill the queued contexts and join them to the live batch; a context with no token budget
        ends here, with no tokens."""
        queue, self.queue = self.queue, []
        ended = [(key, j, Sample([], [], "length")) for key, _, m, n, _ in queue if m <= 0 for j in range(n)]
        queue = [q for q in queue if q[2] > 0 and q[3] > 0]
        if not queue:
            return ended
        by_n: dict[int, list] = {}  # `_prefill` repeats each context n times: one prefill per distinct n
        for q in queue:
            by_n.setdefault(q[3], []).append(q)
        for n, group in by_n.items():
            cache, attn, cur, pos = _prefill(self.trunk, self.tok, [q[1] for q in group], n, self.device)
            rows = [_Row(key, j) for key, _, _, _, _ in group for j in range(n)]
            left = torch.tensor([q[2] for q in group]).repeat_interleave(n)
            owner = torch.tensor([q[4] for q in group]).repeat_interleave(n)
            self._join(rows, cache, attn, cur, pos, left, owner)
        return ended

    def _join(self, rows, cache, attn, cur, pos, left, owner) -> None:
        if not self.rows:
            self.rows, self.cache, self.attn, self.cur, self.pos, self.left, self.owner = \
                rows, cache, attn, cur, pos, left, owner
            return
        width = max(self.attn.shape[1], attn.shape[1])
        join_caches(self.cache, cache, len(self.rows), len(rows))
        self.attn = torch.cat([pad_to(self.attn, width, left=True), pad_to(attn, width, left=True)])
        self.rows = self.rows + rows
        self.cur, self.pos = torch.cat([self.cur, cur]), torch.cat([self.pos, pos])
        self.left, self.owner = torch.cat([self.left, left]), torch.cat([self.owner, owner])


def join_caches(live, new, live_rows: int, new_rows: int) -> None:
    """Append `new`'s rows to the cache `live` (in place), layer by layer: the keys and values of the
    shorter left-padded with zeros to the longer (the attention mask's padding columns hide them),
    then stacked along the batch axis. `new` may be empty (its contexts had one token each); `live`
    must hold keys (its rows have decoded)."""
    if not hasattr(live, "layers"):
        raise NotImplementedError("joining rows to a running decode batch needs transformers' cache layers "
                                  "(DynamicCache.layers, transformers >= 4.56); upgrade transformers")
    length = max(live.get_seq_length(), new.get_seq_length())
    for i, layer in enumerate(live.layers):
        other = new.layers[i] if i < len(new.layers) and new.layers[i].get_seq_length() else None
        parts = []
        for name in ("keys", "values"):
            mine = getattr(layer, name)
            theirs = getattr(other, name) if other is not None else mine.new_zeros(new_rows, *mine.shape[1:-2], 0,
                                                                                   mine.shape[-1])
            parts.append(torch.cat([pad_to(mine, length, left=True, dim=-2),
                                    pad_to(theirs, length, left=True, dim=-2)]))
        if hasattr(layer, "replace"):
            layer.replace(*parts)
        else:  # transformers' plain DynamicLayer
            layer.keys, layer.values = parts


def _step_function(trunk, device):
    """(cur [R, 1], attn, pos [R], cache) -> last hidden states [R, H] of one decode step. On a CPU, a
    Llama-shaped stack runs as `DecodeStep` (the same arithmetic without transformers' per-call
    machinery: SmolLM2-135M, 8 rows, 70 -> 59 ms a token; benchmarks/README.md); on a GPU (not
    measured here), and for any other architecture, the model's own forward."""
    fast = DecodeStep.of(trunk) if torch.device(device).type == "cpu" else None
    if fast is not None:
        return fast
    kw = cache_kwarg(trunk)

    def forward(cur, attn, pos, cache):
        return trunk(input_ids=cur, attention_mask=attn, position_ids=pos[:, None], use_cache=True,
                     **{kw: cache}).last_hidden_state[:, -1]

    return forward


def _vocab_projection(model):
    """hidden [R, H] -> logits [R, V] for the decode loop: the lm_head, its LoRA delta (if any) folded
    in once per call rather than per token. An fp32 head on the CPU runs as (W h^T)^T: for a decode
    step's few rows MKL's sgemm is faster on [V, H] x [H, R] than on the [R, H] x [H, V] product
    F.linear issues (SmolLM2-135M, R = 8: 12-16 ms vs 16-20 ms a token, rollout 0.85-0.92x); in bf16 the
    two are even, so other dtypes and devices keep F.linear. Same dot products either way."""
    try:
        weight, bias = output_projection(model)
    except NotImplementedError:  # a DoRA head: its module's own forward
        return lm_head_of(model)
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return functools.partial(torch.nn.functional.linear, weight=weight, bias=bias)
    if bias is None:
        return lambda h: torch.mm(weight, h.t()).t().contiguous()
    return lambda h: torch.addmm(bias[:, None], weight, h.t()).t().contiguous()


def _draw_per_context(logp: torch.Tensor, top_p: float, gens: list[torch.Generator], owner: torch.Tensor):
    """One token per row, row j's uniform drawn from the generator of its context `owner[j]` (rows
    are context-major): a context's draws do not depend on the other contexts of the batch. One
    vectorised draw for all rows."""
    ctx, count = torch.unique_consecutive(owner, return_counts=True)
    u = torch.cat([torch.rand(k, generator=gens[c], device=logp.device) for c, k in zip(ctx.tolist(), count.tolist())])
    return _invert_cdf(logp, top_p, u)


def _invert_cdf(logp: torch.Tensor, top_p: float, u: torch.Tensor) -> torch.Tensor:
    """Row i's token: where its cumulative distribution first passes u[i] (uniform in [0, 1)) of its
    mass, i.e. a draw from exp(logp[i]), restricted to the nucleus when top_p < 1 (the smallest set
    of most likely tokens whose mass reaches top_p). One cumsum and one search for every row, where
    torch.multinomial costs a call per generator."""
    probs = logp.exp()
    idx = None
    if top_p < 1.0:
        probs, idx = probs.sort(-1, descending=True)
        probs = probs.masked_fill(probs.cumsum(-1) - probs > top_p, 0.0)
    cdf = probs.cumsum(-1)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
    over = pick >= probs.shape[-1]  # u * mass rounded up to the mass: the last token with mass
    if over.any():
        last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(-1)
        pick = torch.where(over, last, pick)
    return pick if idx is None else idx.gather(-1, pick[:, None]).squeeze(-1)


def decode_cache():
    """An empty KV cache for the decode loop: a transformers DynamicCache whose layers append each
    step's keys and values into spare capacity (`_GrowingLayer`) instead of concatenating the whole
    cache again, so a token costs O(1) copies, not O(length). A transformers version without the
    layer hook gets the plain DynamicCache."""
    from transformers import DynamicCache

    cache = DynamicCache()
    layer = _growing_layer_class()
    if layer is not None and getattr(cache, "layer_class_to_replicate", None) is layer.__base__:
        cache.layer_class_to_replicate = layer
    return cache


@functools.cache
def _growing_layer_class():
    """`_GrowingLayer`, built on first use (transformers is imported lazily); None where transformers
    has no `DynamicLayer`."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None

    class _GrowingLayer(DynamicLayer):
        """DynamicLayer over buffers with room to grow: `keys` / `values` are views of their first
        `get_seq_length()` positions; a full buffer is reallocated at twice its size (amortised O(1))."""

        _kbuf = _vbuf = None

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            length, n = self.get_seq_length(), key_states.shape[-2]
            if self._kbuf is None or length + n > self._kbuf.shape[-2]:
                self._grow(key_states, value_states, length, length + n)
            self._kbuf[..., length:length + n, :] = key_states
            self._vbuf[..., length:length + n, :] = value_states
            self._view(length + n)
            return self.keys, self.values

        def _grow(self, key_states, value_states, length: int, need: int):
            size = max(2 * need, need + 64)
            kb = key_states.new_empty(*key_states.shape[:-2], size, key_states.shape[-1])
            vb = value_states.new_empty(*value_states.shape[:-2], size, value_states.shape[-1])
            if length:
                kb[..., :length, :] = self.keys
                vb[..., :length, :] = self.values
            self._kbuf, self._vbuf = kb, vb

        def _view(self, length: int):
            self.keys, self.values = self._kbuf[..., :length, :], self._vbuf[..., :length, :]

        def batch_repeat_interleave(self, repeats: int) -> None:
            if length := self.get_seq_length():
                self._kbuf = self._kbuf.repeat_interleave(repeats, dim=0)
                self._vbuf = self._vbuf.repeat_interleave(repeats, dim=0)
                self._view(length)

        def batch_select_indices(self, indices) -> None:
            if length := self.get_seq_length():
                self._kbuf, self._vbuf = self._kbuf[indices, ...], self._vbuf[indices, ...]
                self._view(length)

        def replace(self, keys, values) -> None:
            """Hold `keys` / `values` (a batch joined by `join_caches`); the next update grows the buffers."""
            self._kbuf, self._vbuf = keys, values
            self._view(keys.shape[-2])

    return _GrowingLayer
