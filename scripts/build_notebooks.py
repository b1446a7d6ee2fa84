"""Build notebooks/*.ipynb from their sources in notebooks/src/*.py (jupytext percent format).

    python scripts/build_notebooks.py          # write the notebooks
    python scripts/build_notebooks.py --check  # exit 1 if a notebook is out of date

The .py sources are what we edit and review; the .ipynb files (no outputs, ever) are what Colab
opens. tests/test_notebooks.py checks they agree and runs every notebook.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "notebooks"


def build(src: Path) -> str:
    import jupytext
    import nbformat

    nb = jupytext.read(src, fmt="py:percent")
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"  # stable ids: the same source builds the same file
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "tags"}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nbformat.writes(nb) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    stale = []
    for src in sorted((ROOT / "src").glob("*.py")):
        out, text = ROOT / f"{src.stem}.ipynb", build(src)
        if args.check:
            if not out.exists() or out.read_text() != text:
                stale.append(out.name)
        else:
            out.write_text(text)
    if stale:
        print(f"out of date: {stale}; run python scripts/build_notebooks.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
