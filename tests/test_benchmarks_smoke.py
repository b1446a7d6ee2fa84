"""Every benchmark's smoke mode, run as a user runs it (issue 54): `python benchmarks/<script>.py --smoke --json F`
from the repo root, in a subprocess. Each must exit 0 and write the rows its tables print, with finite numbers
(and the few facts a smoke run can check for real: both vs-TRL sides trained on the same batch, the naive and the
fused loss agree, the stale-weights canary fires, streaming and turn-synchronous agents decode the same greedy
trajectories). A benchmark that rots fails here, not in front of a user.

Covered: every script in benchmarks/. vs_trl.py runs inside run_all.py (its `main(["--smoke", ...])`, the same
argument parser), and _bench.py is vs_trl.py's child (both sides of its case and of its scaling point), so neither
runs a second time on its own. Timings are not asserted: the smokes share the machine, TINYRL_SMOKE_JOBS (default 2)
at a time, longest first, so the whole set costs about its CPU time over two cores.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
JOBS = int(os.environ.get("TINYRL_SMOKE_JOBS", "2"))
TIMEOUT = 1800  # seconds per script: generous (the slowest, run_all, took ~4 min on a loaded 2-core box); a hang still ends

# longest first (so two at a time finish together); every script in benchmarks/ but the two run_all / vs_trl cover.
# "vllm_grpo@vllm": vllm_grpo.py again, in the vLLM venv (the real engine on the CPU build), where that venv exists
SCRIPTS = ["server_rollout", "run_all", "async_rollout", "dist_cpu", "self_improvement", "code_rl",
           "memory_validation", "search_agent", "vllm_grpo@vllm", "monitor_calibration", "default_learning",
           "vllm_grpo", "fused_loss"]
COVERED_ELSEWHERE = {"vs_trl": "run_all", "_bench": "vs_trl"}
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@functools.cache
def vllm_venv() -> bool:
    """Whether this is scripts/test_vllm.sh's run (TINYRL_VLLM_SMOKE=1: the README command builds .venv-vllm after
    the main pytest run, so the vLLM smoke runs there) and the vLLM venv can import vllm."""
    return os.environ.get("TINYRL_VLLM_SMOKE") == "1" and VLLM_PYTHON.exists() and subprocess.run(
        [str(VLLM_PYTHON), "-c", "import vllm"], capture_output=True, timeout=300).returncode == 0


# a run that needs something this machine may lack, and why it is skipped then
NEEDS = {"vllm_grpo@vllm": (vllm_venv, "runs in scripts/test_vllm.sh (TINYRL_VLLM_SMOKE=1, with .venv-vllm built); "
                                       "the hf fallback ran here: vllm_grpo")}


def finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in xs)


def share(x) -> bool:
    """A held-out accuracy: a finite number in [0, 1]."""
    return finite(x) and 0.0 <= x <= 1.0


# --------------------------------------------------------------------------- running


def run_smoke(name: str, out: Path) -> dict:
    script, _, venv = name.partition("@")
    python = str(VLLM_PYTHON) if venv == "vllm" else sys.executable
    path = out / f"{name}.json"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
           **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if venv == "vllm" else {})}  # as scripts/test_vllm.sh runs it
    t0 = time.perf_counter()
    p = subprocess.run([python, f"benchmarks/{script}.py", "--smoke", "--json", str(path)], cwd=REPO,
                       capture_output=True, text=True, timeout=TIMEOUT, env=env)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr, "wall_s": time.perf_counter() - t0,
            "json": json.loads(path.read_text()) if path.exists() else None}


@pytest.fixture(scope="module")
def smokes(request, tmp_path_factory):
    """The selected scripts' smoke runs, started together (JOBS at a time) on first use: {script: Future}."""
    wanted = {item.callspec.params["script"] for item in request.session.items  # (doctest items have no originalname)
              if getattr(item, "originalname", None) == "test_benchmark_smoke" and Path(item.fspath) == Path(__file__)}
    wanted -= {s for s in wanted if s in NEEDS and not NEEDS[s][0]()}
    out = tmp_path_factory.mktemp("benchmark-smoke")
    with ThreadPoolExecutor(JOBS) as pool:
        yield {s: pool.submit(run_smoke, s, out) for s in SCRIPTS if s in wanted}


# --------------------------------------------------------------------------- what each one writes


def check_server_rollout(d, stdout):
    [row] = d
    assert (row["preset"], row["seed"]) == ("tiny_grpo_cpu", 0)
    server = "the server arms are skipped" not in stdout  # no vLLM venv: it says so and runs the colocated arm
    assert not server or finite(row["server_start_s"])
    for arm in ("sync", "server_sync", "server_async") if server else ("sync",):
        r = row[arm]
        assert r["steps"] == 2 and share(r["before"]) and share(r["after"]) and finite(r["train_s"], r["wall_s"])


def check_run_all(d, stdout):
    case = d["cases"]["smoke-qlora"]
    for side in ("tinyrl", "trl"):
        s = case[side]
        assert not s.get("errors") and "error" not in s, s
        assert finite(s["step_s"], s["tokens_per_s"], s["peak_rss_mib"], s["rss_setup_mib"], s["completion_len"])
        assert s["step_s"] > 0 and s["peak_rss_mib"] > 0
        assert s["trained"], f"{side}: the LoRA weights did not move"
        assert s["completions_per_step"] == 16 and s["generate_calls_per_step"] == 1  # 4 x 4, one round a step
    assert case["tinyrl"]["prompt_tokens"] == case["trl"]["prompt_tokens"]  # the same prompts on both sides
    assert case["pairs"] == 1 and finite(case["step_ratio"], case["rss_ratio"])
    [point] = d["scaling"]
    assert (point["G"], point["L"], point["pairs"]) == (2, 8, 1) and finite(point["step_ratio"], point["rss_ratio"])
    assert {r["impl"] for r in d["fused_loss"]} >= {"naive", "ours-torch"}
    assert all(finite(r["peak_mib"], r["time_s"]) for r in d["fused_loss"])
    table = [line.split() for line in stdout[stdout.index("## combined"):].splitlines()]
    for row in (["vs-trl", "smoke-qlora", "step", "s"], ["scaling", "G=2", "L=8", "step", "s"],
                ["fused-loss", "N=256", "V=4096", "peak", "MiB"]):
        assert any(cells[:len(row)] == row for cells in table), row  # the combined table's rows


def check_fused_loss(d, stdout):
    rows = {r["impl"]: r for r in d["rows"]}
    assert set(rows) >= {"naive", "ours-torch"}
    for r in rows.values():
        assert r["n"] == 256 and finite(r["peak_mib"], r["time_s"], r["loss"])
    assert rows["ours-torch"]["loss"] == pytest.approx(rows["naive"]["loss"], rel=1e-5)  # the same loss, chunked
    assert "skipped: needs CUDA" in stdout or "ours-triton" in rows


def check_default_learning(d, stdout):
    [row] = d["rows"]
    assert row["seed"] == 0 and row["steps"] == 2 and share(row["before"]) and share(row["after"])
    assert finite(row["wall_s"], row["median_step_s"]) and row["wall_s"] > 0
    assert "not judged (--smoke" in stdout


def check_dist_cpu(d, stdout):
    assert [r["nproc"] for r in d] == [1, 2]
    for r in d:
        assert r["processes_seen"] == r["nproc"]  # the 2-process run really ran on 2 processes
        assert finite(r["step_s"], r["rollout_s"], r["rest_s"], r["wall_s"]) and r["step_s"] > 0


def check_memory_validation(d, stdout):
    [r] = d
    assert r["case"] == "tiny-lora" and "error" not in r, r.get("error")
    m, p = r["measured"], r["predicted"]
    assert m["peaks"]["rollout"] > 0 and m["peaks"]["update"] > 0 and m["prompt_tokens"] > 0
    assert p["peak"] > 0 and p["persistent"] > 0 and finite(r["error_pct"])


def check_monitor_calibration(d, stdout):
    runs = {x["case"]["preset"]: x for x in d}
    assert set(runs) == {"tiny_grpo_cpu", "tiny_stale_weights_cpu"}
    assert runs["tiny_grpo_cpu"]["steps"] == 3
    assert not [a for a in runs["tiny_grpo_cpu"]["fired"] if a.get("severity", "alarm") == "alarm"]
    assert "stale_weights" in {a["name"] for a in runs["tiny_stale_weights_cpu"]["fired"]}
    assert "result: all checks pass" in stdout
    assert "exported tiny_grpo_cpu-s0 (3 steps)" in stdout and "exported tiny_stale_weights_cpu-s0 (" in stdout


def check_async_rollout(d, stdout):
    [tools] = d["tools"]
    assert (tools["delay_ms"], tools["workers"]) == (100, 8)
    assert finite(tools["sync_s"], tools["streaming_s"], tools["speedup"]) and tools["speedup"] > 0
    assert tools["greedy_identical"]  # streaming changes the schedule, never the trajectories
    [tail] = d["tail"]
    assert finite(tail["k0_step_s"], tail["k1_step_s"], tail["speedup"], tail["staleness_mean"])
    assert [r["preset"] for r in d["learn"]] == ["tiny_search_cpu", "tiny_grpo_cpu"]
    for r in d["learn"]:
        for arm in ("sync", "partial", "overlap"):
            assert share(r[f"{arm}_after"]) and finite(r[f"{arm}_wall"], r[f"{arm}_train_s"])


def check_code_rl(d, stdout):
    assert [(r["arm"], r["seed"], r["steps"]) for r in d] == [("tests", 0, 2), ("code_block", 0, 2)]
    for r in d:
        assert share(r["before"]) and share(r["after"]) and finite(r["wall"], r["reward_last"])
    assert sum(d[0]["last_step_sandbox"].values()) == 16  # every completion of the last step (4 x 4) was judged


def check_search_agent(d, stdout):
    assert set(d["before"]) == {"agent", "mask_off", "no_tool"}
    assert all(share(b["em"]) and finite(b["searches"], b["turns"]) for b in d["before"].values())
    assert [(r["arm"], r["steps"]) for r in d["runs"]] == [("agent", 2), ("mask_off", 2), ("no_tool", 2)]
    for r in d["runs"]:
        assert share(r["before"]) and share(r["after"]) and finite(r["wall"], r["searches_after"])


def check_self_improvement(d, stdout):
    assert [r["method"] for r in d] == ["grpo", "rest_em", "star"]
    for r in d:
        assert len(r["acc"]) == 2 and all(map(share, r["acc"])) and finite(r["wall_s"])
        assert r["samples"][0] == 0 and r["samples"][-1] >= 32  # one point: 2 GRPO steps of 4 x 4 (STaR: + hints)
    assert d[0]["samples"] == [0, 32] and d[1]["samples"] == [0, 32]


def check_vllm_grpo(d, stdout):
    assert d and all(finite(r["step_s"], r["loop_tok_s"], r["standalone_tok_s"], r["canary_k3_max"]) for r in d)
    if d[0]["engine"] == "hf":
        assert "vllm is not installed" in stdout and [r["mode"] for r in d] == ["hf"]
        assert d[0]["canary_maxdiff_max"] < 1e-3  # float32, one model: it samples from the weights being trained
    else:  # the vLLM engine: its adapter sync timed, the trainer's base a view of vLLM's weights, then not
        assert [r["mode"] for r in d] == ["shared", "unshared"] and all(finite(r["sync_s_per_step"]) for r in d)
        assert d[0]["shared_mib"] > 0 and d[1]["shared_mib"] == 0


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


def test_every_benchmark_has_a_smoke_mode_and_a_check():
    scripts = {p.stem: p.read_text() for p in (REPO / "benchmarks").glob("*.py")}
    runs = {name.partition("@")[0] for name in SCRIPTS}
    assert runs == set(CHECKS)
    assert set(scripts) == runs | set(COVERED_ELSEWHERE), "a new benchmark needs a --smoke mode and a check here"
    assert [s for s, text in scripts.items() if '"--smoke"' not in text] == []


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke(script, smokes):
    if script not in smokes:
        pytest.skip(f"benchmarks/{script}.py: {NEEDS[script][1]}")
    r = smokes[script].result()
    tail = (r["stdout"][-2000:] + "\n" + r["stderr"][-4000:]).strip()
    assert r["rc"] == 0, f"{script} --smoke exited {r['rc']}:\n{tail}"
    assert r["json"] is not None, f"{script} --smoke wrote no JSON:\n{tail}"
    name, _, venv = script.partition("@")
    print(f"benchmarks/{name}.py --smoke{f' (.venv-{venv})' if venv else ''}: {r['wall_s']:.0f} s")
    CHECKS[name](r["json"], r["stdout"])


def test_server_rollout_serves_a_gguf_presets_model_from_a_float_copy(tmp_path):
    """server_rollout.py's GGUF step (vLLM serves no GGUF): the copy it makes of a preset's GGUF model is a folder
    transformers loads with the same logits (the SmolLM2 arm once failed here, which the tiny smoke never reaches);
    a preset whose model is not GGUF gets None. A small random qwen2 model with a byte-level tokenizer, written to GGUF
    by tinyrl's own writer, stands in for SmolLM2's file."""
    pytest.importorskip("gguf", reason="the gguf extra: pip install 'tinyrl-rlvr[gguf]'")
    import importlib.util

    import torch
    import yaml
    from gguf_helpers import byte_level_tokenizer, random_model
    from transformers import AutoModelForCausalLM

    from tinyrl.gguf_export import write_gguf

    spec = importlib.util.spec_from_file_location("server_rollout", REPO / "benchmarks" / "server_rollout.py")
    server_rollout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server_rollout)
    tok = byte_level_tokenizer()
    model = random_model("qwen2", len(tok)).eval()
    gguf_file = write_gguf(model, tok, tmp_path / "small.gguf", "f32")
    preset = tmp_path / "gguf_preset.yaml"
    preset.write_text(yaml.safe_dump({"model": {"name": str(gguf_file)}}))
    out = server_rollout.gguf_to_folder(str(preset), tmp_path / "copy")
    assert out == str(tmp_path / "copy") and (tmp_path / "copy" / "config.json").is_file()
    ids = torch.tensor([tok("the 12 cats")["input_ids"]])
    with torch.no_grad():
        want = model(ids).logits
        got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(ids).logits
    assert torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())
    assert server_rollout.gguf_to_folder("tiny_grpo_cpu", tmp_path / "none") is None
    assert not (tmp_path / "none").exists()


def _bad_export(tmp: Path, kind: str) -> tuple[str, str]:
    """(the --export value, words the refusal must hold) for one bad destination, built in tmp."""
    if kind == "empty":
        return "", "empty"
    if kind == "blank":
        return "   ", "empty"
    if kind == "a file":
        (tmp / "f.txt").write_text("x")
        return str(tmp / "f.txt"), "is not a folder"
    if kind == "a FIFO":
        os.mkfifo(tmp / "pipe")
        return str(tmp / "pipe"), "is not a folder"
    if kind == "a device":
        return "/dev/null", "is not a folder"
    if kind == "a name over 255 bytes":
        return str(tmp / ("x" * 300)), "over 255 bytes"
    (tmp / "d").mkdir()
    manifest = tmp / "d" / "cases.json"
    if kind == "cases.json a FIFO":  # reading it would block: refused unread
        os.mkfifo(manifest)
        return str(tmp / "d"), "not a regular file"
    manifest.write_text({"cases.json not JSON": "[1,", "cases.json a list": "[1]",
                         "cases.json a format spec": "%s{0}"}[kind])
    return str(tmp / "d"), "cases.json"


@pytest.mark.parametrize("kind", ["empty", "blank", "a file", "a FIFO", "a device", "a name over 255 bytes",
                                  "cases.json a FIFO", "cases.json not JSON", "cases.json a list",
                                  "cases.json a format spec"])
def test_monitor_calibration_refuses_a_bad_export_folder_before_any_run(tmp_path, kind):
    """--export is checked as the command line is read (before runs that can take hours): the refusal names the
    option and what is wrong, exit 2, no traceback, nothing written."""
    value, words = _bad_export(tmp_path, kind)
    before = sorted(tmp_path.rglob("*"))
    p = subprocess.run([sys.executable, "benchmarks/monitor_calibration.py", "--replay", str(tmp_path / "none"),
                        "--export", value], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "argument --export" in p.stderr and words in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and sorted(tmp_path.rglob("*")) == before
