"""`tinyrl export`: the merged model equals base + adapter (LoRA and QLoRA runs), is 16-bit (never nf4),
and loads with no peft; the model card holds the run's facts; `--push` calls the hub's API rightly.

The runs are real: a tiny random Llama trained two GRPO steps (a LoRA and a QLoRA run), whose adapters
are then pushed far from zero (two steps at a small lr barely move them) so that base + adapter answers
differently from the base: an export that dropped or mangled the adapter fails the comparison.

The hub cannot be reached from here: the push tests replace only the two network calls of
`huggingface_hub.HfApi` (`create_repo`, `upload_folder`) with recorders, and assert on their arguments
and on the folder handed to `upload_folder` (the files and the card that would be uploaded).
"""

import json
from pathlib import Path

import pytest
import torch

import tinyrl
from tinyrl.cli import main
from tinyrl.errors import ConfigError

PROMPTS = ["12+34=", "7+8=", "50+61=", "3+3=", "99+1="]


def reward_by_length(prompts, completions, **kw):
    return [float(len(c)) for c in completions]


def trained_run(model_dir, root, **extra) -> Path:
    o = {"model.name": model_dir, "log.run_dir": str(root), "log.progress": False, "train.steps": 2,
         "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 8,
         "rollout.max_new_tokens": 4, "data.num_train": 64, "data.num_eval": 8, "train.lr": 1e-2,
         "lora.r": 4, "lora.alpha": 8,
         "reward.functions": [{"name": "task"}, {"name": f"{__name__}:reward_by_length", "weight": 0.5}]}
    o.update(extra)
    run = tinyrl.train(**o).path
    push_adapter_away_from_zero(run / "adapter")
    return run


def push_adapter_away_from_zero(adapter: Path, scale: float = 0.5, seed: int = 0) -> None:
    from safetensors.torch import load_file, save_file

    path = adapter / "adapter_model.safetensors"
    weights = load_file(path)
    g = torch.Generator().manual_seed(seed)
    for k, v in weights.items():
        if "lora_B" in k:
            weights[k] = v + torch.randn(v.shape, generator=g) * scale
    save_file(weights, path, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):  # with pass@k / maj@k before and after: the card's metrics
    return trained_run(tiny_model_dir, tmp_path_factory.mktemp("runs"), **{"train.eval_samples": 2})


@pytest.fixture(scope="module")
def qlora_run(tiny_model_dir, tmp_path_factory):
    return trained_run(tiny_model_dir, tmp_path_factory.mktemp("qruns"), **{"model.load_in_4bit": True})


def greedy(model, tok, n: int = 8) -> list[list[int]]:
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt").input_ids
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                               pad_token_id=tok.pad_token_id)
            out.append(g[0, ids.shape[1]:].tolist())
    return out


def base_and_adapter(model_dir, adapter=None):
    """The 16-bit (here float32) base, with the run's adapter on top through peft when given."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


def load_export(out):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)


@pytest.mark.parametrize("run_fixture", ["lora_run", "qlora_run"])
def test_merged_greedy_equals_base_plus_adapter(run_fixture, request, tiny_model_dir, tmp_path):
    run = request.getfixturevalue(run_fixture)
    out = tinyrl.export(run, merged=tmp_path / "merged", dtype="float32").merged
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "README.md", "export.json"} <= names
    assert not any(n.startswith("adapter_") for n in names)  # a plain model: nothing for peft
    merged, tok = load_export(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    want = greedy(*base_and_adapter(tiny_model_dir, run / "adapter"))
    assert greedy(merged, tok) == want
    assert greedy(*base_and_adapter(tiny_model_dir)) != want  # the adapter matters: the check can fail
    info = json.loads((out / "export.json").read_text())
    assert info["trained_quantized"] == ("nf4" if run_fixture == "qlora_run" else None)


def test_qlora_export_is_16_bit_base_plus_delta_not_nf4(qlora_run, tiny_model_dir, tmp_path):
    """The bf16 export's weights are bf16 tensors (no packed 4-bit, no quantization config), and each
    equals the unquantized base weight + B @ A * alpha / r to bf16 rounding: far closer than the base's
    own nf4 round trip, so the adapter was merged into the 16-bit base, not into nf4."""
    import bitsandbytes.functional as bnbf
    from safetensors import safe_open
    from safetensors.torch import load_file

    out = tinyrl.export(qlora_run, merged=tmp_path / "bf16").merged
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["dtype"] == "bfloat16"
    base = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    assert set(tensors) == set(base) and all(tensors[k].shape == base[k].shape for k in base)

    adapter = load_file(str(qlora_run / "adapter" / "adapter_model.safetensors"))
    acfg = json.loads((qlora_run / "adapter" / "adapter_config.json").read_text())
    key = "model.layers.0.self_attn.q_proj.weight"
    a = next(v for k, v in adapter.items() if "layers.0.self_attn.q_proj.lora_A" in k)
    b = next(v for k, v in adapter.items() if "layers.0.self_attn.q_proj.lora_B" in k)
    want = base[key] + b @ a * (acfg["lora_alpha"] / acfg["r"])
    got = tensors[key].float()
    bf16_err = float((got - want).abs().max())
    assert bf16_err <= float(want.abs().max()) * 2 ** -8  # one bf16 rounding
    q, state = bnbf.quantize_4bit(base[key], quant_type="nf4")
    nf4_err = float((bnbf.dequantize_4bit(q, state) - base[key]).abs().max())
    assert nf4_err > 4 * bf16_err
    model, tok = load_export(out)
    assert model.dtype == torch.bfloat16 and len(greedy(model, tok, n=4)) == len(PROMPTS)  # loads and runs


def test_lm_head_adapter_on_tied_embeddings_leaves_the_input_embeddings(tmp_path):
    """tiny-arith ties lm_head to embed_tokens: a LoRA on lm_head, merged, must change the head only."""
    from safetensors.torch import load_file

    from tinyrl.model.load import resolve_model

    run = trained_run("tiny-arith", tmp_path / "runs", **{"lora.target_modules": ["q_proj", "lm_head"],
                                                          "train.steps": 1, "train.eval_before_after": False})
    base_dir = resolve_model("tiny-arith").path
    out = tinyrl.export(run, merged=tmp_path / "merged", dtype="float32").merged
    merged, tok = load_export(out)
    base = load_file(str(Path(base_dir) / "model.safetensors"))
    emb = merged.get_input_embeddings().weight
    assert torch.equal(emb, base["model.embed_tokens.weight"])
    assert not torch.equal(merged.get_output_embeddings().weight, emb)
    assert greedy(merged, tok) == greedy(*base_and_adapter(base_dir, run / "adapter"))


# ------------------------------------------------------------------ refusals


def test_refuses_an_existing_folder_a_run_without_adapter_and_a_bad_dtype(lora_run, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        tinyrl.export(lora_run, merged=full)
    assert (full / "x").read_text() == "keep me"
    with pytest.raises(ConfigError, match=r"--dtype: must be one of \['bfloat16', 'float16', 'float32'\], got 'int4'"):
        tinyrl.export(lora_run, merged=tmp_path / "new", dtype="int4")
    bare = tmp_path / "bare-run"
    bare.mkdir()
    (bare / "config.yaml").write_text((lora_run / "config.yaml").read_text())
    (bare / "checkpoints" / "step-000002" / "adapter").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no final adapter.*latest checkpoint's adapter is .*step-000002"):
        tinyrl.export(bare, merged=tmp_path / "new")
    with pytest.raises(ConfigError, match="not a tinyrl run folder"):
        tinyrl.export(tmp_path, merged=tmp_path / "new")
    with pytest.raises(ConfigError, match="give merged=OUT"):
        tinyrl.export(lora_run)
    assert not (tmp_path / "new").exists()


def test_a_failed_export_leaves_nothing(lora_run, tmp_path, monkeypatch):
    """Written to a temporary folder and renamed in whole: a failure after the weights leaves no OUT."""
    import tinyrl.exporter

    def full_disk(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tinyrl.exporter, "model_card", full_disk)
    parent = tmp_path / "exports"
    with pytest.raises(OSError, match="No space left"):
        tinyrl.export(lora_run, merged=parent / "m", dtype="float32")
    assert list(parent.iterdir()) == []


def test_refuses_a_base_stored_quantized(lora_run, tiny_model_dir, tmp_path):
    """A base checkpoint saved in bnb 4-bit (like a hub *-bnb-4bit upload) has no 16-bit weights to merge into."""
    import shutil

    import yaml
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    packed = tmp_path / "packed-base"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, device_map={"": "cpu"}, quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4")).save_pretrained(packed)
    run = tmp_path / "run"
    shutil.copytree(lora_run / "adapter", run / "adapter")
    cfg = yaml.safe_load((lora_run / "config.yaml").read_text())
    cfg["model"]["name"] = str(packed)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"is stored quantized \(bitsandbytes\); a merged export needs"):
        tinyrl.export(run, merged=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_export(lora_run, tmp_path, capsys):
    out = tmp_path / "cli-out"
    assert main(["export", str(lora_run), "--merged", str(out), "--dtype", "float16"]) == 0
    assert f"merged model (float16): {out}" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    assert main(["export", str(lora_run), "--merged", str(out)]) == 2  # now it exists
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert main(["export", str(lora_run), "--merged", str(tmp_path / "o2"), "--dtype", "int8"]) == 2
    assert "--dtype: must be one of" in capsys.readouterr().err
    assert main(["export", str(lora_run), "--private"]) == 2
    assert "give --merged OUT" in capsys.readouterr().err
    assert main(["export", str(lora_run), "--merged", str(tmp_path / "o3"), "--private"]) == 2
    assert "--private: applies to --push" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nowhere"), "--merged", str(tmp_path / "o3")]) == 2
    assert "no such run folder" in capsys.readouterr().err


# ------------------------------------------------------------------ model card and push


def test_model_card_holds_the_run_facts(lora_run, qlora_run):
    from tinyrl.hub_push import model_card

    summary = json.loads((lora_run / "summary.json").read_text())
    card = model_card(lora_run, kind="adapter", repo_id="me/tiny")
    assert card.startswith("---\nlibrary_name: peft\n")
    assert "| preset | `tiny_grpo_cpu` |" in card  # the run folder is named after its (default) preset
    assert f"| steps | {summary['steps']} |" in card and summary["steps"] == 2
    assert f"`task`, `{__name__}:reward_by_length` (weight 0.5)" in card
    for key, label in (("eval_before", "held-out before"), ("eval_after", "held-out after")):
        assert summary[key] is not None
        assert f"{label}" in card and f"{100 * summary[key]:.1f}% |" in card
    assert f"| tinyrl version | {tinyrl.__version__} |" in card
    assert 'AutoPeftModelForCausalLM.from_pretrained("me/tiny")' in card
    assert "base_model:" not in card  # a local folder is not a hub id: the hub would reject it
    merged = model_card(qlora_run, kind="merged", dtype="bfloat16")
    assert "library_name: transformers" in merged and "- qlora" in merged
    assert "nf4 (QLoRA)" in merged and "16-bit base + adapter" in merged


def copy_of_run(run: Path, to: Path, **changes) -> Path:
    """A run folder holding `run`'s config.yaml (sections updated by `changes`) and summary.json: what a
    card is written from (the shared run folder itself is left as it was)."""
    import yaml

    to.mkdir(parents=True)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    for section, values in changes.items():
        cfg.setdefault(section, {}).update(values)
    (to / "config.yaml").write_text(yaml.safe_dump(cfg))
    (to / "summary.json").write_text((run / "summary.json").read_text())
    return to


def test_model_card_eval_results_round_trip_through_model_card_load(lora_run, tmp_path):
    """The card's front matter is ModelCardData with a model-index: ModelCard.load reads back every
    held-out result (greedy before/after, pass@k / maj@k before/after, the newest `tinyrl eval` file)
    with its value, task type and dataset; lm-eval scores added with the hook round-trip too."""
    from huggingface_hub import ModelCard

    from tinyrl.evaluation import EvalReport, SampledEval, write_eval
    from tinyrl.hub_push import add_lm_eval_results, model_card

    run = copy_of_run(lora_run, tmp_path / "tiny_grpo_cpu")
    summary = json.loads((run / "summary.json").read_text())
    sampled = summary["details"]["eval_sampled"]
    assert set(sampled) == {"before", "after"} and sampled["after"]["pass@k"]  # the run measured them
    write_eval(EvalReport(0.375, 8, sampled=SampledEval(4, 0.7, [1, 4], {1: 0.25, 4: 0.5}, {1: 0.25, 4: 0.375})), run)
    path = tmp_path / "README.md"
    path.write_text(model_card(run, kind="adapter", repo_id="me/tiny"))
    data = ModelCard.load(path).data
    assert data.library_name == "peft" and data.pipeline_tag == "text-generation"
    assert {"tinyrl", "grpo", "reinforcement-learning", "rlvr", "lora"} <= set(data.tags)
    assert data.base_model is None and data.license is None and data.datasets is None  # a local, unlicensed base;
    # generated arithmetic prompts (no hub dataset)
    got = data.eval_results
    assert {(r.task_type, r.dataset_type, r.dataset_name) for r in got} == {
        ("text-generation", "tinyrl/arithmetic", "tinyrl/arithmetic held-out")}
    want = [("accuracy", summary["eval_before"], True, None), ("accuracy", summary["eval_after"], False, None)]
    for when in ("before", "after"):
        for kind in ("pass@k", "maj@k"):
            want += [(f"{kind[:-1]}{k}", v, when == "before", None) for k, v in (sampled[when][kind] or {}).items()]
    (eval_file,) = run.glob("eval-*.json")
    want += [("accuracy", 0.375, False, eval_file.stem), ("pass@1", 0.25, False, eval_file.stem),
             ("pass@4", 0.5, False, eval_file.stem), ("maj@1", 0.25, False, eval_file.stem),
             ("maj@4", 0.375, False, eval_file.stem)]
    assert sorted((r.metric_type, r.metric_value, "before training" in r.metric_name, r.metric_config) for r in got) \
        == sorted(want, key=lambda w: (w[0], w[1], w[2], w[3] or ""))
    assert {r.metric_args["samples"] for r in got if r.metric_type.startswith(("pass@", "maj@"))} == {2, 4}

    card = add_lm_eval_results(ModelCard.load(path), {"arc_easy": {
        "alias": "arc_easy", "acc,none": 0.5, "acc_stderr,none": 0.125, "acc_norm,none": 0.625}})
    card.save(tmp_path / "with-lm-eval.md")
    lm = [r for r in ModelCard.load(tmp_path / "with-lm-eval.md").data.eval_results if r.dataset_type == "arc_easy"]
    assert [(r.metric_type, r.metric_value, r.metric_args, r.source_name) for r in lm] == [
        ("acc", 0.5, {"stderr": 0.125}, "lm-evaluation-harness"), ("acc_norm", 0.625, None, "lm-evaluation-harness")]


def test_model_card_license_is_the_bases_and_never_invented(lora_run, tiny_model_dir, tmp_path, monkeypatch):
    """The base's license comes from its card's front matter or its config.json, found on this machine
    (a local folder, or the hub cache for a hub id: nothing is downloaded); none found: no license key."""
    import shutil

    import huggingface_hub.constants
    from huggingface_hub import ModelCard

    from tinyrl.hub_push import GSM8K_HUB_ID, model_card

    def base(name, readme=None, config_license=None):
        folder = tmp_path / name
        shutil.copytree(tiny_model_dir, folder)
        if readme is not None:
            (folder / "README.md").write_text(readme)
        if config_license is not None:
            cfg = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**cfg, "license": config_license}))
        return str(folder)

    runs = iter(range(100))

    def card(model, **data):
        run = copy_of_run(lora_run, tmp_path / f"run-{next(runs)}", model={"name": model}, data=data)
        text = model_card(run)
        return text, ModelCard(text).data

    _, d = card(base("apache", "---\nlicense: apache-2.0\nlanguage: en\n---\n# a base\n"))
    assert d.license == "apache-2.0"
    _, d = card(base("other", "---\nlicense: other\nlicense_name: acme-1\nlicense_link: https://acme.test/l\n---\n"))
    assert (d.license, d.license_name, d.license_link) == ("other", "acme-1", "https://acme.test/l")
    _, d = card(base("in-config", config_license="mit"))
    assert d.license == "mit"
    text, d = card(base("no-front-matter", "# a base with no metadata\n"))
    assert d.license is None and "license" not in text.split("\n---\n")[0]
    text, d = card(tiny_model_dir)
    assert d.license is None and "license" not in text.split("\n---\n")[0]

    cache = tmp_path / "hub-cache"  # the hub cache's own layout: refs/main -> snapshots/<commit>/
    snapshot = cache / "models--acme--base-1b" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nlicense: llama3.2\n---\n")
    (cache / "models--acme--base-1b" / "refs").mkdir()
    (cache / "models--acme--base-1b" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    _, d = card("acme/base-1b", task="gsm8k")
    assert (d.license, d.base_model, d.datasets) == ("llama3.2", "acme/base-1b", [GSM8K_HUB_ID])
    assert {r.dataset_type for r in d.eval_results} == {GSM8K_HUB_ID}
    _, d = card("acme/not-cached", task="dataset", dataset="acme/prompts", config="main")
    assert (d.license, d.base_model, d.datasets) == (None, "acme/not-cached", ["acme/prompts"])
    assert {(r.dataset_type, r.dataset_config) for r in d.eval_results} == {("acme/prompts", "main")}


def test_the_cards_gsm8k_default_is_the_tasks():
    """hub_push names the gsm8k task's default dataset without importing the task (it imports the
    reward stack): the two must agree."""
    from tinyrl.hub_push import GSM8K_HUB_ID
    from tinyrl.tasks.gsm8k import HUB_ID

    assert GSM8K_HUB_ID == HUB_ID


@pytest.fixture
def hub_calls(monkeypatch):
    """HfApi's two network calls, recorded (the hub is unreachable here: the boundary we mock)."""
    from huggingface_hub import HfApi

    calls = []

    def create_repo(self, repo_id, **kw):
        calls.append(("create_repo", repo_id, kw, self.token))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, **kw):
        folder = Path(kw["folder_path"])
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        calls.append(("upload_folder", kw["repo_id"], kw, files))

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    return calls


def test_push_adapter_creates_the_repo_and_uploads_adapter_and_card(lora_run, hub_calls):
    done = tinyrl.export(lora_run, push="me/tiny-grpo", private=True)
    assert done.url == "https://huggingface.co/me/tiny-grpo" and done.merged is None
    (c, repo, kw, token), (u, repo2, ukw, files) = hub_calls
    assert (c, repo, token) == ("create_repo", "me/tiny-grpo", "hf_test_token")
    assert kw["private"] is True and kw["exist_ok"] is True and kw.get("repo_type", "model") == "model"
    assert (u, repo2, ukw.get("repo_type", "model")) == ("upload_folder", "me/tiny-grpo", "model")
    adapter = lora_run / "adapter"
    assert set(files) == {"README.md", "adapter_config.json", "adapter_model.safetensors"}
    assert files["adapter_model.safetensors"] == (adapter / "adapter_model.safetensors").read_bytes()
    card = files["README.md"].decode()
    assert card.startswith("---\nlibrary_name: peft") and "| tinyrl version |" in card
    assert (adapter / "README.md").read_text() != card  # the run folder itself is left as it was


def test_push_merged_uploads_the_export(lora_run, tmp_path, hub_calls):
    done = tinyrl.export(lora_run, merged=tmp_path / "m", push="me/tiny-merged", dtype="float32")
    (_, _, kw, _), (_, _, _, files) = hub_calls
    assert kw["private"] is False and done.merged == tmp_path / "m"
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "export.json"} <= set(files)
    assert files["model.safetensors"] == (done.merged / "model.safetensors").read_bytes()
    assert "library_name: transformers" in files["README.md"].decode()


def test_push_without_a_login_says_how_and_touches_nothing(lora_run, tmp_path, monkeypatch, hub_calls):
    import huggingface_hub.constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(ConfigError, match=r"not logged in.*`hf auth login`.*HF_TOKEN"):
        tinyrl.export(lora_run, merged=tmp_path / "m", push="me/x")
    assert hub_calls == [] and not (tmp_path / "m").exists()  # checked before the merge and the hub
    with pytest.raises(ConfigError, match="--push: a hub repo id is USER/NAME"):
        tinyrl.export(lora_run, push="not a repo")


def test_hub_refusals_and_no_connection_are_clear(lora_run, monkeypatch, hub_calls, capsys):
    """A 401 from the hub and an unreachable hub (both raised by the mocked network call) end in one
    clear line, not a traceback."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    from tinyrl.hub_push import PushError

    http = HfHubHTTPError.__mro__[1]  # the hub client's HTTP library (httpx): its base error
    lib = __import__(http.__module__)
    request = lib.Request("POST", "https://hub.invalid/api/repos/create")

    def refused(self, repo_id, **kw):
        raise HfHubHTTPError("401 Unauthorized", response=lib.Response(401, request=request))

    monkeypatch.setattr(HfApi, "create_repo", refused)
    with pytest.raises(PushError, match=r"token was refused: log in again with `hf auth login`"):
        tinyrl.export(lora_run, push="me/x")

    def offline(self, repo_id, **kw):
        raise lib.ConnectError("[Errno -2] Name or service not known", request=request)

    monkeypatch.setattr(HfApi, "create_repo", offline)
    assert main(["export", str(lora_run), "--push", "me/x"]) == 2
    assert "--push me/x: cannot reach the hub" in capsys.readouterr().err
