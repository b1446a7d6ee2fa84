"""The playground: a run's trained adapter beside its base model on one prompt, token by token.

    pg = Playground.load("runs/r1", "runs/r1/checkpoints/step-000008/adapter")  # None: the run's adapter/
    for base, tuned in pg.chat("37+48=", temperature=0.0):
        print(base.text, "|", tuned.text)          # each side's completion so far
    pg.verdict(row, tuned.text)                    # the task's verifier on a held-out row

One model is loaded: the run's base with the adapter applied (peft); the base model's answer comes
from the same model with the adapter switched off (`disable_adapter()`), so a 7B run costs one base
in memory. The two sides decode in lockstep, one token each per step, each with a generator seeded
alike (common random numbers; temperature 0 is greedy), so a page can show them growing side by side.

Each side sees the prompt as the run's rollout engine renders it (chat template; for an agent run the
format's instructions and tools: `tinyrl.rollout.prompt_renderer`) and stops where a rollout would:
EOS, a stop string (rollout.stop, else the task's), `max_new_tokens`. For an agent run each side is an
episode through the run's agent, with the rollout's own turn rules (`AgentEngine.end_turn`, `run_tool`,
`observe`): a turn that ends in a tool call runs the tool and the observation is spliced in as the
rollout splices it; `Side.turns` is the turn log the rollout keeps (assistant turns with their parsed
calls, tool observations as the model reads them).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from tinyrl.config import decide_dtype, resolve
from tinyrl.data import load_rows
from tinyrl.methods.common import sampling_params
from tinyrl.model import (
    cache_kwarg,
    load_base_model,
    load_tokenizer,
    quiet_third_party_noise,
    resolve_adapter,
    resolve_model,
)
from tinyrl.rollout.agent import AgentEngine
from tinyrl.rollout.base import StopStrings
from tinyrl.rollout.engines import prompt_renderer
from tinyrl.rollout.episodes import PlainTurns, Trajectory


@dataclass
class Side:
    """One side's answer so far: `text` is every token after the prompt (observations included)."""

    name: str  # "base" or "adapter"
    text: str = ""
    turns: list[dict] = field(default_factory=list)  # agent runs: the rollout's turn log
    tokens: int = 0  # completion tokens so far (sampled and observed)
    done: bool = False
    finish: str | None = None  # eos / stop / length, when done


class _Episode:
    """One side's decoding: a trajectory, its KV cache, the ids not yet fed to the model."""

    def __init__(self, name: str, prompt_ids: list[int], row: dict, rules, seed: int):
        self.side = Side(name)
        self.t = rules.start(prompt_ids, row)
        self.pending = list(prompt_ids)  # fed to the model at the next step
        self.cache = None
        self.gen = torch.Generator().manual_seed(seed)


class Playground:
    """A run's base + adapter loaded once, generating both sides of one prompt in lockstep."""

    def __init__(self, cfg, model, tokenizer, task, held_out: list[dict], adapter: str):
        self.cfg, self.model, self.tok, self.task, self.held_out = cfg, model, tokenizer, task, held_out
        self.adapter = adapter
        self.agent = AgentEngine.from_config(None, tokenizer, cfg.agent, task) if cfg.agent.enabled else None
        self.render = prompt_renderer(cfg, tokenizer, task, self.agent)
        self.params = sampling_params(cfg, task)
        self.lock = threading.Lock()  # one generation at a time: the adapter switch is the model's state
        self.cache_arg = cache_kwarg(model.get_base_model())  # `cache` in transformers 5, else past_key_values

    @classmethod
    def load(cls, run_dir: str | Path, adapter: str | Path | None = None) -> Playground:
        """The run's base model with `adapter` (an adapter folder; None: the run's adapter/), and its
        task and held-out rows, from the run folder's config.yaml."""
        from peft import PeftModel

        run = Path(run_dir)
        cfg = decide_dtype(resolve(resume=run, decide_auto=False).cfg)  # the run's own config, as it trained
        adapter = resolve_adapter(str(adapter if adapter is not None else run))  # checked before the slow load
        quiet_third_party_noise()
        resolved = resolve_model(cfg.model.name, cfg.model.gguf_file)
        tok = load_tokenizer(resolved)
        base = load_base_model(cfg.model, resolved)
        if torch.cuda.is_available() and not (cfg.model.load_in_4bit or cfg.model.quantization != "none"):
            base = base.to("cuda")  # a quantized base was placed on its device as it loaded
        model = PeftModel.from_pretrained(base, adapter).eval()
        _, held_out, task = load_rows(cfg.data)
        return cls(cfg, model, tok, task, held_out, adapter)

    # ------------------------------------------------------------------ prompts and verdicts

    def held_out_row(self, index: int) -> dict:
        """Held-out row `index` (modulo their number); ValueError when the run has none."""
        if not self.held_out:
            raise ValueError("this run has no held-out prompts (data.num_eval is 0, or its data gives none)")
        return self.held_out[index % len(self.held_out)]

    def verdict(self, row: dict, completion: str) -> bool | None:
        """The task's verifier on `completion` as an answer to `row` (None: the run has no verifier)."""
        if self.task is None:
            return None
        return bool(self.task.is_correct(completion, row))

    # ------------------------------------------------------------------ generation

    def chat(self, prompt: str, temperature: float = 0.0, max_new_tokens: int | None = None, seed: int = 0,
             row: dict | None = None) -> Iterator[tuple[Side, Side]]:
        """(base, adapter) after every step: each side one token further (or one tool call), until both end.

        `prompt` is the user's text (rendered here as the run renders it); `row` the held-out row it came
        from, which an agent's environment is reset with (its tools may read it)."""
        max_new = int(max_new_tokens or self.params.max_new_tokens)
        if max_new < 1:
            raise ValueError(f"max new tokens: must be >= 1, got {max_new}")
        row = dict(row or {"prompt": prompt})
        row["prompt"] = prompt
        ids = self.tok(self.render(prompt), add_special_tokens=False)["input_ids"]
        rules = self.agent or PlainTurns(self.tok)
        params = self.agent.turn_params(self.params) if self.agent else self.params
        stops = StopStrings(self.tok, params.stop)
        sides = [_Episode("base", ids, row, rules, seed), _Episode("adapter", ids, row, rules, seed)]
        with self.lock, torch.no_grad():
            while not all(e.side.done for e in sides):
                for e in sides:
                    if not e.side.done:
                        self._step(e, rules, stops, temperature, max_new)
                yield tuple(replace(e.side, turns=list(e.side.turns)) for e in sides)

    def _switch(self, name: str):
        return self.model.disable_adapter() if name == "base" else contextlib.nullcontext()

    def _step(self, e: _Episode, rules, stops: StopStrings, temperature: float, budget: int) -> None:
        """Feed the pending ids, draw one token; at a turn's end apply the rollout's turn rules."""
        device = next(self.model.parameters()).device
        with self._switch(e.side.name):
            out = self.model(input_ids=torch.tensor([e.pending], device=device), use_cache=True,
                             **{self.cache_arg: e.cache})
        e.cache = getattr(out, self.cache_arg)
        token = _draw(out.logits[0, -1].float().cpu(), temperature, self.params.top_p, e.gen)
        t: Trajectory = e.t
        t.add([token], None, observation=False)
        e.pending = [token]
        turn = t.ids[t.turn_start:]
        finish = ("eos" if token == self.tok.eos_token_id else "stop" if stops and stops.hit([turn])[0]
                  else "length" if len(t.ids) >= budget else None)
        if finish is not None:
            before = len(t.ids)
            job = rules.end_turn(t, finish, budget)
            if job is not None:  # a tool call: run it, splice its observation in (the budget may end t)
                rules.observe(t, job, rules.run_tool(t, job), budget)
                e.pending = t.ids[before:] or e.pending
            if t.done:
                e.side.done, e.side.finish = True, finish
        e.side.text = self.tok.decode(t.ids, skip_special_tokens=True)
        e.side.turns, e.side.tokens = t.log, len(t.ids)


def _draw(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """Greedy at temperature 0, else a draw from softmax(logits / T) cut to its top-p mass."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < top_p  # the smallest set whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))
