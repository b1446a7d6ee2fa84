"""`tinyrl plan PRESET [--gpu NAME | --gpu-mem 24GB] [--profile NAME] [overrides]`: print a plan.

It resolves a config and asks the planner (tinyrl.planner, which the config itself uses to decide its
`auto` settings), so it sits on the entry points' side, above both.

The launch form of the UI (tinyrl/apps/forms.py) shows the same text, made by the same functions."""

from __future__ import annotations

import dataclasses

from tinyrl.config import load_config
from tinyrl.planner import gpus
from tinyrl.planner import memory as M
from tinyrl.planner.plan import Plan, largest, plan_config
from tinyrl.planner.prompts import measure_prompt_tokens

KNOBS = {"micro_batch": "train.micro_batch_size", "generations": "rollout.num_generations",
         "new_tokens": "rollout.max_new_tokens"}


def gib(n: int) -> str:
    return f"{n / M.GiB:8.2f}"


def budget_line(p: Plan) -> str:
    return f"budget  {p.budget_label} = {p.budget / M.GiB:.2f} GiB"


def verdict_lines(p: Plan, maxima: dict[str, int | None] | None = None) -> list[str]:
    """The verdict (peak of budget), its problems and notes, and the largest settings that fit."""
    verdict = "FITS" if p.fits else "DOES NOT FIT"
    lines = [f"verdict: {verdict}: {M.size(p.peak)} of {M.size(p.budget)} ({100 * p.peak / p.budget:.0f}%)"]
    lines += [f"  problem: {x}" for x in p.problems] + [f"  note: {x}" for x in p.notes]
    if maxima:
        parts = [f"{KNOBS[k]}={'none' if v is None else v}" for k, v in maxima.items()]
        lines.append("largest that fit (one at a time, the rest as set): " + ", ".join(parts))
    return lines


def format_plan(p: Plan, maxima: dict[str, int | None] | None = None, prompt_note: str = "") -> str:
    s = p.setup
    a = s.arch
    lines = [f"model   {a.name}: {a.num_params / 1e9:.3f}B params, {a.num_layers} layers, H {a.hidden_size}, "
             f"kv heads {a.num_kv_heads} x {a.head_dim}, V {a.vocab_size}  ({a.source})",
             f"run     {s.device}, {'QLoRA nf4' if s.load_in_4bit else 'LoRA'} r={s.lora_r}"
             f"{' on an ' + s.quantization + ' base' if s.quantization != 'none' else ''} on "
             f"{','.join(s.targets)}; {s.prompts} prompts x {s.generations} = {s.rows} completions, "
             f"micro-batch {s.micro_batch}; prompt {s.prompt_tokens} + {s.new_tokens} new tokens"
             + (f" (prompt: {prompt_note})" if prompt_note else ""),
             budget_line(p), "",
             f"{'component':<64} {'phase':<8} {'GiB':>8}", "-" * 82]
    for r in p.rows:
        if r.bytes:
            lines.append(f"{r.name[:64]:<64} {r.phase:<8} {gib(r.bytes)}" + (f"   {r.note}" if r.note else ""))
    lines.append("-" * 82)
    for phase, b in sorted(p.phases.items(), key=lambda kv: kv[1]):
        lines.append(f"{'peak of phase ' + phase + (' (the peak)' if phase == p.peak_phase else ''):<73} {gib(b)}")
    if p.context:
        lines.append(f"{'CUDA context':<73} {gib(p.context)}")
    if p.slack:
        lines.append(f"{'allocator slack (10% of the peak phase)':<73} {gib(p.slack)}")
    lines.append(f"{'total at peak':<73} {gib(p.peak)}")
    if p.vllm:
        lines.append(f"vLLM settings: gpu_memory_utilization={p.vllm[0]:.2f}, max_num_seqs={p.vllm[1]}")
    return "\n".join(lines + verdict_lines(p, maxima))


# the base formats `tinyrl plan` sets side by side on a card: (label, model.load_in_4bit, model.quantization, engine)
FORMATS = (("16-bit LoRA, vLLM rollout (one shared copy)", False, "none", "vllm"),
           ("QLoRA nf4, vLLM rollout (nf4 + a 16-bit copy)", True, "none", "vllm"),
           ("QLoRA nf4, HF rollout (one nf4 copy)", True, "none", "hf"),
           ("int8 (torchao), vLLM rollout (one shared copy)", False, "int8", "vllm"))


def base_bytes(p: Plan) -> int:
    """Bytes of base weights the plan holds: the trainer's and any second copy vLLM keeps."""
    return sum(r.bytes for r in p.rows if r.name.startswith(("base weights", "vLLM weights")))


def compare_formats(cfg, device: str, budget: int, label: str = "", world_size: int = 1,
                    prompt_tokens: int | None = None) -> list[tuple[str, Plan]]:
    """The plan of `cfg` under each base format of FORMATS (the rest of the config as set)."""
    out = []
    for name, nf4, quant, engine in FORMATS:
        c = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, load_in_4bit=nf4, quantization=quant),
                                rollout=dataclasses.replace(cfg.rollout, engine=engine))
        out.append((name, plan_config(c, device, budget, label, world_size, prompt_tokens)))
    return out


def format_comparison(plans: list[tuple[str, Plan]]) -> str:
    lines = ["", "base formats side by side (this run otherwise as set):",
             f"{'format':<50} {'base GiB':>8} {'peak GiB':>8}  verdict", "-" * 82]
    for name, p in plans:
        lines.append(f"{name:<50} {gib(base_bytes(p))} {gib(p.peak)}  {'fits' if p.fits else 'does not fit'}")
    return "\n".join(lines)


def maxima_of(p: Plan) -> dict[str, int | None]:
    """The largest value of each knob whose plan fits p's budget (one at a time, the rest as set)."""
    return {k: largest(p.setup, p.budget, k) for k in KNOBS}


def this_machine() -> tuple[str, int, str]:
    """(device, bytes, label) of this process: its CUDA card, else the machine's RAM."""
    try:
        import torch  # lazy: asked only for a card; `tinyrl plan --gpu X` never needs it

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return "cuda", props.total_memory, f"this machine's {props.name}"
    except Exception:  # noqa: BLE001
        pass
    return "cpu", gpus.host_memory(), "this machine's RAM"


def budget_for(cfg, gpu: str | None, gpu_mem: str | None, profile: str | None) -> tuple[str, int, str]:
    """(device, bytes, label): --gpu-mem, --gpu, the profile's card, this machine's card, or a guess."""
    if gpu_mem:
        return "cuda", gpus.parse_memory(gpu_mem), f"--gpu-mem {gpu_mem}"
    if gpu:
        return "cuda", gpus.gpu_bytes(gpu), f"--gpu {gpu}"
    if profile in gpus.PROFILE_GPUS:
        card = gpus.PROFILE_GPUS[profile]
        return "cuda", gpus.GPUS[card], f"{card} (profile {profile})"
    here = this_machine()
    if here[0] == "cpu" and (cfg.rollout.engine == "vllm" or cfg.model.dtype not in ("float32", "auto")):
        return "cuda", gpus.GPUS["L4"], "a 24 GB card (L4; no --gpu given)"
    return here


def prompt_length(cfg, prompt_len: int | None = None) -> tuple[int | None, str]:
    """(prompt tokens to plan with, where the number came from); None: the task's typical length."""
    if prompt_len:
        return prompt_len, "--prompt-len"
    found = measure_prompt_tokens(cfg)
    if found is not None:
        return found
    return None, f"typical for task {cfg.data.task!r} (data or tokenizer not on disk; --prompt-len to set it)"


def run(preset, overrides: list[str], profile: str | None = None, gpu: str | None = None,
        gpu_mem: str | None = None, prompt_len: int | None = None, search: bool = True) -> tuple[Plan, str]:
    """Load the preset (+ profile, overrides), plan it, and return (plan, printable text)."""
    _, cfg = load_config(preset, overrides, profile=profile)
    device, budget, label = budget_for(cfg, gpu, gpu_mem, profile)
    prompt_len, note = prompt_length(cfg, prompt_len)
    return plan_text(cfg, device, budget, label, gpus.world_size_of(profile), prompt_len, note, search)


def plan_text(cfg, device: str, budget: int, label: str, world_size: int, prompt_len: int | None, note: str,
              search: bool = True) -> tuple[Plan, str]:
    """(plan, the text `tinyrl plan` prints): the plan's table and verdict and, on a card, the base
    formats that card could hold this run in (nf4 / int8, vLLM / HF rollout) side by side."""
    p = plan_config(cfg, device, budget, label, world_size, prompt_len)
    text = format_plan(p, maxima_of(p) if search else None, note)
    if device == "cuda":
        text += "\n" + format_comparison(compare_formats(cfg, device, budget, label, world_size, prompt_len))
    return p, text
