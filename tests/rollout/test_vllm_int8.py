"""One int8 (torchao) base shared by vLLM and the trainer (`model.quantization: int8`, issue #43); fp8 once.

Runs for real on vLLM's CPU build (the .venv-vllm of scripts/vllm_test_env.sh, with torchao 0.18);
skipped where vllm or torchao is missing. For each of a Llama-, a Qwen2- (q/k/v biases, tied
embeddings) and a Qwen3-shaped (q/k norms) tiny random model with GQA, one engine is built per
module and checked: the trainer's frozen tensors live in vLLM's storages (the count of distinct
storages is the same with and without the trainer), greedy parity, finite non-zero LoRA
gradients, vLLM's weights untouched by an update, and the adapter sync reaching vLLM.
"""

import pytest
import torch

from tinyrl.rollout.base import SamplingParams

PROMPTS = ["1+2=", "34+56=", "7+8="]


def make_model(path, arch: str, seed: int = 0) -> str:
    """A tiny random model of `arch` over the arithmetic characters (head_dim 32: vLLM CPU's smallest)."""
    import transformers

    from tests.conftest import make_tiny_model

    make_tiny_model(path, hidden=128)  # its tokenizer (and a Llama we overwrite for the other shapes)
    if arch == "llama":
        return str(path)
    common = dict(vocab_size=15, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    if arch == "qwen2":  # q/k/v biases, tied embeddings (as Qwen2.5-0.5B)
        cfg, cls = transformers.Qwen2Config(tie_word_embeddings=True, **common), transformers.Qwen2ForCausalLM
    else:  # qwen3: q/k norms, head_dim given
        cfg, cls = transformers.Qwen3Config(head_dim=32, tie_word_embeddings=False, **common), transformers.Qwen3ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg)
    if arch == "qwen2":
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.Linear) and m.bias is not None:
                    m.bias.normal_(0, 0.5)  # non-zero biases, so a bias lost in the split would show
    model.save_pretrained(path)
    return str(path)


def storages(tensors) -> set[int]:
    """Distinct storages behind `tensors` (a torchao weight counts its data and its scales)."""
    from tinyrl.model.quantize import inner_tensors

    return {t.untyped_storage().data_ptr() for x in tensors for t in inner_tensors(x.data if hasattr(x, "data") else x)}


def frozen(model):
    return [p for n, p in model.named_parameters() if not p.requires_grad]


def trainer_logprobs(model, r, temperature=1.0):
    from tinyrl.update import score_logprobs

    return score_logprobs(model, r, temperature, micro_batch=16, chunk_size=16, impl="torch")


def max_gap(batch, lp):
    m = batch.completion_mask.bool()
    return float((batch.sampling_logprobs[m] - lp[m]).abs().max())


def perturb_adapter(model, scale=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "llama-fp8"])
def setup(request, tmp_path_factory):
    pytest.importorskip("vllm")
    pytest.importorskip("torchao")
    from tinyrl.config import config_from_dict
    from tinyrl.model import load_policy
    from tinyrl.rollout.vllm import VLLMEngine, vllm_model

    arch, _, quant = request.param.partition("-")
    path = make_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
    cfg = config_from_dict({"model": {"name": path, "quantization": quant or "int8"}, "lora": {"r": 4, "alpha": 8},
                            "rollout": {"engine": "vllm", "max_model_len": 64}})
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model, cfg.lora)
    trainer_before = storages(frozen(model))
    eng = VLLMEngine.from_run(model, tok, cfg, seed=0)
    vm = vllm_model(eng.llm)
    yield dict(arch=arch, quantization=quant or "int8", model=model, tok=tok, engine=eng, vm=vm, trainer_before=trainer_before)
    eng.close()


def test_the_trainer_holds_no_base_of_its_own(setup):
    """Every frozen tensor of the trainer (linears' int8 data and scales, embeddings, head, norms) lives
    in one of vLLM's storages: the count of distinct storages is vLLM's alone."""
    from tinyrl.model.quantize import TENSOR_TYPES, is_quantized

    model, vm, report = setup["model"], setup["vm"], setup["engine"].share
    assert not report.copied, report.summary()
    vllm_only = storages(vm.parameters())
    assert storages(frozen(model)) <= vllm_only
    assert len(vllm_only | storages(frozen(model))) == len(vllm_only)
    assert setup["trainer_before"].isdisjoint(vllm_only)  # before sharing: the trainer's own copy
    linears = [n for n, p in model.named_parameters() if is_quantized(p)]
    assert len(linears) == 2 * 7  # q, k, v, o, gate, up, down per layer: all quantized, all shared
    tensor = TENSOR_TYPES[setup["quantization"]]
    assert type(vm.model.layers[0].self_attn.qkv_proj.base_layer.weight).__name__ == tensor


def test_greedy_parity_and_logprobs_trainer_vs_vllm(setup):
    from tinyrl.rollout.hf import HFEngine

    model, tok, eng = setup["model"], setup["tok"], setup["engine"]
    params = SamplingParams(max_new_tokens=8)
    v = eng.generate(PROMPTS, n=1, params=params, greedy=True)
    h = HFEngine(model, tok, seed=0).generate(PROMPTS, n=1, params=params, greedy=True)
    assert torch.equal(v.completion_ids, h.completion_ids)
    r = eng.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))
    assert max_gap(r, trainer_logprobs(model, r)) < 1e-4


def test_update_trains_the_adapter_leaves_vllm_weights_and_sync_reaches_vllm(setup):
    from tinyrl.model.quantize import inner_tensors

    model, eng, vm = setup["model"], setup["engine"], setup["vm"]
    before = [t.clone() for p in vm.parameters() for t in inner_tensors(p.data)]
    greedy = SamplingParams(max_new_tokens=8)
    g0 = eng.generate(PROMPTS, n=1, params=greedy, greedy=True)
    perturb_adapter(model, seed=1)  # lora_B starts at 0: give A a gradient to carry
    ids = torch.tensor([[3, 4, 12, 5, 13, 8, 1], [6, 7, 12, 8, 9, 13, 1]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads.values())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    opt.step()
    opt.zero_grad()
    after = [t for p in vm.parameters() for t in inner_tensors(p.data)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # the shared base is frozen
    eng.sync(model)
    g1 = eng.generate(PROMPTS, n=1, params=greedy, greedy=True)
    assert not torch.equal(g0.completion_ids, g1.completion_ids)  # the new adapter reached vLLM
    r = eng.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=12))
    assert max_gap(r, trainer_logprobs(model, r)) < 1e-4


def test_pinned_torchao_in_vllm(setup):
    """vLLM's torchao method (the path tinyrl hands the config to) is where tinyrl expects it."""
    from vllm.model_executor.layers.quantization.torchao import TorchAOConfig

    from tinyrl.model.quantize import vllm_quantization

    kw = vllm_quantization("int8")
    cfg = TorchAOConfig.from_config_dict_json(kw["hf_overrides"]["quantization_config_dict_json"])
    assert type(cfg.torchao_config).__name__ == "Int8WeightOnlyConfig"


def test_a_short_int8_run_on_the_vllm_engine_learns_the_default_task(tmp_path):
    """tiny-arith's default task with model.quantization=int8 and rollout.engine=vllm: held-out accuracy
    rises (from ~44%), and every step vLLM's logprobs equal the trainer's (one shared int8 base)."""
    pytest.importorskip("vllm")
    pytest.importorskip("torchao")
    from tinyrl.api import train

    run = train(**{"model.quantization": "int8", "rollout.engine": "vllm", "rollout.max_model_len": 64,
                   "train.steps": 30, "data.num_eval": 100, "log.run_dir": str(tmp_path), "log.progress": False})
    assert len(run.metrics) == 30
    assert all(r["rollout_trainer_maxdiff"] < 1e-4 for r in run.metrics)
    assert run.eval_after >= run.eval_before + 0.15, (run.eval_before, run.eval_after)
