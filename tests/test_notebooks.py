"""Every notebook in notebooks/ runs top to bottom on a CPU with the tiny model, and none is
committed with outputs or out of step with its source in notebooks/src/."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# small budgets for CI, through each notebook's parameters cell (papermill)
CI_PARAMETERS = {
    "01_quickstart": {"STEPS": 40},
    "02_qlora_grpo_one_gpu": {"CPU_STEPS": 40, "FORCE_CPU": True},
    "03_your_own_reward": {"STEPS": 40, "HACK_STEPS": 60},
    "04_search_agent": {"STEPS": 30},  # its searches/EM checks were measured at 30 steps (seeds 0-5)
}


def test_there_are_notebooks_and_each_has_a_source():
    assert NOTEBOOKS
    assert {p.stem for p in NOTEBOOKS} == {p.stem for p in (ROOT / "notebooks" / "src").glob("*.py")}


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_saved_outputs(nb):
    cells = json.loads(nb.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code), f"{nb.name} has saved outputs"
    assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in code), "no parameters cell"


def test_notebooks_match_their_sources():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_notebooks.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(nb, tmp_path):
    import papermill

    t0 = time.perf_counter()
    papermill.execute_notebook(str(nb), str(tmp_path / nb.name), parameters=CI_PARAMETERS.get(nb.stem, {}),
                               kernel_name="python3", cwd=str(tmp_path), progress_bar=False)
    print(f"{nb.name}: {time.perf_counter() - t0:.0f} s")  # issue 17: each <= 2 minutes on a CPU
