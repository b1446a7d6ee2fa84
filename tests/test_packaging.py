"""A plain (non-editable) install carries presets, the tiny model and the kernels; imports stay light."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_py(code: str, **env) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env={**os.environ, **env}, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_tinyrl_is_light():
    out = run_py("import sys, tinyrl, tinyrl.config, tinyrl.kernels, tinyrl.rewards, tinyrl.tasks;"
                 "print(sorted(m for m in ('vllm', 'unsloth', 'triton', 'math_verify', 'reasoning_gym', 'gradio')"
                 " if m in sys.modules))")
    assert out.strip() == "[]"
    assert run_py("import sys, tinyrl; print('torch' in sys.modules)").strip() == "False"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    (whl,) = out.glob("tinyrl_rlvr-*.whl")
    return whl


def test_wheel_ships_presets_assets_and_kernels(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = {p.name for p in (ROOT / "presets").glob("*.yaml")}
    assert presets and all(f"tinyrl/presets/{p}" in names for p in presets)
    assets = [p.relative_to(ROOT / "tinyrl") for p in (ROOT / "tinyrl/assets").rglob("*") if p.is_file()
              and "__pycache__" not in p.parts]
    assert all(f"tinyrl/{a}" in names for a in assets)
    assert "tinyrl/kernels/__init__.py" in names
    assert {"tinyrl/apps/__init__.py", "tinyrl/apps/ui.py", "tinyrl/apps/launcher.py"} <= names  # `tinyrl ui`
    assert "tinyrl/assets/tiny-arith/model.safetensors" in names


def test_installed_wheel_finds_its_presets_and_model(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    out = run_py(
        "import tinyrl, tinyrl.kernels; from tinyrl.config import list_presets, load_config;"
        "from tinyrl.model import resolve_model; import os;"
        "print(tinyrl.__file__); print(tinyrl.kernels.__file__); print(sorted(list_presets()));"
        "load_config(None); print(os.path.isfile(os.path.join(resolve_model('tiny-arith').path, 'config.json')))",
        PYTHONPATH=str(site))
    lines = out.splitlines()
    assert lines[0].startswith(str(site)) and lines[1].startswith(str(site))  # not the source tree
    assert "tiny_grpo_cpu" in lines[2]
    assert lines[3] == "True"


def test_every_install_instruction_names_the_distribution():
    """The distribution is `tinyrl-rlvr` (`tinyrl` on the package index is another project, a wrapper
    for RLtools): every install line the user reads (README, docs, notebooks, presets, error messages)
    installs `tinyrl-rlvr`, never `tinyrl` or `tinyrl[extra]`."""
    import re

    import tomllib

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == "tinyrl-rlvr"
    wrong = re.compile(r"pip install (?:-\S+ )*['\"`]?tinyrl(?:\[|['\"`\s]|$)|(?<![\w/-])tinyrl\\?\[")
    places = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "notebooks" / "src").glob("*.py"),
              *(ROOT / "presets").glob("*.yaml"), *(ROOT / "tinyrl").rglob("*.py"), *(ROOT / "apps").glob("*.py")]
    bad = []
    for path in places:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if wrong.search(line.replace("not `pip install tinyrl`", "")):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not bad, "install lines that do not name tinyrl-rlvr:\n" + "\n".join(bad)
