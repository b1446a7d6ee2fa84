"""The transformers rollout engine: `model.generate` on the training model itself.

The CPU path and the fallback everywhere. Each prompt is encoded once, and its prefill runs
once: the model reads the B prompts (all but their last token) into a KV cache, the cache is
repeated n times (prompt-major, like num_return_sequences), and `generate` continues the
B*n rows from it. Without that, generate would prefill every prompt n times, about half of a
CPU rollout's FLOPs at a 50-token prompt and 48 new tokens. The engine records the
sampling logprob of every sampled token, log_softmax(logits / temperature), step by step
with a logits processor, so only one [rows, V] distribution is alive at a time.

Sampling is seeded per call (`seed`, `calls`), so a resumed run draws the same samples.
"""

from __future__ import annotations

import torch

from tinyrl.rollout.base import Rollouts, SamplingParams


class _LogprobRecorder:
    """A LogitsProcessor that keeps log p(token) of each sampled token at temperature T."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.pending: torch.Tensor | None = None  # [rows, V] distribution of the last step
        self.logprobs: list[torch.Tensor] = []  # per step, [rows]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self._take(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        self.logprobs.append(self.pending.gather(-1, tokens[:, None]).squeeze(-1))
        self.pending = None

    def finish(self, completion_ids: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self._take(completion_ids[:, len(self.logprobs)])
        return torch.stack(self.logprobs, dim=1) if self.logprobs else completion_ids.new_zeros(
            (completion_ids.shape[0], 0), dtype=torch.float32)


class HFEngine:
    """Generate with the (peft) training model; `sync` is a no-op: it *is* the trained model."""

    def __init__(self, model, tokenizer, seed: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.seed = seed
        self.calls = 0  # sampling seed position; saved in checkpoints

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, params: SamplingParams,
                 columns: list[dict] | None = None, greedy: bool = False) -> Rollouts:
        from transformers import LogitsProcessorList

        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        recorder = _LogprobRecorder(params.temperature)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
        self.calls += 1
        was_training = self.model.training
        self.model.eval()
        try:
            with _fork_rng(gen):
                ids, attn, cache = self._shared_prefill(enc["input_ids"], enc["attention_mask"], n)
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=attn,
                    **({self.cache_kwarg: cache} if cache is not None else {}),
                    do_sample=not greedy,
                    temperature=params.temperature if not greedy else None,
                    top_p=params.top_p if not greedy else None,
                    top_k=0 if not greedy else None,  # no hidden top-50 truncation
                    max_new_tokens=params.max_new_tokens,
                    num_return_sequences=1 if cache is not None else n,
                    stopping_criteria=_stop_criteria(tok, params.stop, enc["input_ids"].shape[1]),
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                    use_cache=True,
                    logits_processor=LogitsProcessorList([recorder]),
                )
        finally:
            self.model.train(was_training)
        P = enc["input_ids"].shape[1]
        completion_ids = out[:, P:].cpu()
        logprobs = recorder.finish(completion_ids)
        return build_rollouts(
            tok, enc["input_ids"].cpu(), enc["attention_mask"].cpu(), completion_ids, logprobs,
            prompts, n, params, columns,
        )

    def _shared_prefill(self, ids: torch.Tensor, attn: torch.Tensor, n: int):
        """(input_ids, attention_mask, cache) for generate: the prompts' first P-1 tokens read once
        into a KV cache repeated n times; generate then feeds the last prompt token of each row.
        (None cache: one-token prompts or n == 1, where there is nothing to share.)"""
        if n == 1 or ids.shape[1] < 2:
            return ids, attn, None
        from transformers import DynamicCache

        from tinyrl.model import trunk_of

        head, head_mask = ids[:, :-1], attn[:, :-1]
        pos = (head_mask.cumsum(-1) - 1).clamp(min=0)  # left padding, as generate counts positions
        cache = DynamicCache()
        # the decoder stack only: no lm_head over the prompt positions (generate needs no logits here)
        trunk = trunk_of(self.model)
        self.cache_kwarg = _cache_kwarg(trunk)
        trunk(input_ids=head, attention_mask=head_mask, position_ids=pos, use_cache=True, **{self.cache_kwarg: cache})
        cache.batch_repeat_interleave(n)
        return ids.repeat_interleave(n, 0), attn.repeat_interleave(n, 0), cache

    def release(self) -> None:
        pass

    def sync(self, model) -> None:
        self.model = model

    def state_dict(self) -> dict:
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.calls = state["seed"], state["calls"]


def _cache_kwarg(trunk) -> str:
    """The KV-cache argument's name: `cache` in transformers 5.x (`past_key_values` deprecated)."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(trunk).forward).parameters else "past_key_values"


class _StopOnStrings:
    """StoppingCriteria: a row is done once its decoded completion contains a stop string.

    (transformers' own `stop_strings` needs a tokenizer with a BPE-style vocabulary; this works
    with any tokenizer, at the cost of decoding the completions each step.)"""

    def __init__(self, tokenizer, stop: list[str], prompt_len: int):
        self.tokenizer, self.stop, self.prompt_len = tokenizer, stop, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_len:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)


def _stop_criteria(tokenizer, stop: list[str], prompt_len: int):
    from transformers import StoppingCriteriaList

    return StoppingCriteriaList([_StopOnStrings(tokenizer, stop, prompt_len)] if stop else [])


class _fork_rng:
    """Run `generate` under a seeded global torch RNG (HF sampling uses it), then restore it."""

    def __init__(self, gen: torch.Generator):
        self.seed = int(torch.randint(0, 2**62, (1,), generator=gen))

    def __enter__(self):
        self.state = torch.random.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        torch.manual_seed(self.seed)

    def __exit__(self, *exc):
        torch.random.set_rng_state(self.state)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def completion_mask_of(completion_ids: torch.Tensor, texts: list[str], eos_id: int, pad_id: int,
                       stop: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask [N, T], truncated [N]): tokens up to and including EOS; generate pads after a stop."""
    N, T = completion_ids.shape
    is_eos = completion_ids == eos_id
    has_eos = is_eos.any(-1)
    first_eos = torch.where(has_eos, is_eos.float().argmax(-1), torch.full((N,), T))
    not_pad = completion_ids != pad_id if pad_id != eos_id else torch.ones_like(is_eos)
    pos = torch.arange(T)
    last_real = torch.where(not_pad.any(-1), (not_pad * (pos + 1)).max(-1).values, torch.zeros(N, dtype=torch.long))
    length = torch.where(has_eos, first_eos + 1, last_real)
    mask = (pos[None, :] < length[:, None]).long()
    stopped = torch.tensor([any(s in t for s in stop) for t in texts], dtype=torch.bool) if stop else torch.zeros(N, dtype=torch.bool)
    truncated = ~has_eos & ~stopped & (length >= T)
    return mask, truncated


def build_rollouts(tok, prompt_ids, prompt_mask, completion_ids, logprobs, prompts, n, params, columns) -> Rollouts:
    """Assemble a Rollouts from generate's outputs (shared by the HF and vLLM engines)."""
    N, T = completion_ids.shape
    raw_texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
    mask, truncated = completion_mask_of(completion_ids, raw_texts, tok.eos_token_id, tok.pad_token_id, params.stop)
    texts = tok.batch_decode(completion_ids * mask + tok.pad_token_id * (1 - mask), skip_special_tokens=True)
    B = len(prompts)
    cols = columns if columns is not None else [{} for _ in prompts]
    rep = lambda xs: [x for x in xs for _ in range(n)]  # noqa: E731  prompt-major rows
    if prompt_ids.shape[0] == B and n > 1:
        prompt_ids = prompt_ids.repeat_interleave(n, 0)
        prompt_mask = prompt_mask.repeat_interleave(n, 0)
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids * mask + tok.pad_token_id * (1 - mask),
        completion_mask=mask,
        loss_mask=mask.clone(),
        sampling_logprobs=logprobs[:, :T] * mask,
        group=torch.arange(B).repeat_interleave(n),
        truncated=truncated,
        prompts=rep(prompts),
        completions=texts,
        columns=rep(cols),
    )
