"""Share a run on the Hugging Face Hub: its model card, and the upload of its adapter or merged model.

    tinyrl export RUN_DIR --push USER/NAME [--private]                 # the LoRA adapter (peft)
    tinyrl export RUN_DIR --merged OUT --push USER/NAME [--private]    # the merged model (tinyrl.exporter)

`model_card` writes the README.md the repo gets, from the run folder alone: the preset, the method,
the steps trained, the reward functions, held-out accuracy before and after (summary.json) and the
tinyrl version, then how to load the upload and the run's whole config.yaml. `push` checks for a login
before anything else (`hf auth login`, or HF_TOKEN), creates the repo (`HfApi.create_repo`,
exist_ok) and uploads the folder with the card (`HfApi.upload_folder`): the folder itself is never
changed, the card goes in through a staging folder of links beside a fresh README.md.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from pathlib import Path

import yaml

from tinyrl.errors import ConfigError
from tinyrl.runs import RunDir
from tinyrl.version import __version__

KINDS = ("adapter", "merged")
SUMMARY_FILE = "summary.json"  # tinyrl.methods.common's one summary schema (read here as plain JSON)
_STAMP = re.compile(r"-\d{8}-\d{6}(-\d+)?$")  # RunDir.create's suffix for a taken name
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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
    """What the card says, read from the run folder: config.yaml and summary.json."""
    run = RunDir(Path(run_dir).expanduser())
    cfg = run.config()
    summary_path = run.path / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    model, log, train = cfg.get("model", {}), cfg.get("log", {}), cfg.get("train", {})
    name = run.path.resolve().name
    stages = cfg.get("stages") or []
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
        "lora": cfg.get("lora", {}),
    }


def model_card(run_dir: str | Path, kind: str = "adapter", dtype: str | None = None,
               repo_id: str | None = None) -> str:
    """The README.md of an upload: `kind` adapter (peft) or merged (a plain transformers model)."""
    if kind not in KINDS:
        raise ConfigError(f"kind: must be one of {list(KINDS)}, got {kind!r}")
    f = run_facts(run_dir)
    base = f["base_model"]
    meta = {"library_name": "peft" if kind == "adapter" else "transformers", "pipeline_tag": "text-generation",
            "tags": ["tinyrl", *dict.fromkeys(f["method"].split("+")), "lora", "rlvr"]
            + (["qlora"] if f["quantized"] == "nf4 (QLoRA)" else [])}
    if _hub_id(base):
        meta["base_model"] = base
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
            ("held-out after", _pct(f["eval_after"])),
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
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "", f"# {title}", "",
             f"{what}, trained with tinyrl (`pip install tinyrl-rlvr`: reinforcement learning with "
             f"verifiable rewards).{quantized}", ""]
    if f["description"]:
        lines += [f"> {f['description']}", ""]
    lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), "", "## Use", "", use,
              "## Training config", "", "<details><summary>config.yaml of the run</summary>", "",
              "```yaml", yaml.safe_dump(f["config"], sort_keys=False).strip(), "```", "", "</details>", ""]
    return "\n".join(lines)


def check_repo_id(repo_id: str) -> str:
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or len(repo_id) > 96:
        raise ConfigError(f"--push: a hub repo id is USER/NAME or ORG/NAME (letters, digits, '-', '_', '.'), "
                          f"got {repo_id!r}")
    return repo_id


def _hub():
    try:
        import huggingface_hub
    except ImportError as e:  # a dependency of transformers: missing only in a broken install
        raise ImportError("--push needs huggingface_hub: pip install huggingface_hub "
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
