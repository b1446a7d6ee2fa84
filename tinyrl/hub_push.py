"""Share a run on the Hugging Face Hub: its model card, and the upload of its adapter or merged model.

    tinyrl export RUN_DIR --push USER/NAME [--private]                 # the LoRA adapter (peft)
    tinyrl export RUN_DIR --merged OUT --push USER/NAME [--private]    # the merged model (tinyrl.exporter)

`model_card` writes the README.md the repo gets, from the run folder alone. Its front matter is
huggingface_hub's ModelCardData: library (peft for an adapter, transformers merged), base model, hub
datasets, tags, the base's license (read from its card or config.json on this machine, never invented)
and a model-index of EvalResults the hub shows as a results table: held-out greedy pass@1 before and
after (summary.json), pass@k / maj@k (details.eval_sampled, the newest eval-*.json) and lm-eval scores
(details.lm_eval; `add_lm_eval_results` adds more to any card). Its body: the preset, the method, the
steps, the reward functions, those results, the tinyrl version, how to load the upload, the config. `push` checks for a login
before anything else (`hf auth login`, or HF_TOKEN), creates the repo (`HfApi.create_repo`,
exist_ok) and uploads the folder with the card (`HfApi.upload_folder`): the folder itself is never
changed, the card goes in through a staging folder of links beside a fresh README.md.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import tempfile
from importlib import resources
from pathlib import Path

import yaml

from tinyrl.errors import ConfigError, MissingExtra
from tinyrl.runs import RunDir
from tinyrl.version import __version__

KINDS = ("adapter", "merged")
SUMMARY_FILE = "summary.json"  # tinyrl.methods.common's one summary schema (read here as plain JSON)
_STAMP = re.compile(r"-\d{8}-\d{6}(-\d+)?$")  # RunDir.create's suffix for a taken name
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
GSM8K_HUB_ID = "openai/gsm8k"  # tinyrl.tasks.gsm8k.HUB_ID: the gsm8k task's data when no path or dataset is given
BEFORE = ", before training (the base model)"  # how a metric of the base, measured before training, is named
LM_EVAL_URL = "https://github.com/EleutherAI/lm-evaluation-harness"


class PushError(OSError):
    """The hub refused or could not take the upload (the message says what to do)."""


def _pct(x) -> str:
    return "n/a (not measured)" if x is None else f"{100 * x:.1f}%"


def _reward_names(functions) -> str:
    out = []
    for f in functions or []:
        f = {"name": f} if isinstance(f, str) else f
        weight = f.get("weight", 1.0)
        out.append(f"`{f['name']}`" + ("" if weight == 1.0 else f" (weight {weight})"))
    return ", ".join(out) or "none"


def _hub_id(name: str) -> bool:
    """A model name that is a hub id (org/name), not a built-in model or a local folder."""
    return bool(_REPO_ID.match(name)) and not Path(name).expanduser().exists()


def run_facts(run_dir: str | Path) -> dict:
    """What the card says, read from the run folder: config.yaml, summary.json and its newest eval-*.json."""
    run = RunDir(Path(run_dir).expanduser())
    cfg = run.config()
    summary_path = run.path / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    model, log, train = cfg.get("model", {}), cfg.get("log", {}), cfg.get("train", {})
    name = run.path.resolve().name
    stages = cfg.get("stages") or []
    details = summary.get("details") or {}
    evals = sorted(run.path.glob("eval-*.json"), key=lambda p: p.stat().st_mtime)  # `tinyrl eval --samples`
    return {
        "config": cfg,
        # the run folder is named after its preset unless log.name named it (a taken name gets a time stamp)
        "preset": None if log.get("name") else _STAMP.sub("", name),
        "run": name,
        "description": cfg.get("description") or "",
        "method": summary.get("method") or ("grpo" if not stages else "+".join(stages)),
        "base_model": model.get("name", "?"),
        "quantized": "nf4 (QLoRA)" if model.get("load_in_4bit") else
                     None if model.get("quantization", "none") == "none" else model["quantization"],
        "steps": summary.get("steps", train.get("steps")),
        "steps_planned": train.get("steps"),
        "finished": bool(summary) and not summary.get("interrupted") and not summary.get("error"),
        "rewards": _reward_names(cfg.get("reward", {}).get("functions")),
        "task": cfg.get("data", {}).get("task"),
        "num_eval": cfg.get("data", {}).get("num_eval"),
        "eval_before": summary.get("eval_before"),
        "eval_after": summary.get("eval_after"),
        "sampled": {w: v for w, v in (details.get("eval_sampled") or {}).items() if isinstance(v, dict)},
        "lm_eval": details.get("lm_eval") or summary.get("lm_eval") or {},  # {task: {metric: value}}
        "eval_file": (evals[-1].name, _read_json(evals[-1])) if evals else None,
        "lora": cfg.get("lora", {}),
    }


def _read_json(path: Path) -> dict:
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


# ------------------------------------------------------------------ card metadata (huggingface_hub's ModelCardData)


def _is_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def run_datasets(data: dict) -> list[str]:
    """The hub datasets a run's prompts came from (local files and generated tasks are not hub datasets).

    >>> run_datasets({"task": "dataset", "dataset": "openai/gsm8k"}), run_datasets({"task": "gsm8k"})
    (['openai/gsm8k'], ['openai/gsm8k'])
    >>> run_datasets({"task": "gsm8k", "task_args": {"path": "gsm8k/main"}}), run_datasets({"task": "arithmetic"})
    ([], [])
    """
    args = data.get("task_args") or {}
    names = [data.get("dataset"), args.get("dataset")]
    names += [m.get("dataset") for m in data.get("mix") or [] if isinstance(m, dict)]  # data.mix: several sources
    if data.get("task") == "gsm8k" and not args.get("path") and not args.get("dataset"):
        names.append(GSM8K_HUB_ID)  # the gsm8k task's default source
    return list(dict.fromkeys(n for n in names if isinstance(n, str) and _REPO_ID.match(n) and not _is_local(n)))


def _base_folder(base: str) -> Path | None:
    """Where the base model's own files lie on this machine: its folder, a built-in model's, or the hub cache's."""
    local = Path(base).expanduser()
    if local.is_dir():
        return local
    asset = resources.files("tinyrl.assets") / base
    if re.fullmatch(r"[\w.-]+", base) and asset.is_dir():
        return Path(str(asset))
    if _REPO_ID.match(base):  # the hub cache only: nothing is downloaded for a card
        for name in ("README.md", "config.json"):
            got = _hub().try_to_load_from_cache(base, name)
            if isinstance(got, str):
                return Path(got).parent
    return None


def base_license(base: str) -> dict:
    """The base model's license, as its card's front matter (README.md) or config.json says it: {license,
    license_name, license_link} where given; {} when neither says one (none is invented)."""
    folder = _base_folder(base)
    if folder is None:
        return {}
    meta = {}
    if (folder / "README.md").is_file():
        try:
            meta = _hub().metadata_load(folder / "README.md") or {}
        except (ValueError, yaml.YAMLError, OSError):
            meta = {}
    if not meta.get("license") and (folder / "config.json").is_file():
        meta = {"license": _read_json(folder / "config.json").get("license")}
    got = {k: meta.get(k) for k in ("license", "license_name", "license_link")}
    return {k: v for k, v in got.items() if isinstance(v, str) and v} if isinstance(got["license"], str) else {}


def _held_out_set(f: dict) -> dict:
    """The EvalResult fields of the run's held-out prompts: a hub dataset's id where they come from one."""
    data = f["config"].get("data", {})
    hub = run_datasets(data)
    kind = hub[0] if len(hub) == 1 else f"tinyrl/{f['task']}"
    return {"task_type": "text-generation", "dataset_type": kind, "dataset_name": f"{kind} held-out",
            "dataset_config": data.get("config") if hub else None,
            "dataset_split": data.get("eval_split") if hub else None}


def _sampled_results(got: dict, where: dict, when: str, config: str | None = None) -> list:
    """EvalResults of one sampled evaluation (SampledEval.to_dict): pass@k and maj@k by k."""
    EvalResult = _hub().EvalResult
    how = f"of {got.get('samples')} samples at temperature {got.get('temperature')}"
    out = []
    for kind in ("pass@k", "maj@k"):
        for k, v in (got.get(kind) or {}).items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                metric = kind.replace("k", str(k))
                out.append(EvalResult(**where, metric_type=metric, metric_value=v, metric_name=f"{metric} {how}{when}",
                                      metric_config=config,
                                      metric_args={"samples": got.get("samples"), "temperature": got.get("temperature")}))
    return out


def run_eval_results(f: dict) -> list:
    """The run's held-out results as model-index EvalResults: greedy pass@1 before (the base) and after
    training (summary.json), pass@k / maj@k (summary.json details.eval_sampled), the newest `tinyrl eval`
    file, and lm-eval results (summary.json details.lm_eval)."""
    EvalResult, where = _hub().EvalResult, _held_out_set(f)
    out = []
    for when, value in ((BEFORE, f["eval_before"]), ("", f["eval_after"])):
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.append(EvalResult(**where, metric_type="accuracy", metric_value=value,
                                  metric_name=f"greedy pass@1{when}"))
    for when in ("before", "after"):
        if when in f["sampled"]:
            out += _sampled_results(f["sampled"][when], where, BEFORE if when == "before" else "")
    if f["eval_file"]:
        name, got = f["eval_file"]
        config = Path(name).stem  # which `tinyrl eval` wrote them
        if isinstance(got.get("greedy_pass@1"), (int, float)) and math.isfinite(got["greedy_pass@1"]):
            out.append(EvalResult(**where, metric_type="accuracy", metric_value=got["greedy_pass@1"],
                                  metric_name="greedy pass@1, tinyrl eval", metric_config=config))
        out += _sampled_results(got.get("sampled") or {}, where, ", tinyrl eval", config)
    return out + lm_eval_results(f["lm_eval"])


def lm_eval_results(results: dict) -> list:
    """EvalResults of lm-evaluation-harness scores, {task: {metric: value}} as its `results` dict holds them
    ("exact_match,strict-match": 0.41, "exact_match_stderr,strict-match": 0.01, "alias": "gsm8k"): each
    finite number a metric of the task (its filter in the metric's name, a stderr in its args)."""
    EvalResult = _hub().EvalResult
    out = []
    for task, metrics in (results or {}).items():
        metrics = metrics if isinstance(metrics, dict) else {}
        for key, value in metrics.items():
            metric, _, filt = str(key).partition(",")
            if metric.endswith("_stderr") or isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                continue
            stderr = metrics.get(f"{metric}_stderr" + (f",{filt}" if filt else ""))
            out.append(EvalResult(
                task_type="text-generation", dataset_type=str(task), dataset_name=str(metrics.get("alias") or task),
                metric_type=metric, metric_value=value, metric_name=f"{metric} ({filt})" if filt else metric,
                metric_args={"stderr": stderr} if isinstance(stderr, (int, float)) else None,
                source_name="lm-evaluation-harness", source_url=LM_EVAL_URL))
    return out


def add_lm_eval_results(card, results: dict):
    """Add lm-evaluation-harness scores ({task: {metric: value}}) to a ModelCard's model-index (a card
    `model_card` wrote, loaded with `ModelCard.load`, or any other); returns the card."""
    data = card.data
    data.eval_results = [*(data.eval_results or []), *lm_eval_results(results)] or None
    data.model_name = data.model_name or "model"  # the model-index needs a name
    return card


def card_data(f: dict, kind: str, title: str):
    """The card's metadata (the YAML front matter the hub reads), huggingface_hub's ModelCardData."""
    base = f["base_model"]
    results = run_eval_results(f)
    return _hub().ModelCardData(
        library_name="peft" if kind == "adapter" else "transformers", pipeline_tag="text-generation",
        base_model=base if _hub_id(base) else None, datasets=run_datasets(f["config"].get("data", {})) or None,
        tags=["tinyrl", *dict.fromkeys(f["method"].split("+")), "reinforcement-learning", "rlvr", "lora",
              *(["qlora"] if f["quantized"] == "nf4 (QLoRA)" else [])],
        **base_license(base), model_name=title, eval_results=results or None)


def _sampled_cell(got: dict) -> str:
    cells = [f"pass@{k} {_pct(v)}" for k, v in (got.get("pass@k") or {}).items()]
    return ", ".join(cells + [f"maj@{k} {_pct(v)}" for k, v in (got.get("maj@k") or {}).items()]) or "n/a"


def _sampled_rows(f: dict) -> list[tuple[str, str]]:
    rows = [(f"held-out {when} ({got.get('samples')} samples per prompt at temperature {got.get('temperature')})",
             _sampled_cell(got)) for when, got in f["sampled"].items()]
    if f["eval_file"]:
        name, got = f["eval_file"]
        rows.append((f"`tinyrl eval` ({name})", ", ".join(
            [f"greedy pass@1 {_pct(got.get('greedy_pass@1'))}"] + ([_sampled_cell(got["sampled"])]
                                                                  if got.get("sampled") else []))))
    by_task: dict[str, list[str]] = {}
    for r in lm_eval_results(f["lm_eval"]):
        by_task.setdefault(r.dataset_name, []).append(f"{r.metric_name} {r.metric_value:.4g}")
    return rows + [(f"lm-evaluation-harness `{task}`", ", ".join(cells)) for task, cells in by_task.items()]


def model_card(run_dir: str | Path, kind: str = "adapter", dtype: str | None = None,
               repo_id: str | None = None) -> str:
    """The README.md of an upload: `kind` adapter (peft) or merged (a plain transformers model). Its front
    matter is huggingface_hub's ModelCardData, with the held-out results as a model-index the hub shows as
    a results table (`ModelCard.load` reads them back); its body is the run's facts for a reader."""
    if kind not in KINDS:
        raise ConfigError(f"kind: must be one of {list(KINDS)}, got {kind!r}")
    f = run_facts(run_dir)
    base = f["base_model"]
    title = repo_id or f["run"]
    what = (f"A LoRA adapter (peft) for `{base}`" if kind == "adapter" else
            f"`{base}` with a LoRA adapter merged into its weights, saved in {dtype or 'its own dtype'}")
    steps = f["steps"] if f["finished"] or f["steps"] == f["steps_planned"] else \
        f"{f['steps']} of {f['steps_planned']} (the run stopped early)"
    quantized = "" if not f["quantized"] else (
        f" The base was held in {f['quantized']} while training"
        + ("; the adapter was merged into the unquantized base, so this model is the 16-bit base "
           "+ adapter." if kind == "merged" else "."))
    held_out = f"greedy pass@1 on {f['num_eval']} held-out `{f['task']}` prompts"
    rows = [("preset", f"`{f['preset']}`" if f["preset"] else f"(not recorded; run `{f['run']}`)"),
            ("method", f["method"]), ("base model", f"`{base}`"), ("steps", steps),
            ("reward functions", f["rewards"]), (f"held-out before ({held_out})", _pct(f["eval_before"])),
            ("held-out after", _pct(f["eval_after"])), *_sampled_rows(f),
            ("LoRA", f"r={f['lora'].get('r')}, alpha={f['lora'].get('alpha')}, "
                     f"targets={f['lora'].get('target_modules')}"),
            ("tinyrl version", __version__)]
    use = (f"```python\nfrom peft import AutoPeftModelForCausalLM\n\n"
           f"model = AutoPeftModelForCausalLM.from_pretrained(\"{repo_id or 'THIS_REPO'}\")\n```\n"
           if kind == "adapter" else
           f"```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
           f"model = AutoModelForCausalLM.from_pretrained(\"{repo_id or 'THIS_REPO'}\")\n"
           f"tokenizer = AutoTokenizer.from_pretrained(\"{repo_id or 'THIS_REPO'}\")\n```\n\n"
           f"or serve it with vLLM: `vllm serve {repo_id or 'THIS_REPO'}`.\n")
    lines = ["", f"# {title}", "",
             f"{what}, trained with tinyrl (`pip install tinyrl-rlvr`: reinforcement learning with "
             f"verifiable rewards).{quantized}", ""]
    if f["description"]:
        lines += [f"> {f['description']}", ""]
    lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), "", "## Use", "", use,
              "## Training config", "", "<details><summary>config.yaml of the run</summary>", "",
              "```yaml", yaml.safe_dump(f["config"], sort_keys=False).strip(), "```", "", "</details>", ""]
    meta = card_data(f, kind, title).to_dict()  # library_name first: the key a reader looks for
    meta = {"library_name": meta.pop("library_name"), **meta}
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()
    return str(_hub().ModelCard(f"---\n{front}\n---\n" + "\n".join(lines)))  # parsed: a bad card fails here


def check_repo_id(repo_id: str) -> str:
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or len(repo_id) > 96:
        raise ConfigError(f"--push: a hub repo id is USER/NAME or ORG/NAME (letters, digits, '-', '_', '.'), "
                          f"got {repo_id!r}")
    return repo_id


def _hub():
    try:
        import huggingface_hub
    except ImportError as e:  # a dependency of transformers: missing only in a broken install
        raise MissingExtra("--push needs huggingface_hub: pip install huggingface_hub "
                          "(or reinstall tinyrl: pip install tinyrl-rlvr)") from e
    return huggingface_hub


def login_token(token: str | None = None) -> str:
    """The token to push with: `token`, else HF_TOKEN or the saved login; ConfigError when there is none."""
    token = token or _hub().get_token()
    if not token:
        raise ConfigError("--push: not logged in to the Hugging Face Hub; run `hf auth login` "
                          "(or set HF_TOKEN to a token with write access)")
    return token


def _http_errors(hub) -> tuple[type, ...]:
    """The hub client's HTTP errors: HfHubHTTPError (a refusal) and the HTTP library's base error it
    derives from, which a connection failure raises too (httpx's ConnectError is no OSError)."""
    refused = hub.errors.HfHubHTTPError
    return (refused, *[c for c in refused.__mro__[1:] if c.__name__ == "HTTPError"])


def _stage(folder: Path, card: str, into: Path) -> None:
    """`into` holds a link to every file of `folder` (its README.md aside) and the card as README.md."""
    for src in folder.rglob("*"):
        rel = src.relative_to(folder)
        if src.is_dir() or rel.as_posix() == "README.md" or rel.parts[0].startswith("."):
            continue
        dst = into / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(src.resolve(), dst)
    (into / "README.md").write_text(card)


def push(run_dir: str | Path, repo_id: str, folder: str | Path, kind: str = "adapter", private: bool = False,
         token: str | None = None, dtype: str | None = None) -> str:
    """Upload `folder`, the run's adapter folder (`kind` adapter) or a merged export of it (`kind`
    merged: tinyrl.exporter), to `repo_id` with a model card; returns the repo's URL."""
    check_repo_id(repo_id)
    if kind not in KINDS:
        raise ConfigError(f"kind: must be one of {list(KINDS)}, got {kind!r}")
    folder = Path(folder)
    need = "adapter_config.json" if kind == "adapter" else "config.json"
    if not (folder / need).is_file():
        raise ConfigError(f"--push: {folder} is not {'an adapter' if kind == 'adapter' else 'a model'} folder "
                          f"(no {need})")
    card = model_card(run_dir, kind=kind, dtype=dtype, repo_id=repo_id)
    token = login_token(token)
    hub = _hub()
    api = hub.HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        with tempfile.TemporaryDirectory(prefix="tinyrl-push-") as staging:
            _stage(folder, card, Path(staging))
            api.upload_folder(repo_id=repo_id, folder_path=staging, repo_type="model",
                              commit_message=f"tinyrl {__version__}: {kind} of run {Path(run_dir).name}")
    except _http_errors(hub) as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        hint = ("the token was refused: log in again with `hf auth login` (a token with write access)"
                if status in (401, 403) else "the hub refused the upload" if status else "cannot reach the hub")
        raise PushError(errno.EACCES if status in (401, 403) else errno.EIO,
                        f"--push {repo_id}: {hint} ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
    return str(url)
