"""The parts of the `data` section that say which rows of which datasets: split slices, mixtures, filters.

- `data.split` / `data.eval_split` take `datasets`' split-slicing forms: `train`, `train[:10%]`,
  `train[10:20]`, `train[-100:]`, `train[:50%]+test[:10]`, `train[:33%](pct1_dropremainder)`.
  `check_split_spec` checks the form here, with no `datasets` import (its grammar, copied: the config loads
  no optional package); tinyrl.datasets_source applies it with `datasets.ReadInstruction` itself once the
  split sizes are known (a slice that selects nothing of the rows there is refused then, before the model loads).
- `data.mix`: several sources, each a `MixSource` with its own columns / template / answer extractor / split,
  interleaved by weight (tinyrl/tasks/mix.py, through `datasets.interleave_datasets`).
- `data.filter`: a `DataFilter` applied to the rendered prompts before training (tinyrl.data.filter_rows).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

from tinyrl.config.coerce import check, check_local
from tinyrl.templates import check_template

MAX_MIX = 64  # sources in data.mix
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")  # local data files (tinyrl.datasets_source.FILE_BUILDERS)
MAX_SPEC = 1_000  # characters of a split spec
ROUNDING = ("closest", "pct1_dropremainder")  # datasets.ReadInstruction's rounding modes
# datasets.arrow_reader's split grammar (_SUB_SPEC_RE, _ADDITION_SEP_RE), copied
_SUB_SPEC = re.compile(r"^(?P<split>\w+(\.\w+)*)(\[((?P<from>-?[\d_]+)(?P<from_pct>%)?)?:((?P<to>-?[\d_]+)"
                       r"(?P<to_pct>%)?)?\])?(\((?P<rounding>[^\)]*)\))?$")
_PLUS = re.compile(r"\s*\+\s*")


def check_split_spec(spec: str, path: str) -> list[str]:
    """The split names `spec` reads; ConfigError naming `path` for a form `datasets` does not read, a percent
    outside [-100, 100], an unknown rounding, or a slice that selects nothing whatever the split's size.

    >>> check_split_spec("train[:50%]+test[:10]", "data.split")
    ['train', 'test']
    >>> check_split_spec("train[10:10]", "data.split")
    Traceback (most recent call last):
    ...
    tinyrl.errors.ConfigError: data.split: 'train[10:10]' selects no rows (from 10 to 10: the end must come after the start)
    """
    check(isinstance(spec, str) and bool(spec.strip()), path, f"must name a split (train, train[:10%], ...), got {spec!r}")
    check(len(spec) <= MAX_SPEC, path, f"a split spec of at most {MAX_SPEC} characters, got {len(spec)}")
    names = []
    for part in _PLUS.split(spec.strip()):
        m = _SUB_SPEC.match(part)
        check(m is not None, path, f"{part!r} is not a split or a slice of one; the forms: train, train[:10%], "
                                   f"train[10:20], train[-100:], train[:50%]+test[:10], train[:33%](pct1_dropremainder)")
        rounding = m.group("rounding")
        check(rounding is None or rounding in ROUNDING, path, f"{part!r}: rounding must be one of {list(ROUNDING)}, "
                                                              f"got {rounding!r}")
        bounds = [(m.group(k), bool(m.group(f"{k}_pct"))) for k in ("from", "to")]
        for value, pct in bounds:
            if value is not None:
                n = int(value.replace("_", ""))
                check(not pct or -100 <= n <= 100, path, f"{part!r}: a percent bound is in [-100%, 100%], got {n}%")
                check(abs(n) <= 10**12, path, f"{part!r}: a row bound of at most 10^12, got {n}")
        (lo, lo_pct), (hi, hi_pct) = bounds
        if hi is not None:  # decidable without the split's size: both bounds of one kind and sign, or an end at 0
            h = int(hi.replace("_", ""))
            check(h != 0, path, f"{part!r} selects no rows (it ends at 0)")
            if lo is not None and lo_pct == hi_pct:
                lo_n = int(lo.replace("_", ""))
                check(not ((lo_n >= 0) == (h >= 0) and lo_n >= h), path,
                      f"{part!r} selects no rows (from {lo_n} to {h}: the end must come after the start)")
        names.append(m.group("split"))
    return names


def check_columns(columns: dict, path: str) -> None:
    """`columns` maps `prompt` and `answer` to dataset columns (`answer: null`: no gold answer, no verifier)."""
    unknown = sorted(set(columns) - {"prompt", "answer"})
    check(not unknown, path, f"maps 'prompt' and 'answer' to dataset columns; unknown keys {unknown}")
    for key, col in columns.items():
        check((isinstance(col, str) and bool(col)) or (key == "answer" and col is None), f"{path}.{key}",
              f"must be a column name{' (or null: no gold answer, no verifier)' if key == 'answer' else ''}, "
              f"got {col!r}")


@dataclass
class MixSource:
    """One source of `data.mix`: a dataset and how to read its rows, drawn with probability weight / sum."""

    LIMITS = {"weight": (0, 1e6)}

    dataset: str  # a hub id or a local file or folder, as data.dataset
    weight: float = 1.0  # relative share of the mixture (probabilities are the weights over their sum)
    config: Optional[str] = None
    split: str = "train"  # a split or a slice of splits, as data.split
    eval_split: Optional[str] = None  # null: a seeded data.eval_fraction of `split` held out
    columns: dict = field(default_factory=dict)  # {prompt: <column>, answer: <column>} of this source
    prompt_template: Optional[str] = None
    answer_extractor: Literal["auto", "gsm8k", "boxed", "plain"] = "auto"

    def validate(self, p: str) -> None:
        ds = self.dataset
        check(bool(ds.strip()), f"{p}.dataset", "must name a dataset (a hub id or a local file or folder)")
        if ds.startswith((".", "/", "~")) or Path(ds).suffix.lower() in FILE_SUFFIXES:
            check_local(ds, f"{p}.dataset", hint=" (a hub id is 'owner/name')")
        check(math.isfinite(self.weight) and self.weight > 0, f"{p}.weight",
              f"must be > 0 and finite (a share of the mixture), got {self.weight}")
        check_split_spec(self.split, f"{p}.split")
        if self.eval_split is not None:
            check_split_spec(self.eval_split, f"{p}.eval_split")
        check_columns(self.columns, f"{p}.columns")
        if self.prompt_template is not None:
            check_template(self.prompt_template, f"{p}.prompt_template")


@dataclass
class DataFilter:
    """Rows dropped before training (tinyrl.data.filter_rows); each count dropped is logged and in summary.json."""

    LIMITS = {"max_prompt_tokens": (1, 10_000_000)}

    # drop rows whose prompt, as the engine sees it (chat template applied), is longer than this; null: keep all
    max_prompt_tokens: Optional[int] = None

    def validate(self, p: str) -> None:
        n = self.max_prompt_tokens
        check(n is None or n >= 1, f"{p}.max_prompt_tokens", f"must be >= 1 or null (no filter), got {n}")


def check_mix(data, p: str) -> None:
    """`data.mix` against the rest of the data section: it replaces data.dataset and its per-source fields."""
    if not data.mix:
        return
    check(len(data.mix) <= MAX_MIX, f"{p}.mix", f"at most {MAX_MIX} sources, got {len(data.mix)}")
    check(data.dataset is None, f"{p}.mix", "and data.dataset are two ways to name the rows: give the one "
                                             "dataset as the mix's only source, or drop data.mix")
    check(data.task == "dataset", f"{p}.mix", f"gives the rows of data.task 'dataset', not of the {data.task!r} task")
    # the fields each source sets for itself: set at the top they would be silently ignored
    own = {"columns": {}, "prompt_template": None, "config": None, "split": "train", "eval_split": None,
           "answer_extractor": "auto"}
    for name, default in own.items():
        check(getattr(data, name) == default, f"{p}.{name}",
              f"with data.mix each source sets its own (data.mix[i].{name}); leave data.{name} at its default")
