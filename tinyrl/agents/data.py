"""Loaders for agent data: Search-R1 / FlashRAG question files, and GAIA's metadata.jsonl.

One loader (`load_qa_rows`) serves the shipped search world and real Search-R1 data (NQ,
HotpotQA ... as FlashRAG ships them and Search-R1 prepares them):

- FlashRAG jsonl rows: `{"id", "question", "golden_answers": [...], "metadata": {...}}`;
- Search-R1's prepared rows (its parquet files, or the same rows as jsonl): they keep the
  `question` and `golden_answers` columns and add `reward_model.ground_truth.target`.

Files may be `.jsonl`, `.jsonl.gz` or `.parquet` (parquet needs pyarrow). Questions are cleaned
as Search-R1 does (stripped, a `?` added).

`load_gaia` reads GAIA's `metadata.jsonl` (fields `task_id`, `Question`, `Level`,
`Final answer`, `file_name`, `Annotator Metadata`; the set is gated on the hub, so bring the
file): rows get `question`, `golden_answers` ([] where the answer is hidden, `?` on the test
split), `level`, `task_id`, and `file_path` (the attachment beside the metadata, or None).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tinyrl.agents.prompts import normalize_question
from tinyrl.errors import MissingExtra


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a .jsonl / .jsonl.gz / .parquet file."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; give the .jsonl, .jsonl.gz or .parquet file in it")
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise MissingExtra(f"reading {path} needs pyarrow: pip install pyarrow") from e
        return pq.read_table(path).to_pylist()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = []
        for i, line in enumerate(f):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {i + 1} is not JSON ({e})") from e
        return rows


def _golden(row: dict, where: str) -> list[str]:
    gold = row.get("golden_answers")
    if gold is None:
        gold = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    if gold is None:
        raise ValueError(f"{where}: no 'golden_answers' (or reward_model.ground_truth.target)")
    gold = [gold] if isinstance(gold, str) else list(gold)
    return [str(g) for g in gold]


def load_qa_rows(path: str | Path) -> list[dict]:
    """Search-R1 / FlashRAG question rows -> dicts with `question`, `golden_answers`, `id`, `metadata`."""
    out = []
    for i, row in enumerate(read_rows(path)):
        where = f"{path}: row {i}"
        if "question" not in row:
            raise ValueError(f"{where}: no 'question' field (Search-R1 / FlashRAG rows have "
                             f"'question' and 'golden_answers')")
        out.append({
            "id": str(row.get("id", (row.get("extra_info") or {}).get("index", i))),
            "question": normalize_question(str(row["question"])),
            "golden_answers": _golden(row, where),
            "metadata": row.get("metadata") or {},
            **({"data_source": row["data_source"]} if "data_source" in row else {}),
        })
    return out


GAIA_FIELDS = ("task_id", "Question", "Level", "Final answer", "file_name")


def load_gaia(path: str | Path) -> list[dict]:
    """GAIA's metadata.jsonl (a file, or the folder holding it) -> question rows."""
    path = Path(path)
    if path.is_dir():
        path = path / "metadata.jsonl"
    out = []
    for i, row in enumerate(read_rows(path)):
        missing = [f for f in ("task_id", "Question") if f not in row]
        if missing:
            raise ValueError(f"{path}: row {i} has no {missing} (GAIA fields: {list(GAIA_FIELDS)})")
        answer = row.get("Final answer")
        answer = None if answer is None or str(answer).strip() in ("", "?") else str(answer)
        file_name = row.get("file_name") or None
        out.append({
            "id": str(row["task_id"]),
            "task_id": str(row["task_id"]),
            "question": str(row["Question"]).strip(),
            "golden_answers": [answer] if answer is not None else [],
            "level": int(row["Level"]) if str(row.get("Level", "")).strip().isdigit() else row.get("Level"),
            "file_name": file_name,
            "file_path": str(path.parent / file_name) if file_name else None,
            "annotator_metadata": row.get("Annotator Metadata"),
        })
    return out
