"""The Export tab's pieces (no gradio): what `tinyrl export` can do here, the command for a choice, the hub
login check, and an export's state read back from the run folder.

An export runs as `tinyrl export RUN ...` in its own process (as training does), its output in
`<run>/export.log`, its pid in `<run>/export.pid` and what was asked in `<run>/export.json`; what it
writes goes to `<run>/exports/<name>`. Kinds:

    merged    the base with the adapter merged in, 16-bit (or float32): `--merged OUT --dtype D`
    adapter   the LoRA adapter alone: copied with its model card into OUT here (no model loads; the CLI
              has no local adapter export), and uploaded by `tinyrl export RUN --push REPO`
    gguf      one GGUF file: `--gguf OUT.gguf --gguf-type T`, offered once the CLI has it

>>> command(Path("/r"), "merged", Path("/r/exports/m"), dtype="float16", push="me/m")[3:]
['export', '/r', '--merged', '/r/exports/m', '--dtype', 'float16', '--push', 'me/m']
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tinyrl.apps import procs, runs_view
from tinyrl.apps.paths import check_name, inside
from tinyrl.errors import ConfigError
from tinyrl.hub_push import login_token, model_card
from tinyrl.runs import atomic_write_text

KINDS = {"merged": "merged model (base + adapter, one folder)", "adapter": "the adapter alone (LoRA, peft)",
         "gguf": "GGUF (llama.cpp, one file)"}
DTYPES = ("bfloat16", "float16", "float32")
GGUF_TYPES = ("f16", "bf16", "q8_0", "f32")
OUT_DIR = "exports"
INFO, LOG = "export.json", "export.log"
BANNER = "=== tinyrl ui: export"
URL = re.compile(r"^uploaded .*?: (https?://\S+)", re.M)


@functools.cache
def cli_help() -> str:
    """`tinyrl export --help` of the CLI the UI runs (asked once: what it supports is what it prints)."""
    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "export", "--help"], capture_output=True, text=True,
                         timeout=120)
    return out.stdout


def gguf_missing() -> str | None:
    """Why GGUF export is not offered (None: the CLI has `--gguf`)."""
    if "--gguf" in cli_help():
        return None
    return "GGUF: not available yet (this tinyrl's `tinyrl export` has no --gguf option; it is being added)"


def login_state() -> tuple[bool, str]:
    """(logged in, words) of the Hugging Face Hub login `--push` needs, checked before any work."""
    try:
        login_token()
    except (ConfigError, ImportError) as e:
        return False, (f"**not logged in** to the Hugging Face Hub ({str(e).split(';', 1)[-1].strip()}) in the "
                       f"shell that runs `tinyrl ui`: nothing is exported or uploaded until then")
    return True, "**logged in** to the Hugging Face Hub (a token from HF_TOKEN or `hf auth login`)"


def default_name(kind: str, dtype: str, gguf_type: str) -> str:
    return {"merged": f"merged-{dtype}", "adapter": "adapter", "gguf": f"model-{gguf_type}.gguf"}[kind]


def out_path(run: Path, name: str) -> Path:
    """`<run>/exports/<name>`: a name from the page, kept inside the run folder."""
    return Path(run) / OUT_DIR / check_name(name, "export name")


def command(run: Path, kind: str, out: Path | None, dtype: str = "bfloat16", push: str | None = None,
            private: bool = False, gguf_type: str = "f16") -> list[str]:
    """The `tinyrl export` command of a choice (kind adapter: the push only; its copy is `copy_adapter`)."""
    cmd = [sys.executable, "-m", "tinyrl.cli", "export", str(run)]
    if kind == "merged":
        cmd += ["--merged", str(out), "--dtype", dtype]
    elif kind == "gguf":
        cmd += ["--gguf", str(out), "--gguf-type", gguf_type]
    if push:
        cmd += ["--push", push] + (["--private"] if private else [])
    return cmd


def copy_adapter(run: Path, out: Path) -> Path:
    """The run's final adapter and its model card (README.md) in the new folder `out`."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not empty; an export never overwrites (pick another name)")
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in sorted((run / "adapter").iterdir()):
        if f.is_file() and not f.is_symlink() and inside(f, run) and f.name != "README.md":
            shutil.copy2(f, tmp / f.name)
    (tmp / "README.md").write_text(model_card(run, kind="adapter"))
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out


def write_info(run: Path, **info) -> dict:
    info["at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    atomic_write_text(Path(run) / INFO, json.dumps(info))
    return info


def written(out: Path, kind: str) -> bool:
    need = {"merged": "config.json", "adapter": "adapter_config.json"}.get(kind)
    return out.is_file() if kind == "gguf" else (out / need).is_file()


def state(runs_dir: Path, name: str) -> dict:
    """The run's last export: state (none / running / done / failed), what was asked, elapsed seconds,
    the log's end, its output folder and files, the model card, the hub URL, or the error."""
    run = Path(runs_dir) / name
    info = runs_view.read_json(run / INFO)
    if info is None:
        return {"state": "none"}
    out = run / info.get("out", "") if info.get("out") else None
    text = runs_view.log_tail(run / LOG, lines=400)
    log = text[text.rfind(BANNER):] if BANNER in text else text
    alive = procs.alive(runs_view.process(runs_dir, name, "export"))
    res = {**info, "log": "\n".join(log.splitlines()[-12:]), "out_path": out}
    pid = runs_view.process(runs_dir, name, "export") or {}
    started = pid.get("started_at")
    if alive:
        return {**res, "state": "running", "elapsed": time.time() - started if started else None}
    url = URL.search(log)
    errors = [ln for ln in log.splitlines() if ln.startswith("tinyrl: error")]
    done = (out is None or written(out, info["kind"])) and not errors and (not info.get("push") or url)
    res.update(url=url and url.group(1), error=errors[-1] if errors else None)
    if done and out is not None:
        card = out / "README.md"  # (a GGUF file has none)
        res.update(files=files_of(out), card=card_text(card.read_text()) if card.is_file() else None)
    res["state"] = "done" if done else "failed"
    if not done and res["error"] is None:
        res["error"] = next((ln.strip() for ln in reversed(log.splitlines()) if ln.strip()), "no output")
    return res


def card_text(card: str) -> str:
    """A model card as the page shows it: its YAML front matter (the hub's metadata) folded away.

    >>> card_text("---\\nlibrary_name: peft\\n---\\n# r1").splitlines()[2:5]
    ['```yaml', 'library_name: peft', '```']
    """
    if card.startswith("---\n") and (end := card.find("\n---\n", 4)) > 0:
        return (f"<details><summary>hub metadata (the card's YAML front matter)</summary>\n\n```yaml\n"
                f"{card[4:end]}\n```\n\n</details>\n{card[end + 5:]}")
    return card


def files_of(out: Path) -> list[tuple[str, int]]:
    """(relative name, bytes) of what an export wrote."""
    if out.is_file():
        return [(out.name, out.stat().st_size)]
    return [(str(p.relative_to(out)), p.stat().st_size) for p in sorted(out.rglob("*")) if p.is_file()]


def size_text(n: int) -> str:
    """A file size as the files table shows it.

    >>> size_text(512), size_text(3 * 1024 + 100), size_text(2_150_000)
    ('512 B', '3.1 KiB', '2.05 MiB')
    """
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:.2f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"
