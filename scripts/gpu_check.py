"""One-shot GPU check for a bare CUDA machine: no network, the repository only, tinyrl not installed.

    bash scripts/gpu_check.sh [--out gpu_check.json] [--budget-s 420]
    bash scripts/gpu_check.sh --cpu            # the same code paths at tiny sizes on a CPU (CI)

Sections, in order, each timed and recorded in one JSON report (a table is printed at the end):

  env         versions, the card, and which optional packages are missing (vllm, bitsandbytes, trl:
              whatever needs them is reported as skipped, with the reason)
  tests       the CUDA-marked tests (`pytest -m gpu`) and the kernel tests (they run on CUDA when
              there is one); --cpu: the gpu-marked tests of tests/test_gpu_check.py (they skip)
  fused_loss  Triton fused linear logprobs vs the chunked torch reference on CUDA: values and
              grads, bf16 and fp32, V = 151,936, H = 896 and 3,584, N up to 16k; time, peak
              memory, achieved TFLOP/s; --cpu: Triton under TRITON_INTERPRET=1 on tiny shapes
  grpo        GRPO steps on CUDA (HF engine) with the shipped tiny model and random-weight models
              of Qwen2.5-0.5B's and 1.5B's real shapes (built from the config values, nothing
              downloaded): time per phase, and the planner's prediction vs
              torch.cuda.max_memory_allocated; where torchao is present, model.quantization=int8 on
              the HF engine and (with vllm) int8_shared: vLLM quantizes the base and the trainer's
              linears are views of it (the share report is recorded; issue #43's GPU-only part);
              --cpu: one step of a shrunken Qwen2-shaped model

Whatever does not fit the time budget is recorded as skipped. Exit status: 0 when nothing failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("vllm", "bitsandbytes", "trl", "torchao")


# --------------------------------------------------------------------------- importing tinyrl from the repo


def shim_dir() -> Path:
    """A folder whose `tinyrl` package is the repository's, laid out as pyproject maps it
    (tinyrl.presets -> presets/), made of symlinks."""
    shim = Path(tempfile.mkdtemp(prefix="tinyrl-shim-"))
    pkg = shim / "tinyrl"
    pkg.mkdir()
    for entry in (ROOT / "tinyrl").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "presets").symlink_to(ROOT / "presets")
    return shim


def ensure_tinyrl(force_shim: bool = False) -> str:
    """Make `import tinyrl` (with tinyrl.kernels and tinyrl.presets) work; returns how."""
    if not force_shim:
        try:
            import tinyrl.kernels  # noqa: F401
            import tinyrl.presets  # noqa: F401

            return "installed"
        except ImportError:
            pass
    for name in [m for m in sys.modules if m == "tinyrl" or m.startswith("tinyrl.")]:
        del sys.modules[name]
    shim = shim_dir()
    sys.path.insert(0, str(shim))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
    os.environ["TINYRL_SHIM"] = str(shim)
    import tinyrl.kernels  # noqa: F401

    return f"repository via import shim {shim} (tinyrl at {Path(tinyrl.__file__).parent})"


# --------------------------------------------------------------------------- sections


def section_env(ctx) -> dict:
    import importlib.util

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "tinyrl_import": ctx["import"], "device": "cpu", "missing": []}
    for mod in ("triton", "transformers", "peft", "accelerate", *OPTIONAL):
        spec = importlib.util.find_spec(mod)
        if spec is None:
            out["missing"].append(mod)
        else:
            try:
                out[mod] = __import__(mod).__version__ if mod in ("triton", "transformers", "peft") else "present"
            except Exception as e:  # noqa: BLE001
                out[mod] = f"present, import failed: {e}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        out.update(device=p.name, total_memory=p.total_memory, capability=f"{p.major}.{p.minor}",
                   free_after_init=free, cuda_context_bytes=total - free - torch.cuda.memory_reserved())
    return out


def section_tests(ctx) -> dict:
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return {"status": "skipped", "reason": "pytest is not installed"}
    targets = ["tests/test_gpu_check.py"] if ctx["cpu"] else ["tests", "-m", "gpu"]
    runs = {"gpu_marked": targets}
    if not ctx["cpu"]:
        runs["kernels_on_cuda"] = ["tests/kernels"]
        runs["oom_recovery"] = ["tests/test_oom_recovery.py"]  # an injected OOM mid-step, recovered on CUDA
    out = {}
    shim = os.environ.get("TINYRL_SHIM")
    for name, args in runs.items():
        code = ("import sys; " + (f"sys.path.insert(0, {shim!r}); " if shim else "")
                + "import pytest; sys.exit(pytest.main(sys.argv[1:]))")
        extra = ["-m", "gpu"] if ctx["cpu"] else []
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", code, "-q", "-p", "no:cacheprovider", *args, *extra],
                           cwd=ROOT, capture_output=True, text=True, timeout=max(30, ctx["left"]()))
        tail = (r.stdout.strip().splitlines() or [""])[-1]
        out[name] = {"returncode": r.returncode, "summary": tail, "seconds": time.perf_counter() - t0}
        if r.returncode not in (0, 5):  # 5: nothing collected / all deselected
            out[name]["output_tail"] = (r.stdout + r.stderr)[-4000:]
    out["status"] = "ok" if all(v["returncode"] in (0, 5) for v in out.values() if isinstance(v, dict)) else "fail"
    return out


def _time(fn, cuda: bool) -> tuple[float, object]:
    import torch

    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def loss_case(N: int, H: int, V: int, dtype, device: str) -> dict:
    """Triton vs the chunked torch reference: logp, entropy, d hidden; time, peak memory, TFLOP/s."""
    import torch

    from tinyrl.kernels import linear_logprobs

    cuda = device == "cuda"
    g = torch.Generator(device=device).manual_seed(0)
    h = (torch.randn(N, H, device=device, generator=g) / H ** 0.5).to(dtype)
    w = (torch.randn(V, H, device=device, generator=g) * 0.5).to(dtype)
    t = torch.randint(0, V, (N,), device=device, generator=g)
    coef = torch.randn(N, device=device, generator=g)
    res = {"N": N, "H": H, "V": V, "dtype": str(dtype).replace("torch.", "")}
    outs = {}
    for impl in ("triton", "torch"):
        hh = h.detach().clone().requires_grad_()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else 0
        fwd_s, (logp, ent) = _time(lambda hh=hh, impl=impl: linear_logprobs(hh, w, t, impl=impl), cuda)
        bwd_s, _ = _time(lambda logp=logp: (logp * coef).sum().backward(), cuda)
        flops_f, flops_b = 2 * N * H * V, 4 * N * H * V  # backward: recompute logits + grad_hidden
        res[impl] = {"fwd_ms": 1e3 * fwd_s, "bwd_ms": 1e3 * bwd_s,
                     "fwd_tflops": flops_f / fwd_s / 1e12, "fwd_bwd_tflops": (flops_f + flops_b) / (fwd_s + bwd_s) / 1e12,
                     "peak_extra_bytes": (torch.cuda.max_memory_allocated() - base) if cuda else None}
        outs[impl] = (logp.detach().float(), ent.float(), hh.grad.float())
    (lt, et, gt), (lr, er, gr) = outs["triton"], outs["torch"]
    scale = lambda x: float(x.abs().max().clamp(min=1))  # noqa: E731
    res["max_err"] = {"logp": float((lt - lr).abs().max()) / scale(lr), "entropy": float((et - er).abs().max()) / scale(er),
                      "grad_hidden": float((gt - gr).abs().max()) / scale(gr)}
    tol = 2e-3 if dtype == torch.float32 else 3e-2
    res["ok"] = all(v <= tol for v in res["max_err"].values())
    res["tolerance"] = tol
    return res


def section_fused_loss(ctx) -> dict:
    import torch

    from tinyrl.kernels import HAS_TRITON

    if not HAS_TRITON:
        return {"status": "skipped", "reason": "triton is not installed"}
    if ctx["cpu"]:
        shapes = [(48, 32, 300)]
        dtypes = [torch.float32]
    else:
        shapes = [(n, h, 151_936) for h in (896, 3584) for n in (1024, 4096, 16384)]
        dtypes = [torch.bfloat16, torch.float32]
    cases = []
    for dtype in dtypes:
        for N, H, V in shapes:
            if ctx["left"]() < 20:
                cases.append({"N": N, "H": H, "dtype": str(dtype), "skipped": "time budget"})
                continue
            cases.append(loss_case(N, H, V, dtype, ctx["device"]))
    done = [c for c in cases if "ok" in c]
    return {"status": "ok" if done and all(c["ok"] for c in done) else ("fail" if done else "skipped"),
            "cases": cases, "interpreter": os.environ.get("TRITON_INTERPRET") == "1"}


def random_model(arch, root: str, dtype, device: str) -> str:
    """A random-weight Qwen2 model with `arch`'s shapes, saved with a character tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tinyrl.model import load_tokenizer, resolve_model

    path = os.path.join(root, arch.name)
    cfg = Qwen2Config(vocab_size=arch.vocab_size, hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
                      num_hidden_layers=arch.num_layers, num_attention_heads=arch.num_heads,
                      num_key_value_heads=arch.num_kv_heads, max_position_embeddings=arch.max_positions,
                      tie_word_embeddings=arch.tie_word_embeddings, eos_token_id=1, pad_token_id=0, bos_token_id=None)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    model.save_pretrained(path)
    del model
    load_tokenizer(resolve_model("tiny-arith")).save_pretrained(path)  # ids < 99: any vocabulary holds them
    return path


def spread_reward(prompts, completions, **columns):
    """Completion length mod 7 (weight 0.1 beside the task's reward): random-weight models answer
    nothing right, and a batch with no reward spread takes no backward pass at all."""
    return [len(c) % 7 / 7 for c in completions]


def grpo_case(name: str, model: str, overrides: dict, ctx) -> dict:
    import dataclasses

    import torch

    import tinyrl.trainer as T
    from tinyrl.api import build_trainer
    from tinyrl.planner import build, setup_from_config

    cuda = ctx["device"] == "cuda"
    over = {"model.name": model, "train.eval_before_after": False, "log.progress": False,
            "log.run_dir": os.path.join(ctx["root"], "runs"), "train.save_every": 0,
            "reward.functions": ["task", {"name": "gpu_check:spread_reward", "weight": 0.1}], **overrides}
    t0 = time.perf_counter()
    trainer = build_trainer("tiny_grpo_cpu", overrides=over)
    times = {"setup_s": time.perf_counter() - t0, "rollout_s": [], "update_s": [], "step_s": []}
    shapes = []

    def timed(key, fn):
        def wrapped(*a, **k):
            s, out = _time(lambda: fn(*a, **k), cuda)
            times[key].append(s)
            if key == "rollout_s":
                shapes.append((out.prompt_ids.shape[1], out.completion_ids.shape[1]))
            return out
        return wrapped

    trainer.source.generate = timed("rollout_s", trainer.source.generate)  # (tinyrl.sources.SyncSource)
    update = T.policy_update
    T.policy_update = timed("update_s", update)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        for _ in range(trainer.cfg.train.steps):
            s, _ = _time(trainer.train_step, cuda)
            times["step_s"].append(s)
    finally:
        T.policy_update = update
    setup = setup_from_config(trainer.cfg, ctx["device"], prompt_tokens=max(p for p, _ in shapes))
    plan = build(dataclasses.replace(setup, new_tokens=max(t for _, t in shapes)), 2**40)
    out = {"case": name, **times, "prompt_tokens": setup.prompt_tokens, "completion_tokens": max(t for _, t in shapes),
           "predicted_allocated_peak": plan.allocated_peak, "predicted_phases": plan.phases}
    share = getattr(trainer.engine, "share", None)
    if share is not None:  # vLLM: which base tensors the trainer shares (int8_shared: all its linears must be)
        out["shared"] = share.summary()
    if cuda:
        measured = torch.cuda.max_memory_allocated()
        out.update(max_memory_allocated=measured, max_memory_reserved=torch.cuda.max_memory_reserved(),
                   error_pct=100 * (plan.allocated_peak - measured) / measured)
    else:
        out["memory"] = "skipped: torch.cuda.max_memory_allocated needs CUDA"
    del trainer
    if cuda:
        torch.cuda.empty_cache()
    return out


def section_grpo(ctx) -> dict:
    import torch

    from tinyrl.planner import ARCHITECTURES

    cases = []
    if ctx["cpu"]:
        tiny = ARCHITECTURES["qwen2.5-0.5b-instruct"]
        import dataclasses

        small = dataclasses.replace(tiny, name="qwen2.5-shape-tiny", hidden_size=64, num_layers=2, num_heads=4,
                                    num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=1024)
        plan = [("qwen2.5-shape-tiny", small, {"train.steps": 1, "train.prompts_per_step": 2,
                                               "rollout.num_generations": 2, "train.micro_batch_size": 4,
                                               "rollout.max_new_tokens": 8})]
        if "torchao" not in ctx["missing"]:  # the model.quantization=int8 path, HF engine (issue #43)
            plan.append(("int8 (torchao)", small, {**plan[0][2], "model.quantization": "int8"}))
    else:
        real = {"rollout.max_new_tokens": 128, "train.steps": 3, "train.prompts_per_step": 8,
                "rollout.num_generations": 8, "train.micro_batch_size": 16, "model.dtype": "bfloat16",
                "model.gradient_checkpointing": True, "lora.r": 16, "train.lr": 1e-5}
        plan = [("tiny-arith", "tiny-arith", {"train.steps": 3}),
                ("qwen2.5-0.5b-shape", ARCHITECTURES["qwen2.5-0.5b-instruct"], real),
                ("qwen2.5-1.5b-shape", ARCHITECTURES["qwen2.5-1.5b-instruct"], real)]
        # where the optional packages are present (not on the bare check machine): QLoRA and vLLM too
        if "bitsandbytes" not in ctx["missing"]:
            plan.append(("qlora (nf4)", ARCHITECTURES["qwen2.5-0.5b-instruct"], {**real, "model.load_in_4bit": True}))
        if "vllm" not in ctx["missing"]:
            plan.append(("vllm engine", ARCHITECTURES["qwen2.5-0.5b-instruct"], {**real, "rollout.engine": "vllm"}))
        if "torchao" not in ctx["missing"]:  # model.quantization int8 (issue #43): HF engine, and shared with vLLM
            plan.append(("int8 (torchao)", ARCHITECTURES["qwen2.5-0.5b-instruct"], {**real, "model.quantization": "int8"}))
            if "vllm" not in ctx["missing"]:
                plan.append(("int8_shared (vllm)", ARCHITECTURES["qwen2.5-0.5b-instruct"],
                             {**real, "model.quantization": "int8", "rollout.engine": "vllm"}))
    for name, model, over in plan:
        if ctx["left"]() < 45:
            cases.append({"case": name, "skipped": "time budget"})
            continue
        try:
            if not isinstance(model, str):
                dtype = torch.bfloat16 if over.get("model.dtype") == "bfloat16" else torch.float32
                model = random_model(model, ctx["root"], dtype, ctx["device"])
            cases.append(grpo_case(name, model, over, ctx))
        except Exception as e:  # noqa: BLE001  (one case failing must not hide the others)
            cases.append({"case": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]})
    if "bitsandbytes" in ctx["missing"]:
        cases.append({"case": "qlora (nf4)", "skipped": "bitsandbytes is not installed"})
    if "vllm" in ctx["missing"]:
        cases.append({"case": "vllm engine", "skipped": "vllm is not installed"})
    if "torchao" in ctx["missing"]:
        cases.append({"case": "int8 (torchao)", "skipped": "torchao is not installed"})
    failed = any("error" in c for c in cases)
    return {"status": "fail" if failed else "ok", "cases": cases}


def section_compile(ctx) -> dict:
    """The compile table's row for this card (tinyrl.kernels.compile_check): the blocks the dispatcher
    picks here compile without spills, checked by the same ptxas on the machine that will run them.
    --cpu: the A100 (sm_80) rows, as CI's compile test checks every card."""
    import importlib.util

    import torch

    if importlib.util.find_spec("triton") is None:
        return {"status": "skipped", "reason": "triton is not installed (pip install 'tinyrl-rlvr[kernels]')"}
    major, minor = (8, 0) if ctx["cpu"] else torch.cuda.get_device_capability()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    r = subprocess.run([sys.executable, "-m", "tinyrl.kernels.compile_check", "--json", "--sm", str(10 * major + minor)],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=max(30, ctx["left"]()))
    if not r.stdout.strip():
        return {"status": "fail", "error": r.stderr[-3000:]}
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    bad = [row for row in rows if row["problems"]]
    return {"status": "fail" if bad else "ok", "capability": 10 * major + minor, "rows": rows,
            "spilling": [(row["kernel"], row["dtype"], row["config"], row["problems"]) for row in bad]}


SECTIONS = {"env": section_env, "tests": section_tests, "compile": section_compile, "fused_loss": section_fused_loss,
            "grpo": section_grpo}
# seconds each section may take on one H100 (the whole check: 8 minutes); a section past its share is cut
BUDGET_S = {"env": 10, "tests": 120, "compile": 40, "fused_loss": 90, "grpo": 200}


def dry_run(sections: list[str]) -> str:
    """What the check would run, and its time budget, without running anything."""
    lines = [f"tinyrl gpu_check: {len(sections)} sections, budget {sum(BUDGET_S[s] for s in sections)} s"]
    for name in sections:
        lines.append(f"  {name:<11} {BUDGET_S[name]:>4} s  {_SECTION_NOTES[name]}")
    return "\n".join(lines)


_SECTION_NOTES = {
    "env": "versions, the card, the optional packages present (vllm, bitsandbytes, trl)",
    "tests": "the gpu-marked tests (planner vs torch.cuda.max_memory_allocated), the kernel tests and OOM recovery on CUDA",
    "compile": "this card's row of the kernel compile table (no spills at the blocks the dispatcher picks)",
    "fused_loss": "Triton fused logprobs vs the torch reference: values, grads, time, peak memory, TFLOP/s",
    "grpo": "GRPO steps on tiny-arith and random Qwen2.5-0.5B/1.5B-shaped models (QLoRA, vLLM, int8 where installed): "
            "time per phase, planned vs measured peak",
}


# --------------------------------------------------------------------------- report


def _fmt_bytes(b) -> str:
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def table(report: dict) -> str:
    lines = [f"tinyrl gpu_check on {report['env'].get('device', '?')} ({'--cpu dry run' if report['cpu'] else 'CUDA'}),"
             f" {report['seconds']:.0f} s"]
    for name, sec in report["sections"].items():
        lines.append(f"  {name:<11} {sec.get('status', 'ok'):<8} {sec.get('seconds', 0):6.1f} s  {sec.get('reason', '')}")
    for c in report["sections"].get("fused_loss", {}).get("cases", []):
        if "ok" in c:
            tr = c["triton"]
            lines.append(f"    loss N={c['N']:>5} H={c['H']:>4} {c['dtype']:<8} triton {tr['fwd_ms']:7.1f}+{tr['bwd_ms']:7.1f} ms "
                         f"{tr['fwd_bwd_tflops']:6.1f} TFLOP/s peak {_fmt_bytes(tr['peak_extra_bytes'])}  torch "
                         f"{c['torch']['fwd_ms'] + c['torch']['bwd_ms']:7.1f} ms  err {max(c['max_err'].values()):.1e}"
                         f" {'ok' if c['ok'] else 'FAIL'}")
    for c in report["sections"].get("grpo", {}).get("cases", []):
        if "step_s" in c:
            mem = (f"predicted {_fmt_bytes(c['predicted_allocated_peak'])} vs max_allocated "
                   f"{_fmt_bytes(c['max_memory_allocated'])} ({c['error_pct']:+.0f}%)" if "max_memory_allocated" in c
                   else c["memory"])
            lines.append(f"    grpo {c['case']:<20} step {sum(c['step_s']) / len(c['step_s']):6.2f} s (rollout "
                         f"{sum(c['rollout_s']) / len(c['rollout_s']):.2f}, update {sum(c['update_s']) / len(c['update_s']):.2f})  {mem}")
        else:
            lines.append(f"    grpo {c['case']:<20} {c.get('skipped') and 'skipped: ' + c['skipped'] or 'ERROR ' + c.get('error', '')}")
    for mod in report["env"].get("missing", []):
        lines.append(f"  skipped: everything that needs {mod} (not installed)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="tinyrl's one-shot GPU check")
    ap.add_argument("--cpu", action="store_true", help="dry run of the same code paths on CPU, tiny sizes")
    ap.add_argument("--out", default="gpu_check.json", help="JSON report path")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new work after this many seconds")
    ap.add_argument("--shim", action="store_true", help="import the repository through the shim even when "
                    "tinyrl is installed (what a bare machine does)")
    ap.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=list(SECTIONS))
    ap.add_argument("--dry-run", action="store_true", help="list every check and its time budget; run nothing")
    ns = ap.parse_args(argv)
    if ns.dry_run:
        print(dry_run(ns.sections))
        return 0
    if ns.cpu:  # before anything imports triton: the interpreter runs the kernels on CPU tensors
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    t_start = time.perf_counter()
    how = ensure_tinyrl(ns.shim)
    import torch

    if not ns.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; use --cpu for the dry run", file=sys.stderr)
        return 2
    ctx = {"cpu": ns.cpu, "device": "cpu" if ns.cpu else "cuda", "import": how,
           "root": tempfile.mkdtemp(prefix="tinyrl-gpu-check-"),
           "left": lambda: ns.budget_s - (time.perf_counter() - t_start), "missing": []}
    report = {"cpu": ns.cpu, "sections": {}, "env": {}}
    for name in ["env"] + [s for s in ns.sections if s != "env"]:
        t0 = time.perf_counter()
        try:
            sec = SECTIONS[name](ctx)
        except Exception as e:  # noqa: BLE001
            sec = {"status": "fail", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        sec["seconds"] = time.perf_counter() - t0
        report["sections"][name] = sec
        if name == "env":
            report["env"] = sec
            ctx["missing"] = sec.get("missing", [])
    report["seconds"] = time.perf_counter() - t_start
    Path(ns.out).write_text(json.dumps(report, indent=1, default=str))
    print(table(report))
    print(f"report: {ns.out}")
    return 1 if any(s.get("status") == "fail" for s in report["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
