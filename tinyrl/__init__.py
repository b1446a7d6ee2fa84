"""tinyrl: memory-frugal LoRA/QLoRA GRPO on one GPU or a CPU.

    import tinyrl
    run = tinyrl.train("tiny_grpo_cpu", **{"train.steps": 20})

`import tinyrl` stays light: torch/transformers load when a run starts, and vllm,
unsloth and triton only when a config asks for them.
"""

from tinyrl.version import __version__


def train(preset=None, profile=None, resume=None, **overrides):
    """Run a preset (shipped name or YAML path) with dotted overrides; returns the Run."""
    from tinyrl.api import train as _train

    return _train(preset, profile=profile, resume=resume, **overrides)


def evaluate(preset=None, adapter=None, **overrides):
    """Held-out pass@1 (greedy) of the preset's model, optionally with a trained adapter."""
    from tinyrl.api import evaluate as _evaluate

    return _evaluate(preset, adapter=adapter, **overrides)


def export(run_dir, merged=None, push=None, private=False, dtype="bfloat16", token=None, gguf=None, gguf_type="f16"):
    """Export a finished run: `merged=OUT` writes its base with the adapter merged in (16-bit);
    `push="USER/NAME"` uploads the merged model (or, without `merged`, the adapter) with a model card;
    `gguf="OUT.gguf"` writes the merged model as one GGUF file (llama.cpp, Ollama) of `gguf_type`."""
    from tinyrl.api import export as _export

    return _export(run_dir, merged=merged, push=push, private=private, dtype=dtype, token=token, gguf=gguf,
                   gguf_type=gguf_type)


__all__ = ["train", "evaluate", "export", "__version__"]
