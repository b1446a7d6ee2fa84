"""The memory planner (issue 18): its formulas against real tensors, and `tinyrl plan` on every preset.

What is measured here is real: parameter counts and bytes of models built from a config,
peft's trainable LoRA parameters, the bytes autograd saves in a forward of the decoder stack
(collected with torch.autograd.graph.saved_tensors_hooks, each storage counted once), and the
KV cache a transformers forward actually allocates. Peak RSS against the plan is in
benchmarks/memory_validation.py and docs/memory.md (RSS is a benchmark, not a test).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from tinyrl.config import list_presets, load_config, read_preset
from tinyrl.errors import ConfigError
from tinyrl.planner import ARCHITECTURES, GPUS, build, kv_cache_bytes, largest, parse_memory, plan_config
from tinyrl.planner import memory as M
from tinyrl.planner.arch import from_config, resolve_arch


def llama_cfg(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0,
                eos_token_id=1, bos_token_id=None)
    return LlamaConfig(**{**base, **kw})


def qwen_cfg(**kw):
    from transformers import Qwen2Config

    base = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0,
                eos_token_id=1, bos_token_id=None)
    return Qwen2Config(**{**base, **kw})


def build_model(cfg, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(dtype)


def setup_for(arch, **kw):
    base = dict(arch=arch, device="cpu", dtype_bytes=4, load_in_4bit=False, lora_r=8, targets=M.LINEAR_NAMES,
                gradient_checkpointing=False, prompts=2, generations=4, micro_batch=8, prompt_tokens=24,
                new_tokens=40, engine="hf")
    return M.Setup(**{**base, **kw})


# --------------------------------------------------------------------------- weights and LoRA


@pytest.mark.parametrize("make", [llama_cfg, qwen_cfg], ids=["llama-untied", "qwen2-tied-qkv-bias"])
def test_parameter_count_and_bytes_match_a_built_model(make):
    cfg = make()
    arch = from_config(cfg.to_dict(), name="t")
    for dtype, nbytes in ((torch.float32, 4), (torch.bfloat16, 2)):
        model = build_model(cfg, dtype)
        params = {p.data_ptr(): p for p in model.parameters()}  # tied weights once
        assert arch.num_params == sum(p.numel() for p in params.values())
        s = setup_for(arch, dtype_bytes=nbytes)
        assert sum(M.weight_bytes(s).values()) == sum(p.numel() * p.element_size() for p in params.values())


def test_offline_table_matches_qwen_configs_built_by_transformers():
    """Qwen2.5-0.5B's table entry built as a transformers model (meta device: no memory) has its
    published parameter count (494,032,768)."""
    from transformers import AutoModelForCausalLM

    a = ARCHITECTURES["qwen2.5-0.5b-instruct"]
    cfg = qwen_cfg(vocab_size=a.vocab_size, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
                   num_hidden_layers=a.num_layers, num_attention_heads=a.num_heads, num_key_value_heads=a.num_kv_heads)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == a.num_params == 494_032_768


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], ["down_proj", "lm_head"]])
def test_lora_parameter_count_matches_peft(targets):
    from tinyrl.model import add_lora

    cfg = llama_cfg()
    arch = from_config(cfg.to_dict())
    model = add_lora(build_model(cfg), SimpleNamespace(r=8, alpha=16, dropout=0.0, target_modules=targets))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    s = setup_for(arch, targets=M.resolve_targets(targets, arch))
    assert M.lora_params(s) == trainable


# --------------------------------------------------------------------------- activations and KV cache


class SavedTensors:
    """Bytes autograd saves inside the block, each storage once (views of one tensor share it); the
    model's own parameters (saved by reference, already counted as weights) left out."""

    def __init__(self, model):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: dict[int, int] = {}

    def pack(self, t):
        st = t.untyped_storage()
        if st.data_ptr() not in self.params:
            self.seen[st.data_ptr()] = st.nbytes()
        return t

    def bytes(self) -> int:
        return sum(self.seen.values())


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_saved_activations_match_autograd(checkpointing, targets):
    """The trunk's saved tensors in a forward of the decoder stack, as the update runs it (left-padded
    rows, frozen base, LoRA): the planner's count within 5% of what autograd holds; under
    gradient checkpointing that is each layer's input."""
    from tinyrl.model import add_lora, trunk_of

    cfg = llama_cfg(num_hidden_layers=3)
    arch = from_config(cfg.to_dict())
    model = add_lora(build_model(cfg), SimpleNamespace(r=8, alpha=16, dropout=0.0, target_modules=targets),
                     gradient_checkpointing=checkpointing)
    model.train()
    rows, S = 6, 48
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 300, (rows, S), generator=g)
    attn = torch.ones(rows, S, dtype=torch.long)
    attn[:3, :5] = 0  # left padding on half the rows
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    saved = SavedTensors(model)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        hidden = trunk_of(model)(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
    hidden.sum().backward()
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)
    s = setup_for(arch, targets=M.resolve_targets(targets, arch), gradient_checkpointing=checkpointing,
                  prompt_tokens=16, new_tokens=S - 16)
    # without checkpointing the mask and rope tables are saved by the layers; with it they are inputs
    predicted = M.forward_saved_bytes(s, rows) + (0 if checkpointing else M.shared_bytes(s, rows))
    measured = saved.bytes()
    assert abs(predicted - measured) / measured < 0.05, (predicted, measured)
    # Under checkpointing the backward rebuilds one layer at a time inside torch.utils.checkpoint, whose
    # own hooks hide it from these; what it rebuilds is one layer's saved tensors, the plain case's.


def test_activations_grow_with_rows_and_length_and_checkpointing_saves():
    a = ARCHITECTURES["qwen2.5-1.5b-instruct"]
    s = setup_for(a, dtype_bytes=2, prompt_tokens=256, new_tokens=512)
    one, two = M.trunk_activation_bytes(s, 1), M.trunk_activation_bytes(s, 2)
    longer = M.trunk_activation_bytes(dataclasses.replace(s, new_tokens=1024), 1)
    ckpt = M.trunk_activation_bytes(dataclasses.replace(s, gradient_checkpointing=True), 1)
    assert 0 < one < two <= 2 * one + 1 and one < longer and ckpt < one / 4


def test_kv_cache_formula_matches_a_transformers_forward():
    """2 x layers x kv_heads x head_dim x bytes x tokens: the DynamicCache a real forward builds."""
    cfg = qwen_cfg(num_hidden_layers=3, num_key_value_heads=2)
    arch = from_config(cfg.to_dict())
    model = build_model(cfg).eval()
    with torch.no_grad():
        out = model(input_ids=torch.randint(2, 300, (5, 37)), use_cache=True)
    cache = out.past_key_values
    nbytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert kv_cache_bytes(arch, 5, 37, 4) == nbytes
    # vLLM rounds each sequence up to 16-token blocks
    assert kv_cache_bytes(arch, 5, 37, 4, block=16) == kv_cache_bytes(arch, 5, 48, 4)


@pytest.mark.parametrize("shape", [(4864, 896), (896, 128), (300, 7)])
def test_nf4_bytes_match_bitsandbytes(shape):
    """nf4 with double quant: the packed codes, the uint8 absmax, its fp32 scales, the code books."""
    F = pytest.importorskip("bitsandbytes.functional")
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    q, st = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    tensors = [q, st.absmax, st.code, st.offset, st.state2.absmax, st.state2.code]
    assert M.nf4_bytes(w.numel()) == sum(t.numel() * t.element_size() for t in tensors)
    q1, st1 = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    assert M.nf4_bytes(w.numel(), double_quant=False) == sum(t.numel() * t.element_size()
                                                             for t in (q1, st1.absmax, st1.code))


# --------------------------------------------------------------------------- plans of every preset


def preset_cases():
    out = []
    for name in list_presets():
        profiles = (read_preset(name)[1].get("profiles") or {})
        out += [(name, None)] + [(name, p) for p in profiles]
    return out


@pytest.mark.parametrize("preset,profile", preset_cases())
def test_plan_of_every_preset_and_profile(preset, profile):
    """Values positive; the peak grows with micro-batch, generations and length; the verdict flips
    where memory runs out, and `largest` finds the edge."""
    from tinyrl.plan_report import budget_for
    from tinyrl.planner.gpus import world_size_of

    _, cfg = load_config(preset, profile=profile)
    device, budget, _ = budget_for(cfg, None, None, profile)
    p = plan_config(cfg, device, budget, world_size=world_size_of(profile))
    assert all(r.bytes >= 0 for r in p.rows) and p.peak > 0 and all(v > 0 for v in p.phases.values())
    s = p.setup
    grow = {"update": dataclasses.replace(s, micro_batch=2 * s.micro_batch, prompts=2 * s.prompts),
            "rollout": dataclasses.replace(s, generations=2 * s.generations, eval_rows=0),
            "update ": dataclasses.replace(s, new_tokens=2 * s.new_tokens)}
    no_eval = build(dataclasses.replace(s, eval_rows=0), budget)  # the HF rollout's peak may be the evaluation's
    for phase, bigger in grow.items():  # the phase the knob acts on grows; the peak never shrinks
        b = build(bigger, budget)
        before = no_eval if phase == "rollout" else p
        if b.vllm is None and before.vllm is None:  # with vLLM its share is sized from what the update
            assert b.peak >= before.peak, phase  # leaves, so the total may fall while the phase grows
        if phase == "rollout" and b.vllm and b.vllm[1] < bigger.rows:
            continue  # vLLM's share is capped by the card: the rollout runs in waves of max_num_seqs instead
        assert b.phases[phase.strip()] > before.phases[phase.strip()], phase
    if profile is not None:  # the shipped GPU presets fit the card their profile names
        assert p.fits, (preset, profile, p.peak / 2**30, p.budget / 2**30, p.problems)
    if p.vllm is None:  # vLLM's share is a fraction of the card: a smaller card is another plan, not the edge
        tight = build(s, int(p.peak * 0.9))
        assert not tight.fits and build(s, int(p.peak * 1.01) + 1).fits == (not p.problems)
    g = largest(s, budget, "generations", hi=4 * s.generations)
    if g is not None and p.fits:
        assert g >= s.generations and build(dataclasses.replace(s, generations=g), budget).fits


def test_largest_is_the_edge():
    a = ARCHITECTURES["qwen2.5-0.5b-instruct"]
    s = setup_for(a, device="cuda", dtype_bytes=2, prompts=8, generations=8, micro_batch=8, prompt_tokens=256,
                  new_tokens=512, gradient_checkpointing=True)
    budget = 12 * 2**30
    n = largest(s, budget, "new_tokens", hi=32768)
    assert n and build(dataclasses.replace(s, new_tokens=n), budget).fits
    assert not build(dataclasses.replace(s, new_tokens=n + 1), budget).fits
    mb = largest(s, budget, "micro_batch")
    assert mb and s.rows % mb == 0 and build(dataclasses.replace(s, micro_batch=mb), budget).fits


def test_vllm_settings_hold_the_whole_rollout_on_a_big_card_and_wave_on_a_small_one():
    from tinyrl.planner.plan import vllm_settings_for

    a = ARCHITECTURES["qwen2.5-1.5b-instruct"]
    s = setup_for(a, device="cuda", dtype_bytes=2, engine="vllm", prompts=16, generations=8, micro_batch=16,
                  prompt_tokens=256, new_tokens=1024, gradient_checkpointing=True)
    util, seqs = vllm_settings_for(s, GPUS["H100"])
    assert 0 < util < 0.9 and seqs == s.rows
    assert util * GPUS["H100"] >= kv_cache_bytes(a, s.rows, s.seq, 2, block=16) + a.num_params * 2
    small_util, small_seqs = vllm_settings_for(dataclasses.replace(s, generations=64), GPUS["T4"])
    assert small_seqs < 16 * 64 and small_util <= 1


def test_trainer_settings_come_from_the_plan_not_the_fixed_default():
    """vllm_settings(cfg, card) is what make_llm passes to vLLM on CUDA: it changes with the card."""
    from tinyrl.planner import vllm_settings

    _, cfg = load_config("qwen2.5-1.5b_grpo_math_gpu", profile="24gb")
    u24, n24 = vllm_settings(cfg, GPUS["L4"], prompt_tokens=200)
    u80, n80 = vllm_settings(cfg, GPUS["H100"], prompt_tokens=200)
    assert u80 < u24 < 1 and n24 >= 1 and n80 >= n24


def test_arch_from_the_shipped_model_reads_its_config_json():
    a = resolve_arch("tiny-arith")
    assert "config.json" in a.source and a.hidden_size == 128 and a.num_layers == 2
    assert "offline table" in resolve_arch("Qwen/Qwen2.5-7B-Instruct").source
    with pytest.raises(ValueError, match="offline table"):
        resolve_arch("nobody/unknown-model")


def test_memory_strings():
    assert parse_memory("24GB") == 24 * 2**30 and parse_memory("16GiB") == 16 * 2**30
    with pytest.raises(ConfigError, match="--gpu-mem"):
        parse_memory("lots")


# --------------------------------------------------------------------------- the CLI


def cli(capsys, *args):
    from tinyrl.cli import main

    code = main(["plan", *args])
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def test_cli_plan_prints_the_table_and_the_verdict(capsys):
    out = cli(capsys, "qwen2.5-0.5b_grpo_math_gpu", "--gpu", "4090", "--prompt-len", "200")
    assert out.returncode == 0, out.stderr
    for words in ("base weights", "LoRA r=", "activations", "fused loss", "vLLM KV cache", "CUDA context",
                  "verdict: FITS", "largest that fit", "rollout.num_generations="):
        assert words in out.stdout, words


def test_cli_plan_exit_1_when_it_does_not_fit_and_2_on_a_bad_card(capsys):
    out = cli(capsys, "qwen2.5-7b_grpo_math_gpu", "--gpu-mem", "8GB", "--prompt-len", "200", "--no-search",
              "model.load_in_4bit=false", "rollout.engine=hf")
    assert out.returncode == 1 and "DOES NOT FIT" in out.stdout
    bad = cli(capsys, "tiny_grpo_cpu", "--gpu", "Z80")
    assert bad.returncode == 2 and "--gpu 'Z80': must be one of" in bad.stderr


@pytest.mark.parametrize("preset", [n for n in list_presets() if n.endswith("_gpu")])
def test_gpu_preset_header_states_the_planners_estimate(preset):
    """Each GPU preset's `# Memory:` header gives, per profile, what `tinyrl plan` says (to 0.1 GiB)."""
    import re
    from importlib import resources

    from tinyrl.plan_report import run

    header = (resources.files("tinyrl.presets") / f"{preset}.yaml").read_text().split("\ndescription:")[0]
    stated = {m[0]: float(m[1]) for m in re.findall(r"(\w+) ([0-9.]+) of [0-9]+ GiB", header)}
    profiles = read_preset(preset)[1]["profiles"]
    assert set(stated) == set(profiles), (stated, sorted(profiles))
    for profile, gib in stated.items():
        plan, _ = run(preset, [], profile=profile, search=False)
        assert abs(plan.peak / 2**30 - gib) <= 0.051, (profile, plan.peak / 2**30, gib)


def test_preset_base_chain_and_nested_profiles():
    """`base:` merges the 0.5B preset under the 3B one (profiles key by key); a profile written as
    {section: {field: value}} sets those fields and keeps the rest of the section."""
    _, cfg = load_config("qwen2.5-3b_grpo_math_gpu", profile="16gb")
    assert cfg.model.name == "Qwen/Qwen2.5-3B-Instruct" and cfg.model.load_in_4bit
    assert cfg.model.dtype == "float16"  # from the base preset's 16gb profile
    assert cfg.model.gradient_checkpointing and cfg.data.task == "gsm8k"  # the base's, untouched
    assert (cfg.rollout.engine, cfg.train.micro_batch_size, cfg.lora.r) == ("hf", 4, 16)
    _, plain = load_config("qwen2.5-3b_grpo_math_gpu")
    assert not plain.model.load_in_4bit and plain.rollout.engine == "vllm"


def test_preset_base_that_loops_is_a_config_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\ntrain: {lr: 0.1}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="leads back to itself"):
        load_config(tmp_path / "a.yaml")


def test_auto_checkpointing_is_on_only_where_the_update_would_not_fit_without_it():
    """model.gradient_checkpointing auto (tinyrl/planner/checkpointing.py): on exactly when the plan
    without it does not fit and its peak is the update phase; a run that fits, or whose peak is the
    rollout, stays off (checkpointing would only cost time there)."""
    from tinyrl.planner.checkpointing import checkpointing_pays, resolve
    from tinyrl.planner.checkpointing import with_checkpointing as with_gc

    _, cfg = load_config("qwen2.5-0.5b_grpo_math_gpu", {"model.gradient_checkpointing": "auto",
                                                         "rollout.engine": "hf"})
    off, on = (plan_config(with_gc(cfg, v), "cuda", 80 * 2**30) for v in (False, True))
    assert off.peak_phase == "update" and on.peak < off.peak
    between = (on.peak + off.peak) // 2
    assert checkpointing_pays(cfg, "cuda", between)[0]
    assert not checkpointing_pays(cfg, "cuda", off.peak + 2**30)[0]
    auto = plan_config(cfg, "cuda", between)  # `tinyrl plan` plans auto as the rule decides, and says so
    assert auto.peak == plan_config(with_gc(cfg, True), "cuda", between).peak
    assert any("gradient_checkpointing auto -> true" in n for n in auto.notes)
    long = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, num_generations=64, max_new_tokens=4096),
                               train=dataclasses.replace(cfg.train, micro_batch_size=1))
    long_off = plan_config(with_gc(long, False), "cuda", 80 * 2**30)
    assert long_off.peak_phase == "rollout"
    pays, why = checkpointing_pays(long, "cuda", long_off.peak - 1)
    assert not pays and "rollout" in why
    # resolved where a trainer starts: a bool, the tiny CPU default fits its machine (off); given values stay
    _, tiny = load_config("tiny_grpo_cpu")
    assert tiny.model.gradient_checkpointing == "auto"
    assert resolve(tiny, "cpu").model.gradient_checkpointing is False
    assert resolve(with_gc(tiny, True), "cpu").model.gradient_checkpointing is True


def test_auto_checkpointing_of_a_model_the_planner_cannot_read_stays_off(caplog):
    from tinyrl.planner.checkpointing import resolve

    _, cfg = load_config("tiny_grpo_cpu", {"model.name": "no-such-org/no-such-model"})
    with caplog.at_level("INFO", logger="tinyrl.planner"):
        assert resolve(cfg, "cpu").model.gradient_checkpointing is False
    assert "could not be planned" in caplog.text and "no-such-org/no-such-model" in caplog.text


def test_the_cpu_rollout_plans_the_decode_copies_merged_lora_linears_makes():
    """The HF rollout's copies on a CPU (LoRA linears as W + dW; under QLoRA every linear dequantised)
    are planned at the bytes merged_lora_linears actually allocates; a GPU makes none."""
    import peft

    from tinyrl.model import merged_lora_linears

    cfg = llama_cfg()
    arch = from_config(cfg.to_dict(), name="t")
    model = peft.get_peft_model(build_model(cfg), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    made = []
    with merged_lora_linears(model) as n:
        for m in model.modules():
            if "forward" in vars(m):
                made.append(m.forward.keywords["weight"])
    assert n == len(made) == 2 * cfg.num_hidden_layers
    s = setup_for(arch, targets=("q_proj", "v_proj"))
    assert M.decode_copy_bytes(s, 2 ** 40) == sum(w.numel() * w.element_size() for w in made)
    assert M.decode_copy_bytes(s, 8 * 1024) == 1024  # within an eighth of the RAM
    assert M.decode_copy_bytes(setup_for(arch, device="cuda"), 2 ** 40) == 0
    rows = [r.name for r in build(s, 2 ** 34).rows]
    assert any(r.startswith("decode copies: LoRA linears merged") for r in rows)


def test_planner_modules_import_one_way_and_import_tinyrl_planner_stays_light():
    """The gradient-checkpointing rule lives beside plan_config: checkpointing.py imports plan.py, never
    the other way, and no planner module imports another inside a function. `import tinyrl.planner`
    (and its checkpointing module, which the trainer imports) loads neither torch nor the model loader."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    import tinyrl.planner
    from tinyrl.planner import checkpointing, plan

    root = Path(tinyrl.planner.__file__).parent
    for f in sorted(root.glob("*.py")):
        for fn in ast.walk(ast.parse(f.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                assert not any(n.startswith("tinyrl.planner") for n in names), f"{f.name}:{node.lineno}"
    assert "checkpointing" not in {n for node in ast.walk(ast.parse((root / "plan.py").read_text()))
                                   if isinstance(node, ast.ImportFrom) for n in (node.module or "").split(".")}
    assert checkpointing.checkpointing_pays is plan.checkpointing_pays and checkpointing.decide is plan.decide
    code = ("import sys, tinyrl.planner, tinyrl.planner.checkpointing; "
            "print(sorted(m for m in ('torch', 'transformers', 'tinyrl.model', 'tinyrl.data') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


def test_cli_plan_gives_a_small_peak_in_mib(capsys):
    """A peak below 1 GiB reads as MiB (the tiny CPU preset's is tens of MiB, not "0.03 GiB")."""
    import re

    out = cli(capsys, "tiny_grpo_cpu", "--no-search")
    assert out.returncode == 0, out.stderr
    verdict = next(line for line in out.stdout.splitlines() if line.startswith("verdict:"))
    assert re.fullmatch(r"verdict: FITS: [0-9]+\.[0-9] MiB of [0-9]+\.[0-9]{2} GiB \([0-9]+%\)", verdict), verdict
    assert M.size(3 * 2**28) == "768.0 MiB" and M.size(3 * 2**30) == "3.00 GiB"


def test_largest_prompts_per_step_that_fits():
    """The knob a too-large train.prompts_per_step is told to lower: the largest B whose plan fits (B x G
    rows still split into micro-batches), found by bisection without listing every B."""
    import time

    arch = ARCHITECTURES["qwen2.5-0.5b-instruct"]
    s = setup_for(arch, prompts=100000, generations=8, micro_batch=16)
    budget = 24 * 2**30
    t0 = time.monotonic()
    best = largest(s, budget, "prompts")
    assert time.monotonic() - t0 < 5
    assert best and (best * 8) % 16 == 0
    assert build(dataclasses.replace(s, prompts=best), budget).fits
    assert not build(dataclasses.replace(s, prompts=best + 2), budget).fits


def test_planning_the_prompts_leaves_the_process_online():
    """Every run measures its prompts offline (tinyrl.planner.preflight): huggingface_hub, first imported
    there, must not stay offline for the rest of the run (it reads HF_HUB_OFFLINE once, at import)."""
    import os
    import subprocess
    import sys

    code = ("from tinyrl.config import load_config; from tinyrl.planner.prompts import measure_prompt_tokens; "
            "cfg = load_config('tiny_grpo_cpu')[1]; assert measure_prompt_tokens(cfg); "
            "import huggingface_hub.constants as c, os; print(c.HF_HUB_OFFLINE, os.environ.get('HF_HUB_OFFLINE'))")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.split() == ["False", "None"], (out.stdout, out.stderr[-2000:])
