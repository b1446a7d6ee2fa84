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


def make_engine(name: str, model, tokenizer, cfg, seed: int = 0):
    """Build the engine a run config names (`rollout.engine`); GPU engines import lazily."""
    return ENGINES[name](model, tokenizer, cfg, seed)


__all__ = ["ENGINES", "RolloutEngine", "Rollouts", "SamplingParams", "make_engine"]
