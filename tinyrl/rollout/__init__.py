"""Rollout engines behind one interface (`RolloutEngine`): hf (CPU, fallback), vllm (colocated)."""

from tinyrl.rollout.base import RolloutEngine, Rollouts, SamplingParams


def _hf(model, tokenizer, cfg, seed):
    from tinyrl.rollout.hf import HFEngine

    return HFEngine(model, tokenizer, seed=seed)


def _vllm(model, tokenizer, cfg, seed):
    from tinyrl.rollout.vllm import VLLMEngine  # optional: needs the vllm extra

    return VLLMEngine.from_run(model, tokenizer, cfg, seed=seed)


def _stale(model, tokenizer, cfg, seed):
    from tinyrl.rollout.stale import StaleEngine  # broken on purpose: tests the stale-weights canary

    return StaleEngine(model, tokenizer, seed=seed)


ENGINES = {"hf": _hf, "vllm": _vllm, "stale": _stale}


def make_engine(name: str, model, tokenizer, cfg, seed: int = 0, task=None):
    """Build the engine a run config names (`rollout.engine`); GPU engines import lazily. With
    `agent.enabled` it runs multi-turn tool episodes on top of it (`tinyrl.rollout.agent`)."""
    engine = ENGINES[name](model, tokenizer, cfg, seed)
    agent = getattr(cfg, "agent", None)
    if agent is not None and agent.enabled:
        from tinyrl.rollout.agent import AgentEngine

        engine = AgentEngine.from_config(engine, tokenizer, agent, task)
    return engine


def prompt_renderer(engine, tokenizer, cfg_data):
    """`text -> rendered prompt` for `engine`: an agent renders its format's instructions and
    tools too; any other engine gets `tinyrl.data.render_prompt` (the chat template)."""
    from tinyrl.data import render_prompt

    agent_render = getattr(engine, "render", None)
    if agent_render is not None:
        return lambda text: agent_render(text, cfg_data)
    return lambda text: render_prompt(tokenizer, text, cfg_data)


__all__ = ["ENGINES", "RolloutEngine", "Rollouts", "SamplingParams", "make_engine", "prompt_renderer"]
