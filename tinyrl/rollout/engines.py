"""Building the run's rollout engine (`rollout.engine`: hf, vllm, vllm_server, stale) and rendering prompts the
way it sees them. vLLM is the `vllm` extra: its engine module loads when a run asks for it; vllm_server talks HTTP
to vLLM servers in other processes (tinyrl/rollout/vllm_server.py), so the trainer's venv needs no vLLM."""

from __future__ import annotations

import functools
from typing import Callable

from tinyrl.data import render_prompt
from tinyrl.rollout.agent import AgentEngine
from tinyrl.rollout.hf import HFEngine
from tinyrl.rollout.stale import StaleEngine


def _hf(model, tokenizer, cfg, seed):
    return HFEngine(model, tokenizer, seed=seed)


def _vllm(model, tokenizer, cfg, seed):
    from tinyrl.rollout.vllm import VLLMEngine  # optional: needs the vllm extra

    return VLLMEngine.from_run(model, tokenizer, cfg, seed=seed)


def _vllm_server(model, tokenizer, cfg, seed):
    from tinyrl.rollout.vllm_server import ServerEngine  # HTTP to vLLM servers (the standard library): no vllm here

    return ServerEngine.from_run(model, tokenizer, cfg, seed=seed)


def _stale(model, tokenizer, cfg, seed):  # broken on purpose: tests the stale-weights canary
    return StaleEngine(model, tokenizer, seed=seed)


ENGINES = {"hf": _hf, "vllm": _vllm, "vllm_server": _vllm_server, "stale": _stale}


def make_engine(name: str, model, tokenizer, cfg, seed: int = 0, task=None):
    """Build the engine a run config names (`rollout.engine`); GPU engines import lazily. With
    `agent.enabled` it runs multi-turn tool episodes on top of it (`tinyrl.rollout.agent`)."""
    engine = ENGINES[name](model, tokenizer, cfg, seed)
    if cfg.agent.enabled:
        engine = AgentEngine.from_config(engine, tokenizer, cfg.agent, task)
    return engine


def prompt_renderer(cfg, tokenizer, task=None, engine=None) -> Callable[[str], str]:
    """`text -> rendered prompt` as the run's engine sees it: with `agent.enabled`, the agent format's
    instructions and tools (`engine`'s own agent when it is one, else the run's agent built for
    rendering only); otherwise `tinyrl.data.render_prompt` (the chat template)."""
    if cfg.agent.enabled:
        agent = engine if isinstance(engine, AgentEngine) else AgentEngine.from_config(None, tokenizer, cfg.agent, task)
        return functools.partial(agent.render, cfg_data=cfg.data)
    return functools.partial(render_prompt, tokenizer, cfg_data=cfg.data)


