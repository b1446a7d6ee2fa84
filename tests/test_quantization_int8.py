"""model.quantization int8 / fp8 on the HF engine: the base's linears quantized weight-only by torchao,
LoRA trained through peft's TorchaoLoraLinear (issue #43). The vLLM side: tests/rollout/test_vllm_int8.py."""

import dataclasses
import importlib.util
import math
import sys

import pytest
import torch

from tinyrl.config import ConfigError, config_from_dict, load_config

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="needs torchao (pip install 'tinyrl-rlvr[torchao]')")


def policy(name: str, quantization: str, **lora):
    from tinyrl.model import load_policy

    cfg = config_from_dict({"model": {"name": name, "quantization": quantization},
                            "lora": {"r": 4, "alpha": 8, **lora}})
    torch.manual_seed(0)
    return load_policy(cfg.model, cfg.lora)


# ------------------------------------------------------------------ config and install errors


def test_quantization_and_load_in_4bit_are_exclusive_and_named():
    with pytest.raises(ConfigError, match=r"model\.quantization: 'int8' and model\.load_in_4bit: true are exclusive"):
        config_from_dict({"model": {"quantization": "int8", "load_in_4bit": True}})
    with pytest.raises(ConfigError, match=r"model\.quantization: .*'none', 'int8', 'fp8'"):
        config_from_dict({"model": {"quantization": "int4"}})
    with pytest.raises(ConfigError, match=r"model\.quantization: 'fp8' needs model\.backend: transformers"):
        config_from_dict({"model": {"quantization": "fp8", "backend": "unsloth"}})
    assert config_from_dict({"model": {"load_in_4bit": True}}).model.quantization == "none"


def test_missing_torchao_names_the_extra(monkeypatch):
    from tinyrl.model.quantize import ao_config

    monkeypatch.setitem(sys.modules, "torchao", None)  # `import torchao` raises ImportError
    with pytest.raises(ImportError, match=r"model\.quantization 'int8' needs torchao: pip install 'tinyrl-rlvr\[torchao\]'"):
        ao_config("int8")


@needs_torchao
def test_pinned_torchao_internals():
    """What tinyrl/model/quantize.py relies on in torchao: fails loudly when a release moves it."""
    import torchao
    from packaging.version import Version

    from tinyrl.model.quantize import QUANTIZATIONS, TENSOR_TYPES, TORCHAO_INTERNALS, TORCHAO_RANGE, import_torchao

    import_torchao()  # inside TORCHAO_RANGE
    assert Version(TORCHAO_RANGE[0]) <= Version(Version(torchao.__version__).base_version) < Version(TORCHAO_RANGE[1])
    for module, names in TORCHAO_INTERNALS.items():
        if module != "tensor":
            mod = importlib.import_module(module)
            assert all(hasattr(mod, n) for n in names), (module, [n for n in names if not hasattr(mod, n)])
    from torchao.quantization import PerRow, quantize_

    for name in ("int8", "fp8"):
        cfg = QUANTIZATIONS[name]()
        assert isinstance(cfg.granularity, PerRow) or (name == "fp8" and cfg.granularity is None)
        lin = torch.nn.Sequential(torch.nn.Linear(64, 48))
        quantize_(lin, cfg)
        w = lin[0].weight
        assert type(w).__name__ == TENSOR_TYPES[name]
        assert all(hasattr(w, n) for n in TORCHAO_INTERNALS["tensor"]) and list(w.tensor_data_names) == ["qdata", "scale"]
        assert w.qdata.element_size() == 1 and tuple(w.scale.shape) == (48, 1)  # 1 byte a weight, 1 scale a row
        rows = w[16:32]  # a row slice (q out of a fused qkv) is a view of the same storage
        assert type(rows).__name__ == TENSOR_TYPES[name]
        assert rows.qdata.untyped_storage().data_ptr() == w.qdata.untyped_storage().data_ptr()


@needs_torchao
def test_row_scales_make_fused_and_split_quantization_equal():
    """vLLM quantizes q/k/v fused; the HF path quantizes them one by one: per-row scales make these equal."""
    from torchao.quantization import quantize_

    from tinyrl.model.quantize import QUANTIZATIONS

    torch.manual_seed(0)
    fused = torch.nn.Sequential(torch.nn.Linear(32, 96, bias=False))
    parts = [torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False)) for _ in range(3)]
    with torch.no_grad():
        for i, p in enumerate(parts):
            p[0].weight.copy_(fused[0].weight[32 * i: 32 * (i + 1)])
    for name in ("int8", "fp8"):
        a = torch.nn.Sequential(torch.nn.Linear(32, 96, bias=False))
        a.load_state_dict(fused.state_dict())
        quantize_(a, QUANTIZATIONS[name]())
        for i, p in enumerate(parts):
            b = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False))
            b.load_state_dict(p.state_dict())
            quantize_(b, QUANTIZATIONS[name]())
            sl = a[0].weight[32 * i: 32 * (i + 1)]
            assert torch.equal(sl.qdata, b[0].weight.qdata) and torch.equal(sl.scale, b[0].weight.scale)


# ------------------------------------------------------------------ the loaded policy


@needs_torchao
@pytest.mark.parametrize("quantization,tensor", [("int8", "Int8Tensor"), ("fp8", "Float8Tensor")])
def test_load_quantizes_the_linears_not_the_head_and_lora_trains(tiny_model_dir, quantization, tensor):
    from tinyrl.model.quantize import is_quantized, quantized_bytes

    ref, _ = policy(tiny_model_dir, "none")
    model, _ = policy(tiny_model_dir, quantization)
    base = model.get_base_model()
    linears = {n: type(p).__name__ for n, p in base.named_parameters() if is_quantized(p)}
    assert len(linears) == 2 * 7 and set(linears.values()) == {tensor}
    assert not is_quantized(base.lm_head.weight) and not is_quantized(base.model.embed_tokens.weight)
    assert type(base.model.layers[0].self_attn.q_proj).__name__ == "TorchaoLoraLinear"
    q = base.model.layers[0].self_attn.q_proj.base_layer.weight
    assert quantized_bytes(q) == q.numel() + 4 * q.shape[0]  # 1 byte a weight + an fp32 scale a row
    ids = torch.tensor([[3, 4, 12, 5, 13, 8, 1], [6, 7, 12, 8, 9, 13, 1]])
    with torch.no_grad():
        gap = (model(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max()
    assert 0 < gap < 0.5  # the quantized base: near the float one, not equal to it
    with torch.no_grad():  # lora_B starts at 0: give lora_A a gradient to carry
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert len(grads) == 2 * 2 * 7
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


@needs_torchao
def test_merged_decode_matches_peft_on_a_quantized_base(tiny_model_dir):
    """The HF rollout's merged linears dequantize a torchao weight and add the LoRA delta: same logits."""
    from tinyrl.model import merged_lora_linears

    model, _ = policy(tiny_model_dir, "int8")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ids = torch.tensor([[3, 4, 12, 5, 13, 8, 1]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with merged_lora_linears(model, budget=1 << 30, dequantize=True) as n:
            merged = model(input_ids=ids).logits
    assert n == 2 * 7
    assert (plain - merged).abs().max() < 1e-4


# ------------------------------------------------------------------ a short run learns


@needs_torchao
def test_a_short_int8_run_learns_the_default_task(tmp_path):
    """tiny-arith's default task (two-digit addition) with model.quantization=int8: finite losses and
    gradients every step, and held-out accuracy rises (from ~44%; 16-bit and int8 both reach ~80% at
    30 steps)."""
    from tinyrl.api import train

    run = train(**{"model.quantization": "int8", "train.steps": 30, "data.num_eval": 100,
                   "log.run_dir": str(tmp_path), "log.progress": False})
    rows = run.metrics
    assert len(rows) == 30
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert sum(r["grad_norm"] > 0 for r in rows) >= 25 and not any(r["skipped_nonfinite"] for r in rows)
    assert run.eval_after >= run.eval_before + 0.15, (run.eval_before, run.eval_after)


# ------------------------------------------------------------------ the planner


def test_planner_counts_one_byte_a_weight_plus_row_scales_and_one_copy():
    from tinyrl.planner import memory as M
    from tinyrl.planner.arch import ARCHITECTURES
    from tinyrl.planner.plan import build

    a = ARCHITECTURES["qwen2.5-7b-instruct"]
    base = M.Setup(a, "cuda", 2, False, 16, M.LINEAR_NAMES, True, 4, 8, 2, 256, 256, "vllm")
    int8 = dataclasses.replace(base, quantization="int8")
    rows = sum(o for _, o, _ in a.linears().values())
    assert M.weight_bytes(int8)["linears"] == a.linear_weight_params + 4 * a.num_layers * rows
    assert M.weight_bytes(int8)["embeddings"] == M.weight_bytes(base)["embeddings"]  # 16-bit, as vLLM keeps it
    assert M.vllm_weight_bytes(int8) == sum(M.weight_bytes(int8).values())  # vLLM holds the int8 base itself
    gib = 2 ** 30
    p16, p8 = build(base, 24 * gib), build(int8, 24 * gib)
    names = [r.name for r in p8.rows]
    assert "base weights: linears (int8) (shared with vLLM: one copy)" in names
    assert not any(n.startswith("vLLM weights") for n in names)  # no second copy
    startup = {r.name: r for r in p8.rows if r.phase == "startup"}
    held = startup["startup: trainer LoRA params on the card"]
    assert held.bytes == 4 * M.lora_params(int8) and held.note == "its int8 base waits in host RAM"
    assert p8.phases["startup"] < p16.phases["startup"] and p8.peak < p16.peak


def test_tinyrl_plan_sets_qlora_beside_the_shared_int8_base():
    from tinyrl.plan_report import FORMATS, base_bytes, compare_formats, run

    _, cfg = load_config("qwen2.5-7b_grpo_math_gpu", [], profile="24gb")
    plans = dict(compare_formats(cfg, "cuda", 24 * 10 ** 9))
    assert list(plans) == [f[0] for f in FORMATS]
    nf4_vllm, nf4_hf, int8 = (plans[FORMATS[i][0]] for i in (1, 2, 3))
    assert base_bytes(nf4_vllm) > 2 * base_bytes(int8) > base_bytes(nf4_hf)  # nf4 + a 16-bit copy vs one int8 copy
    assert not nf4_vllm.fits and int8.fits and nf4_hf.fits
    plan, text = run("qwen2.5-7b_grpo_math_gpu", [], profile="16gb", search=False)
    assert plan.fits and plan.setup.quantization == "int8" and plan.setup.engine == "vllm"
    assert "base formats side by side" in text and "int8 (torchao), vLLM rollout (one shared copy)" in text


# ------------------------------------------------------------------ the vLLM engine's share checks (no vLLM needed)


@needs_torchao
def test_share_checks_accept_equal_slices_and_refuse_a_second_copy(tiny_model_dir):
    """`_why_not_shared` on torchao weights (vLLM's rows sliced out of a fused matrix), and the start-up
    check that refuses to run an int8 base held twice. The engine itself: tests/rollout/test_vllm_int8.py."""
    from torchao.quantization import quantize_

    from tinyrl.model.quantize import QUANTIZATIONS
    from tinyrl.rollout.vllm import ShareReport, _why_not_shared, check_quantized_shared, checkpoint_name

    model, _ = policy(tiny_model_dir, "int8")
    float_q = policy(tiny_model_dir, "none")[0].get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    q = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    fused = torch.nn.Sequential(torch.nn.Linear(q.in_features, 3 * q.out_features, bias=False))
    with torch.no_grad():
        fused[0].weight[:q.out_features] = float_q  # q's float rows inside a fused q/k/v, quantized at once
    quantize_(fused, QUANTIZATIONS["int8"]())
    rows = fused[0].weight[:q.out_features]
    assert _why_not_shared(q.weight, rows) is None
    other = fused[0].weight[q.out_features: 2 * q.out_features]
    assert _why_not_shared(q.weight, other) == "values differ (quantized data or scales)"
    assert _why_not_shared(q.weight, q.weight.dequantize()).startswith("layout differs")
    names = [checkpoint_name(n) for n, p in model.named_parameters() if not p.requires_grad and "proj" in n]
    assert check_quantized_shared(ShareReport(shared={n: 0 for n in names}), model) == 14
    one_copied = ShareReport(shared={n: 0 for n in names[1:]}, copied={names[0]: "values differ"})
    with pytest.raises(RuntimeError, match=r"1 quantized linears are not shared with vLLM .* held twice"):
        check_quantized_shared(one_copied, model)
