"""`tinyrl train|sft|eval|presets|plan|report|export|serve|ui` — the command line. Every user-facing failure becomes
one clear paragraph on stderr and a non-zero exit, never a traceback.

The training stack (transformers, peft: tinyrl.api) and the UI (gradio) load inside the commands
that use them, so `tinyrl --help`, `presets` and `plan` answer without loading them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from tinyrl.config import (
    DEFAULT_PRESET,
    ConfigError,
    Resolved,
    RunConfig,
    decide_dtype,
    list_presets,
    parse_override,
    resolve,
)
from tinyrl.errors import USER_ERRORS
from tinyrl.plan_report import run as plan_run
from tinyrl.report import write_report
from tinyrl.stop import StopSignals


def _os_error_text(e: OSError) -> str:
    """An OSError as one line that names the file (tinyrl's RunFolderError carries its own message)."""
    if e.filename is not None:
        other = f" -> {e.filename2}" if e.filename2 is not None else ""
        return f"{e.filename}{other}: {e.strerror or e}"
    return e.strerror if isinstance(e.strerror, str) and e.strerror else str(e)


OOM_HELP = ("out of memory. Turn these knobs down: rollout.num_generations (group size), "
            "train.micro_batch_size, rollout.max_new_tokens, train.prompts_per_step, and for vLLM "
            "rollout.gpu_memory_utilization; or load the base in 4-bit (model.load_in_4bit=true).")


SECTIONS = frozenset(f.name for f in dataclasses.fields(RunConfig))  # model, train, ...: what an override starts with


def _bare_field(a: str) -> bool:
    """`train.steps`: a section's field without `=` (a preset file ends in .yaml, or exists)."""
    return "." in a and a.split(".", 1)[0] in SECTIONS and not a.endswith((".yaml", ".yml")) and not Path(a).exists()


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    """(preset, overrides) of the positional arguments; an override missing its `=` is not taken for a preset."""
    preset = None
    overrides = []
    for a in args:
        if "=" in a:
            overrides.append(a)
        elif preset is None and not _bare_field(a):
            preset = a
        else:
            raise ConfigError(f"unexpected argument {a!r}; overrides look like section.field=value")
    return preset, overrides


def _relaunch(ns, preset: str | None, overrides: list[str], resolved: Resolved) -> int:
    """`--nproc N` (or a profile's dist.nproc > 1) outside a launcher: run this same command in N
    processes through `accelerate launch` with the packaged config; its exit code."""
    from tinyrl import distributed
    n = resolved.cfg.dist.nproc
    args = ["train", *([preset] if preset else []), *overrides, f"dist.nproc={n}",
            *(["--profile", ns.profile] if ns.profile else []), *(["--resume", ns.resume] if ns.resume else [])]
    cmd = distributed.launch_command(n, resolved.cfg.dist.accelerate_config, args)
    logging.getLogger("tinyrl").info("launching %d processes: %s", n, " ".join(cmd))
    return subprocess.call(cmd)


def _overrides(texts: list[str]) -> dict:
    return {".".join(k): v for k, v in map(parse_override, texts)}


def cmd_train(ns) -> int:
    preset, overrides = _split(ns.args)
    if getattr(ns, "nproc", None) is not None:  # `tinyrl sft` has no --nproc
        overrides.append(f"dist.nproc={ns.nproc}")
    if ns.resume and ns.resume.startswith("hub:"):  # a checkpoint pushed with log.hub_strategy=checkpoint
        from tinyrl.hub_sync import resume_source

        ns.resume = resume_source(ns.resume, _overrides(overrides))  # a new local run folder
    resolved = resolve(preset, ns.profile, _overrides(overrides), ns.resume)  # once, for the whole command
    # the training stack (torch, transformers, peft): loaded once the config resolved, so a bad field is said in
    # a second, not after the ~10 s these imports take
    from tinyrl import distributed
    from tinyrl.methods.runner import run_method

    if resolved.cfg.dist.nproc > 1 and distributed.launched_world() <= 1:
        return _relaunch(ns, preset, overrides, resolved)
    try:
        run = run_method(resolved)
        rank = distributed.setup().rank
    finally:
        distributed.shutdown()  # accelerate's end_training: every rank, then the process group goes
    if rank:
        return 0  # rank 0 reports the run
    print(f"\nrun folder: {run.path}")
    if run.interrupted:
        print(f"interrupted; continue with: tinyrl train --resume {run.path}" if run.resumable else
              "interrupted before the first checkpoint: nothing can be resumed; start the run again")
        return 130
    if run.eval_before is not None or run.eval_after is not None:
        fmt = lambda x: "  n/a" if x is None else f"{100 * x:5.1f}%"  # noqa: E731
        print("held-out accuracy (greedy pass@1)")
        print(f"  before  {fmt(run.eval_before)}\n  after   {fmt(run.eval_after)}")
        if run.eval_before is not None and run.eval_after is not None:
            print(f"  change  {100 * (run.eval_after - run.eval_before):+5.1f} points")
    if run.alarms:
        print(f"alarms: {', '.join(sorted({a['name'] for a in run.alarms}))} (see {run.path / 'alarms.jsonl'})")
    return 0


def cmd_sft(ns) -> int:
    """`tinyrl sft PRESET [data=FILE|RUN_DIR|demonstrations]`: `tinyrl train` with stages=[sft]; a bare data=... is sft.data."""
    ns.args = [f"sft.{a}" if a.startswith("data=") else a for a in ns.args]
    if ns.resume is None:
        ns.args.append("stages=[sft]")
    return cmd_train(ns)


def cmd_presets(ns) -> int:
    for name, desc in list_presets().items():
        mark = " (default)" if name == DEFAULT_PRESET else ""
        print(f"{name}{mark}\n    {desc}")
    return 0


def _k_list(values: list[str] | None) -> tuple[list[int] | None, list[str]]:
    """`--k 1 4 16` (or `--k 1,4,16`): (the k values, the words among them that are no numbers).

    >>> _k_list(["1", "4,16", "tiny_grpo_cpu", "data.num_eval=8"])
    ([1, 4, 16], ['tiny_grpo_cpu', 'data.num_eval=8'])
    """
    ks, rest = [], []
    for v in values or []:
        parts = v.split(",")
        if all(p.strip().lstrip("-").isdigit() for p in parts):
            ks += [int(p) for p in parts]
        else:
            rest.append(v)
    return ks or None, rest


def cmd_eval(ns) -> int:
    from tinyrl.api import evaluate  # the training stack: loaded when an evaluation starts

    if ns.lm_eval is not None or ns.lm_eval_fewshot is not None or ns.lm_eval_limit is not None \
            or ns.lm_eval_include is not None or ns.lm_eval_batch_size is not None:
        return _lm_eval(ns, evaluate)
    ks, rest = _k_list(ns.k)  # `--k 1 4 16 a.b=1`: the words after the numbers are the command's own
    preset, overrides = _split(ns.args + rest)  # `eval a.b=1`: no preset
    kv = _overrides(overrides)
    if ns.gaia is not None:  # GAIA's metadata.jsonl, scored with GAIA's own scorer
        kv.update({"data.task": "gaia", "data.task_args": {"path": ns.gaia}})
    if ns.samples or ks or ns.temperature is not None:  # pass@k / maj@k: checked before the model loads
        from tinyrl.evaluation import check_k

        check_k(ns.samples, ks, "--samples")
    result = evaluate(preset, adapter=ns.adapter, report=True, samples=ns.samples, k=ks,
                      temperature=ns.temperature, **kv)
    print("\n".join(result.lines()))
    if result.path is not None:
        print(f"written: {result.path}")
    return 0


def _lm_eval(ns, evaluate) -> int:
    """`tinyrl eval RUN --lm-eval TASKS`: the run folder is the positional (or --adapter), nothing else."""
    if ns.lm_eval is None:
        raise ConfigError("--lm-eval-fewshot, --lm-eval-limit, --lm-eval-include and --lm-eval-batch-size go with "
                          "--lm-eval TASKS")
    if ns.gaia is not None or ns.samples or ns.k or ns.temperature is not None:
        raise ConfigError("--lm-eval: scores the run with the harness alone; --samples / --k / --temperature / --gaia "
                          "are tinyrl's own evaluation: run `tinyrl eval` twice")
    runs = [a for a in ns.args if "=" not in a] + ([ns.adapter] if ns.adapter else [])
    if len(runs) != 1 or len(ns.args) != len(runs) - bool(ns.adapter):
        raise ConfigError(f"--lm-eval: give one run folder, `tinyrl eval RUN --lm-eval TASKS` (no preset, no "
                          f"overrides: the run's own config is used); got {ns.args + ([ns.adapter] if ns.adapter else [])}")
    result = evaluate(adapter=runs[0], lm_eval=ns.lm_eval, lm_eval_fewshot=ns.lm_eval_fewshot,
                      lm_eval_limit=ns.lm_eval_limit, lm_eval_include=ns.lm_eval_include,
                      lm_eval_batch_size=1 if ns.lm_eval_batch_size is None else ns.lm_eval_batch_size)
    print("\n".join(result.lines()))
    print(f"written: {result.path}\n         {result.samples_path}")
    return 0


def cmd_report(ns) -> int:
    print(write_report(ns.run_dir))
    return 0


def cmd_export(ns) -> int:
    if not ns.merged and not ns.push and not ns.gguf:
        raise ConfigError("export: give --merged OUT (a new folder for the merged model) and/or --push REPO_ID "
                          "and/or --gguf OUT.gguf")
    if ns.private and not ns.push:
        raise ConfigError("--private: applies to --push REPO_ID; give --push too")
    from tinyrl.api import export  # the training stack: loaded when an export starts (after the checks above)

    done = export(ns.run_dir, merged=ns.merged, push=ns.push, private=ns.private, dtype=ns.dtype,
                  gguf=ns.gguf, gguf_type=ns.gguf_type)
    if done.merged is not None:
        print(f"merged model ({ns.dtype}): {done.merged}")
    if done.gguf is not None:
        print(f"GGUF ({ns.gguf_type}): {done.gguf}")
    if done.url is not None:
        print(f"uploaded {'the merged model' if done.merged else 'the adapter'}: {done.url}")
    return 0


def cmd_serve(ns) -> int:
    """`tinyrl serve PRESET --devices ...`: the vLLM server(s) of the preset's rollout.engine vllm_server (tinyrl/serve.py)."""
    from tinyrl import serve

    preset, overrides = _split(ns.args)
    # the trainer's memory plan and extras are the trainer's business; the dtype is this machine's, as the trainer's
    cfg = decide_dtype(resolve(preset, ns.profile, _overrides(overrides), None, decide_auto=False).cfg)
    launches = serve.launches(cfg, ns.devices, serve.find_vllm(ns.vllm) if not ns.dry_run else ns.vllm or "python",
                              port=ns.port, host=ns.host)
    for x in launches:
        print(" ".join([*(f"{k}={v}" for k, v in x.env.items()), *x.cmd]), flush=True)
    if ns.dry_run:
        return 0
    print(f"train against them with: rollout.engine=vllm_server rollout.server_url=[{','.join(x.url for x in launches)}]",
          flush=True)
    return serve.run(launches)


def cmd_ui(ns) -> int:
    from tinyrl.apps.server import ExposureError, MissingExtraError, serve  # gradio: the ui extra

    try:
        serve(host=ns.host, port=ns.port, runs_dir=ns.runs_dir, share=ns.share, auth=ns.auth)
    except (ExposureError, MissingExtraError) as e:
        print(f"tinyrl: error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_plan(ns) -> int:
    preset, overrides = _split(ns.args)
    plan, text = plan_run(preset, overrides, profile=ns.profile, gpu=ns.gpu, gpu_mem=ns.gpu_mem,
                     prompt_len=ns.prompt_len, search=not ns.no_search)
    print(text)
    return 0 if plan.fits else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tinyrl", description="GRPO with LoRA/QLoRA on one GPU or a CPU.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a preset (default: the embedded tiny model)")
    t.add_argument("args", nargs="*", help="[PRESET] [section.field=value ...]")
    t.add_argument("--profile", help="hardware profile defined in the preset (e.g. 8xh100)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run folder from its last checkpoint (or "
                   "hub:USER/NAME[@REV]: a checkpoint pushed with log.hub_strategy=checkpoint, into a new folder)")
    t.add_argument("--nproc", type=int, metavar="N",
                   help="train in N processes (one per GPU) through accelerate launch (dist.nproc=N)")
    t.set_defaults(fn=cmd_train)
    f = sub.add_parser("sft", help="LoRA/QLoRA SFT through TRL (prompt/completion rows, a run folder's samples, "
                                   "or the task's answers)")
    f.add_argument("args", nargs="*", help="[PRESET] [data=FILE|RUN_DIR|demonstrations] [section.field=value ...]")
    f.add_argument("--profile", help="hardware profile defined in the preset")
    f.add_argument("--resume", metavar="RUN_DIR", help="continue a run folder from its last checkpoint")
    f.set_defaults(fn=cmd_sft)
    sub.add_parser("presets", help="list shipped presets").set_defaults(fn=cmd_presets)
    e = sub.add_parser("eval", help="held-out pass@1, pass@k, maj@k of a preset's model (optionally with an adapter)")
    e.add_argument("args", nargs="*", help="[PRESET] [section.field=value ...]")
    e.add_argument("--adapter", metavar="RUN_DIR", help="a run folder (or adapter folder) to load")
    e.add_argument("--gaia", metavar="METADATA_JSONL", help="score GAIA questions (its metadata.jsonl) with GAIA's scorer")
    e.add_argument("--samples", type=int, default=0, metavar="N",
                   help="also sample N completions per prompt: pass@k and maj@k (written to the run folder)")
    e.add_argument("--temperature", type=float, metavar="T", help="their temperature (default: rollout.temperature)")
    e.add_argument("--k", nargs="+", metavar="K", help="the k of pass@k / maj@k (default: 1 2 4 ... N)")
    e.add_argument("--lm-eval", metavar="TASKS", help="score RUN (the positional: a run folder) with lm-evaluation-harness "
                   "tasks, comma-separated: gsm8k,arc_easy (pip install 'tinyrl-rlvr[lm-eval]')")
    e.add_argument("--lm-eval-fewshot", type=int, metavar="N", help="few-shot examples (default: each task's own)")
    e.add_argument("--lm-eval-limit", type=int, metavar="N", help="score the first N documents of each task")
    e.add_argument("--lm-eval-include", metavar="DIR", help="a folder of task YAMLs of your own (local data_files)")
    e.add_argument("--lm-eval-batch-size", type=int, metavar="N", help="documents per forward pass (default 1)")
    e.set_defaults(fn=cmd_eval)
    pl = sub.add_parser("plan", help="memory plan of a preset on a card: components, verdict, what fits")
    pl.add_argument("args", nargs="*", help="[PRESET] [section.field=value ...]")
    pl.add_argument("--profile", help="hardware profile defined in the preset (e.g. 24gb, 8xh100)")
    pl.add_argument("--gpu", help="T4, L4, A10, 4090, A100-40, A100-80, H100 or H200")
    pl.add_argument("--gpu-mem", help="card memory, e.g. 24GB (read as GiB)")
    pl.add_argument("--prompt-len", type=int, help="prompt tokens (default: tokenise the run's prompts)")
    pl.add_argument("--no-search", action="store_true", help="skip the largest-that-fits search")
    pl.set_defaults(fn=cmd_plan)
    r = sub.add_parser("report", help="summarise a run folder: curves, alarms, verdict (+ metrics.png)")
    r.add_argument("run_dir")
    r.set_defaults(fn=cmd_report)
    x = sub.add_parser("export", help="a run's merged model (--merged OUT) and/or its upload to the hub (--push)")
    x.add_argument("run_dir", metavar="RUN_DIR", help="a finished run folder (with adapter/)")
    x.add_argument("--merged", metavar="OUT", help="write the base with the adapter merged in to this new folder")
    x.add_argument("--dtype", default="bfloat16", help="the merged weights' dtype: bfloat16 (default), float16, float32")
    x.add_argument("--push", metavar="REPO_ID", help="upload the merged model (with --merged) or the adapter, "
                                                     "with a model card, to this hub repo (USER/NAME)")
    x.add_argument("--private", action="store_true", help="create the hub repo private")
    x.add_argument("--gguf", metavar="OUT.gguf", help="write the merged model as one GGUF file (llama.cpp, Ollama)")
    x.add_argument("--gguf-type", default="f16", help="the GGUF weights' type: f16 (default), bf16, q8_0, f32")
    x.set_defaults(fn=cmd_export)
    v = sub.add_parser("serve", help="start the vLLM server(s) a run with rollout.engine=vllm_server samples from")
    v.add_argument("args", nargs="*", help="[PRESET] [section.field=value ...] (the run's own preset and overrides)")
    v.add_argument("--profile", help="hardware profile defined in the preset (e.g. 8xh100)")
    v.add_argument("--devices", nargs="+", default=[], metavar="DEV",
                   help="one server per group: GPU ids (4, or 4,5 for tensor parallel 2), or CPU cores (cpu:1, cpu:0-3)")
    v.add_argument("--port", type=int, help="listen on PORT, PORT+1, ... (default: the ports of rollout.server_url)")
    v.add_argument("--host", default="127.0.0.1", help="interface to bind with --port (default 127.0.0.1)")
    v.add_argument("--vllm", metavar="PYTHON", help="the python of a venv with vLLM (default: $TINYRL_VLLM, .venv-vllm)")
    v.add_argument("--dry-run", action="store_true", help="print the server commands, start nothing")
    v.set_defaults(fn=cmd_serve)
    u = sub.add_parser("ui", help="web UI to launch, watch, stop, resume and compare runs (pip install 'tinyrl-rlvr[ui]')")
    u.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1; others need --auth)")
    u.add_argument("--port", type=int, default=None, help="port (default: the first free one from 7860)")
    u.add_argument("--runs-dir", default="runs", help="folder of run folders (default: runs)")
    u.add_argument("--share", action="store_true", help="also a public gradio share link (needs --auth)")
    u.add_argument("--auth", metavar="USER:PASS", help="require this login (needed off localhost and with --share)")
    u.set_defaults(fn=cmd_ui)
    ns, extra = p.parse_known_args(argv)  # overrides may come after an option: `eval P --adapter R a.b=1`
    if extra and (not hasattr(ns, "args") or any(x.startswith("-") for x in extra)):
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        ns.args = list(ns.args) + extra
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        with StopSignals():  # SIGTERM, like Ctrl-C, ends a command with its message (training defers it to a step's end)
            return ns.fn(ns)
    except USER_ERRORS as e:
        print(f"tinyrl: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `tinyrl presets | head`: the reader left; nothing is wrong
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the interpreter flushes stdout at exit
        return 0
    except OSError as e:  # a full or read-only disk, a path that is a file, a run folder in use
        print(f"tinyrl: error: {_os_error_text(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside the training loop (which checkpoints and returns on its own): start-up
        print("tinyrl: interrupted before training started; nothing was saved (a new run folder is removed, "
              "a resumed one is as it was)" if ns.fn in (cmd_train, cmd_sft) else "tinyrl: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as e:
        if "out of memory" in str(e).lower():
            print(f"tinyrl: error: {OOM_HELP}\n({e})", file=sys.stderr)
            return 3
        raise


def entry() -> None:
    """The `tinyrl` command: `main`, then exit with its status, even when a worker thread of an abandoned step
    (a stop past its deadline, tinyrl.stop) is still stuck: the interpreter would wait for it forever."""
    rc = main()
    stuck = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if stuck:
        logging.getLogger("tinyrl").warning("exiting with %d worker thread(s) still running: %s", len(stuck),
                                            ", ".join(t.name for t in stuck))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
