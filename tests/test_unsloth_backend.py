"""model.backend=unsloth: a clear error naming the extra where it cannot run; unsloth stays unimported.

Unsloth itself needs a CUDA GPU, so only its failure paths run here. The CUDA-present case
patches `torch.cuda.is_available` (a boundary we cannot run on this machine) to reach the
missing-package check."""

import subprocess
import sys

import pytest
import torch

from tinyrl.backends import unsloth as backend
from tinyrl.config import load_config
from tinyrl.model import ModelLoadError, load_policy


def unsloth_cfg(**kw):
    _, cfg = load_config(None, {"model.backend": "unsloth", **kw})
    return cfg


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU error path")
def test_cpu_error_names_the_extra_and_the_way_out():
    cfg = unsloth_cfg()
    with pytest.raises(ModelLoadError, match=r"needs a CUDA GPU.*pip install 'tinyrl-rlvr\[unsloth\]'.*transformers"):
        load_policy(cfg.model, cfg.lora)
    assert "unsloth" not in sys.modules


def test_missing_package_error_names_the_extra(monkeypatch):
    if backend.importlib.util.find_spec("unsloth") is not None:
        pytest.skip("unsloth is installed here")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = unsloth_cfg()
    with pytest.raises(ModelLoadError, match=r"needs the unsloth extra: pip install 'tinyrl-rlvr\[unsloth\]'"):
        load_policy(cfg.model, cfg.lora)


def test_cli_reports_it_as_one_line_not_a_traceback(run_root):
    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "train", "model.backend=unsloth",
                          f"log.run_dir={run_root}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "tinyrl: error: model.backend: this run needs unsloth, which is not installed" in out.stderr and "Traceback" not in out.stderr


def test_target_modules_in_unsloths_form():
    assert backend.target_modules("all-linear") == backend.PROJECTIONS
    assert backend.target_modules(["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    assert backend.target_modules("lm_head") == ["lm_head"]


def test_every_unsloth_import_is_in_the_backend_file():
    from pathlib import Path

    root = Path(backend.__file__).resolve().parents[1]
    hits = [str(p.relative_to(root)) for p in root.rglob("*.py")
            if any(line.strip().startswith(("import unsloth", "from unsloth")) for line in p.read_text().splitlines())]
    assert hits == ["backends/unsloth.py"]
    out = subprocess.run([sys.executable, "-c", "import tinyrl, tinyrl.model, tinyrl.backends.unsloth, sys; "
                          "print('unsloth' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
