"""One GRPO run of one side (tinyrl, TRL, or TRL at its default memory settings) in this process;
the child of benchmarks/vs_trl.py.

    python benchmarks/_bench.py '<json spec>'      # prints one line: RESULT {json}
    python benchmarks/_bench.py --smoke ['<json spec>']   # the same, 2 steps (SPEC: tinyrl on tiny-arith)

A spec names the side, the model, the task, the LoRA config and the batch shape (see SPEC);
both sides are configured from the same spec, so they train the same thing:
B prompts x G completions per optimiser step, one optimiser step per generation round,
AdamW (torch, no weight decay), constant learning rate, clip 0.2, token-mean loss, group-std
advantages, beta = 0 (no reference pass), float32, no gradient checkpointing, EOS (or the
length cap) ends a completion on both sides (no stop strings: TRL's transformers path has
none, so tinyrl reads its prompts from a jsonl file, which carries no task stop strings).
Side "trl-default" is the same TRL run with GRPOConfig's own memory defaults left in place
(TRL 1.16: gradient_checkpointing=True) instead of tinyrl's (off); see trl_memory_args.

What comes back: per-step wall time (time between consecutive optimiser-step ends; the
first step counts from the start of training), completion tokens per step, completions
generated per step, the RSS high-water mark of this process (ru_maxrss: imports, model,
training, all of it), the RSS just before training, and how far the LoRA weights moved.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time

SPEC = {
    "side": "tinyrl",  # or "trl" (equal settings), or "trl-default" (TRL's own gradient checkpointing default)
    "model": "tiny-arith",  # a tinyrl built-in model name or a local model folder
    "qlora": False,  # nf4 base weights (bitsandbytes), LoRA on top
    "task": "arithmetic",  # a tinyrl task name, or "dense": arithmetic prompts, a dense character reward
    "task_args": {},
    "format_weight": 0.0,  # > 0: add tinyrl's answer_format reward with this weight (both sides)
    "digit_weight": 0.0,  # > 0: add digit_reward (dense) with this weight, so small batches still have a spread
    "num_train": 256,
    "prompts": 4,  # B
    "generations": 8,  # G
    "max_new_tokens": 8,
    "micro_batch": 32,  # completions per forward/backward
    "steps": 4,
    "lr": 2e-3,
    "temperature": 1.0,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_targets": "all-linear",
    "seed": 0,
    "threads": 2,
    "track_likelihood": True,  # tinyrl's default LLD monitor (an extra scoring pass); False to switch off
}


# --------------------------------------------------------------------------- rewards (both sides)


def task_reward(prompts, completions, task="arithmetic", **columns):
    """The tinyrl task's own verifier (1.0 / 0.0)."""
    from tinyrl.tasks import get_task

    return get_task(task).reward(prompts, completions, **columns)


def dense_reward(prompts, completions, **columns):
    """Share of the completion's characters that are '7': dense, so every group has a spread."""
    return [c.count("7") / max(len(c), 1) for c in completions]


def digit_reward(prompts, completions, **columns):
    """Share of the completion's characters that are digits (dense shaping for a short run)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _for_trl(fn, **bound):
    """A reward that drops TRL's non-column kwargs (trainer_state, log_* callbacks, completion_ids)."""
    skip = {"trainer_state", "log_extra", "log_metric", "completion_ids", "environments"}

    def reward(prompts, completions, **kw):
        return fn(prompts, completions, **bound, **{k: v for k, v in kw.items() if k not in skip})

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward


# --------------------------------------------------------------------------- data


def task_rows(spec) -> list[dict]:
    from tinyrl.tasks import get_task

    name = "arithmetic" if spec["task"] == "dense" else spec["task"]
    rows, _ = get_task(name).build(spec["num_train"], 0, spec["seed"], **spec["task_args"])
    return rows


def reward_plan(spec) -> list[tuple[str, dict, float]]:
    """[(function name in this module or 'answer_format', bound kwargs, weight)]."""
    if spec["task"] == "dense":
        plan = [("dense_reward", {}, 1.0)]
    else:
        plan = [("task_reward", {"task": spec["task"]}, 1.0)]
    if spec["format_weight"] > 0:
        plan.append(("answer_format", {}, spec["format_weight"]))
    if spec["digit_weight"] > 0:
        plan.append(("digit_reward", {}, spec["digit_weight"]))
    return plan


def rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def lora_snapshot(model) -> dict:
    return {n: p.detach().float().clone() for n, p in model.named_parameters() if "lora_" in n}


def lora_moved(before: dict, model) -> dict:
    after = lora_snapshot(model)
    deltas = [float((after[n] - before[n]).abs().max()) for n in before]
    return {"lora_tensors": len(before), "lora_tensors_changed": sum(d > 0 for d in deltas),
            "lora_max_abs_change": max(deltas) if deltas else 0.0}


# --------------------------------------------------------------------------- models


def make_random_llama(path: str, hidden: int = 128, layers: int = 2, heads: int = 4, no_eos: bool = False,
                      seed: int = 0) -> str:
    """A random Llama shaped like tiny-arith (char tokenizer: <pad> </s> <unk> + digits, '+', '=', newline).

    no_eos=True: <pad>, </s> and <unk> can never be sampled, so every completion runs to the
    length cap on both sides (what a step-time scaling table over completion length needs).
    How: residual-stream dimension 0 carries a constant (every embedding row has 1.0 there and no
    o_proj / down_proj writes to it), so after the final RMSNorm it is always positive, and the
    lm_head reads it with weight -20 for the three special rows (logit about -200) and 0 elsewhere.
    """
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + list("0123456789+=\n"))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?m)."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    tok.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None,
                      eos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    if no_eos:
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] = 1.0
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight[0] = 0.0
                layer.mlp.down_proj.weight[0] = 0.0
            model.lm_head.weight[:, 0] = 0.0
            model.lm_head.weight[:3, 0] = -20.0
    model.generation_config = GenerationConfig(eos_token_id=1, pad_token_id=0)
    model.save_pretrained(path)
    return path


# --------------------------------------------------------------------------- tinyrl


def run_tinyrl(spec, root: str) -> dict:
    import torch

    from tinyrl.api import build_trainer

    rows = task_rows(spec)
    path = os.path.join(root, "prompts.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    rewards = [{"name": n if n == "answer_format" else f"_bench:{n}", "kwargs": kw, "weight": w}
               for n, kw, w in reward_plan(spec)]
    B, G = spec["prompts"], spec["generations"]
    overrides = {
        "model.name": spec["model"], "model.load_in_4bit": spec["qlora"], "model.dtype": "float32",
        "lora.r": spec["lora_r"], "lora.alpha": spec["lora_alpha"], "lora.dropout": 0.0,
        "lora.target_modules": spec["lora_targets"],
        "rollout.num_generations": G, "rollout.temperature": spec["temperature"], "rollout.top_p": 1.0,
        "rollout.max_new_tokens": spec["max_new_tokens"],
        "algo.estimator": "grpo", "algo.scale": "group", "algo.loss_agg": "token_mean", "algo.beta": 0.0,
        "algo.num_iterations": 1, "algo.epsilon_low": 0.2, "algo.epsilon_high": 0.2,
        "data.task": "jsonl", "data.path": path, "data.num_train": len(rows), "data.num_eval": 0,
        "data.seed": spec["seed"],
        "reward.functions": rewards,
        "train.steps": spec["steps"], "train.prompts_per_step": B, "train.micro_batch_size": spec["micro_batch"],
        "train.lr": spec["lr"], "train.weight_decay": 0.0, "train.max_grad_norm": 1.0,
        "train.scheduler": "constant", "train.seed": spec["seed"], "train.eval_before_after": False,
        "log.run_dir": os.path.join(root, "runs"), "log.progress": False,
        "log.track_likelihood": spec["track_likelihood"],
    }
    trainer = build_trainer(overrides=overrides)
    before = lora_snapshot(trainer.model)
    ends: list[float] = []
    rows_per_round: list[int] = []
    step, generate = trainer.train_step, trainer.engine.generate

    def timed_step():
        out = step()
        ends.append(time.perf_counter())
        return out

    def counted_generate(prompts, n, **kw):
        rows_per_round.append(len(prompts) * n)
        return generate(prompts, n, **kw)

    trainer.train_step, trainer.engine.generate = timed_step, counted_generate
    rss_setup, hwm_setup = rss_mib(), peak_rss_mib()
    t0 = time.perf_counter()
    run = trainer.train()
    from tinyrl.data import render_prompt

    first = render_prompt(trainer.tokenizer, rows[0]["prompt"], trainer.cfg.data)
    prompt_len = float(len(trainer.tokenizer(first, add_special_tokens=False)["input_ids"]))  # as HFEngine does
    m = run.metrics
    return {
        "step_s": _deltas(t0, ends),
        "completion_len": [x["completion_len"] for x in m],
        "rollout_s": [x["gen_time"] for x in m],  # generate + rewards + advantages, inside step_s
        "rows_per_generate": rows_per_round,
        "reward_mean": [x["reward_mean"] for x in m],
        "grad_norm": [x["grad_norm"] for x in m],
        "first_prompt_tokens": prompt_len,
        "rss_setup_mib": rss_setup,
        "peak_rss_setup_mib": hwm_setup,  # high-water mark before training (model loading peaks here)
        "threads": torch.get_num_threads(),
        **lora_moved(before, trainer.model),
    }


# --------------------------------------------------------------------------- TRL


def model_config(name: str, qlora: bool = False):
    """The run config's `model` section for `name`, float32 (nf4 when `qlora`), built and checked by
    tinyrl's own config code: what tinyrl's loader reads, never a stand-in that drifts from the schema."""
    from tinyrl.config import load_config

    _, cfg = load_config(overrides={"model.name": name, "model.dtype": "float32", "model.load_in_4bit": qlora})
    return cfg.model


def save_float_copy(name: str, path: str) -> None:
    """A float32 safetensors folder at `path` (written whole, then renamed) of the GGUF model `name` (any
    model tinyrl loads: a smoke run copies tiny-arith), loaded by tinyrl's own loader: both sides of
    vs_trl.py (and memory_validation.py) load the copy."""
    from tinyrl.model import load_base_model, load_tokenizer, resolve_model

    resolved, tmp = resolve_model(name), path + ".partial"
    load_tokenizer(resolved).save_pretrained(tmp)
    model = load_base_model(model_config(name), resolved)
    model.hf_quantizer, model.is_quantized = None, False  # de-quantised at load: plain float weights
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(tmp)
    os.replace(tmp, path)


def _in_child(what: str, *args: str) -> None:
    """`python _bench.py --<what> ARGS...` in a fresh process (a model load's memory is not the caller's)."""
    import subprocess

    r = subprocess.run([sys.executable, __file__, f"--{what}", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{what} {' '.join(args)} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")


def float_copy(name: str, root: str) -> str:
    """`root`/<model name>-float32, the float32 safetensors copy of (GGUF) model `name`, made once."""
    path = os.path.join(root, os.path.basename(name) + "-float32")
    if not os.path.isdir(path):
        _in_child("float-copy", name, path)
    return path


def load_hf(spec):
    """Tokenizer and base model exactly as tinyrl loads them (same dtype, same nf4 settings)."""
    from tinyrl.model import load_base_model, load_tokenizer, resolve_model

    resolved = resolve_model(spec["model"])
    tok = load_tokenizer(resolved)  # left padding, pad = eos when missing
    model = load_base_model(model_config(spec["model"], spec["qlora"]), resolved)
    # tinyrl's loader switches the config's KV cache off (it asks for one explicitly in generate);
    # TRL's generate reads the config, so give it back what from_pretrained would have given it.
    model.config.use_cache = True
    if resolved.gguf_file and not spec["qlora"]:
        # transformers de-quantises a GGUF file to plain float weights but leaves the model marked
        # "quantized (GGUF)", which Trainer refuses to train; the weights are ordinary nn.Linear.
        model.is_quantized = False
        model.hf_quantizer = None
    return tok, model


def trl_memory_args(spec) -> dict:
    """GRPOConfig's memory settings for this side. "trl": tinyrl's, so both sides run the same
    config (GRPOConfig defaults to gradient_checkpointing=True; tinyrl does not checkpoint).
    "trl-default": none passed, so TRL runs with its own default (True in TRL 1.16).

    >>> trl_memory_args({"side": "trl"}), trl_memory_args({"side": "trl-default"})
    ({'gradient_checkpointing': False}, {})
    """
    return {} if spec["side"] == "trl-default" else {"gradient_checkpointing": False}


def run_trl(spec, root: str) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tinyrl.config import DataConfig
    from tinyrl.data import render_prompt
    from tinyrl.rewards import REWARDS

    tok, model = load_hf(spec)
    rows = task_rows(spec)
    data_cfg = DataConfig()
    for r in rows:
        r["prompt"] = render_prompt(tok, r["prompt"], data_cfg)  # the same text tinyrl's rollout sees
    dataset = Dataset.from_list(rows)
    funcs, weights = [], []
    for name, kw, w in reward_plan(spec):
        fn = REWARDS[name] if name == "answer_format" else globals()[name]
        funcs.append(_for_trl(fn, **kw))
        weights.append(w)
    B, G, micro = spec["prompts"], spec["generations"], spec["micro_batch"]
    args = GRPOConfig(
        output_dir=os.path.join(root, "trl"), use_cpu=True, report_to="none", bf16=False, fp16=False,
        **trl_memory_args(spec),
        per_device_train_batch_size=micro, gradient_accumulation_steps=B * G // micro,  # = steps_per_generation
        num_generations=G, max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"], top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        reward_weights=weights,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        optim="adamw_torch", max_grad_norm=1.0,
        max_steps=spec["steps"], logging_steps=1, save_strategy="no", disable_tqdm=True,
        seed=spec["seed"], dataloader_num_workers=0, log_completions=False, remove_unused_columns=False,
    )
    peft_cfg = LoraConfig(r=spec["lora_r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0,
                          target_modules=spec["lora_targets"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=dataset,
                          processing_class=tok, peft_config=peft_cfg)
    ends: list[float] = []

    class StepEnd(TrainerCallback):
        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter())

    trainer.add_callback(StepEnd())
    rows_per_round: list[int] = []
    gen = trainer._generate_and_score_completions

    def counted(inputs):
        rows_per_round.append(len(inputs))
        return gen(inputs)

    trainer._generate_and_score_completions = counted
    before = lora_snapshot(trainer.model)
    rss_setup, hwm_setup = rss_mib(), peak_rss_mib()
    t0 = time.perf_counter()
    trainer.train()
    logs = [x for x in trainer.state.log_history if "completions/mean_length" in x]
    reward_keys = [k for k in (logs[0] if logs else {}) if k == "reward"]
    return {
        "step_s": _deltas(t0, ends),
        "completion_len": [x["completions/mean_length"] for x in logs],
        "rows_per_generate": rows_per_round,
        "reward_mean": [x.get("reward") for x in logs] if reward_keys else [],
        "grad_norm": [x.get("grad_norm") for x in logs],
        "first_prompt_tokens": float(len(tok(rows[0]["prompt"])["input_ids"])),  # as TRL tokenizes
        "rss_setup_mib": rss_setup,
        "peak_rss_setup_mib": hwm_setup,  # high-water mark before training (model loading peaks here)
        "threads": torch.get_num_threads(),
        "trl_steps_per_generation": args.steps_per_generation,
        "gradient_checkpointing": bool(trainer.accelerator.unwrap_model(trainer.model).is_gradient_checkpointing),
        **lora_moved(before, trainer.model),
    }


def _deltas(t0: float, ends: list[float]) -> list[float]:
    return [b - a for a, b in zip([t0] + ends[:-1], ends)]


def main() -> None:
    if sys.argv[1] == "--float-copy":  # python _bench.py --float-copy NAME PATH
        return save_float_copy(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "--smoke":  # python _bench.py --smoke ['<json spec>']: that spec (default SPEC), 2 steps
        spec = {**SPEC, **(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}), "steps": 2}
    else:
        spec = {**SPEC, **json.loads(sys.argv[1])}
    import torch

    torch.set_num_threads(spec["threads"])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as root:
        out = (run_tinyrl if spec["side"] == "tinyrl" else run_trl)(spec, root)
    out["peak_rss_mib"] = peak_rss_mib()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
