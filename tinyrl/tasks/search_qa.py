"""Built-in agent tasks: `search_qa` (Search-R1 style question answering) and `gaia` (scoring).

`search_qa` rows carry `question`, `golden_answers` and a `prompt` built from a template
(`tinyrl.agents.prompts`); `is_correct` is Search-R1's exact match on the response's last
`<answer>`. Its default files are the shipped offline search world
(`tinyrl/assets/search-world`: questions `train.jsonl` / held-out `test.jsonl`, split by person,
and `corpus.jsonl`, which the `search` tool reads unless `agent.corpus` names another corpus).
Point it at real Search-R1 data with `data.task_args.train_path` / `eval_path` (NQ, HotpotQA
as FlashRAG / Search-R1 prepare them) and set `agent.corpus` (e.g. wiki-18).

Task args (`data.task_args`): `train_path`, `eval_path`, `template` (`search_r1` | `plain` |
`bare`, default `search_r1`), `hops` (keep only questions with this many hops, where the rows
say: the shipped world's `metadata.hops`). Rows are drawn in a seeded order; `num_train` /
`num_eval` larger than a file take all of it.

`gaia` scores a GAIA `metadata.jsonl` (`data.task_args.path`) with GAIA's official scorer; it has
held-out rows only (GAIA is for evaluation, never training).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from importlib import resources

from tinyrl.agents.data import load_gaia, load_qa_rows
from tinyrl.agents.demonstrations import Answer, Call
from tinyrl.agents.prompts import question_prompt
from tinyrl.agents.world import QUESTIONS, answer, read_world
from tinyrl.rewards.qa import (
    em_check,
    extract_answer,
    extract_gaia_answer,
    f1_score,
    gaia_question_scorer,
    normalize_answer,
)
from tinyrl.tasks.base import Task


def world_dir():
    return resources.files("tinyrl.assets") / "search-world"


@dataclass
class SearchTask(Task):
    corpus: str | None = None  # the corpus the task's questions are about (the search tool's default)


def _draw(rows: list[dict], n: int, rng: random.Random) -> list[dict]:
    rows = list(rows)
    rng.shuffle(rows)
    return rows[:n]


def _prepare(rows: list[dict], template: str) -> list[dict]:
    return [{**r, "prompt": question_prompt(r["question"], template),
             "hops": (r.get("metadata") or {}).get("hops")} for r in rows]


def build(num_train: int, num_eval: int, seed: int = 0, train_path: str | None = None, eval_path: str | None = None,
          template: str = "search_r1", hops: int | None = None) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) from Search-R1-format question files (default: the shipped world)."""
    question_prompt("x", template)  # a wrong template fails here, before any file is read
    train = load_qa_rows(train_path or world_dir() / "train.jsonl")
    held = load_qa_rows(eval_path or world_dir() / "test.jsonl")
    if hops is not None:
        train = [r for r in train if r["metadata"].get("hops") == hops]
        held = [r for r in held if r["metadata"].get("hops") == hops]
    train = _draw(train, num_train, random.Random(f"search_qa-train-{seed}"))
    held = _draw(held, num_eval, random.Random(f"search_qa-eval-{seed}"))
    return _prepare(train, template), _prepare(held, template)


def is_correct(completion: str, row: dict) -> bool:
    """Search-R1 EM of the response's last `<answer>` against the row's golden answers.

    >>> is_correct("<search> x </search><information>...</information><answer> Kelmora </answer>",
    ...            {"golden_answers": ["Kelmora"]})
    True
    """
    return em_check(extract_answer(completion), row["golden_answers"])


def answer_of(completion: str, row: dict) -> str | None:
    """The last `<answer>`, normalised as Search-R1's EM compares it (the answer maj@k votes on).

    >>> answer_of("<answer> The Kelmora. </answer>", {}), answer_of("no tag", {})
    ('kelmora', None)
    """
    found = extract_answer(completion)
    return (normalize_answer(found) or None) if found is not None else None


def qa_scores(completion: str, row: dict) -> dict[str, float]:
    """Search-R1's EM and token F1 of the last `<answer>` (the evaluation report's extra columns)."""
    answer = extract_answer(completion)
    return {"em": float(em_check(answer, row["golden_answers"])), "f1": f1_score(answer, row["golden_answers"])}


@functools.cache
def _world_people() -> dict:
    return read_world(world_dir()).by_name()


def demonstrate(row: dict) -> list | None:
    """The expert's steps for a question of the shipped world: search the person, for a 2-hop
    question search their teacher too, then answer. None for a row the world cannot vouch for
    (not its question, or a golden answer the world's table does not give).

    >>> [type(s).__name__ for s in demonstrate({"question": "q", "golden_answers": ["x"]}) or []]
    []
    """
    meta = row.get("metadata") or {}
    people = _world_people()
    person = people.get(meta.get("entity"))
    if person is None or meta.get("type") not in QUESTIONS or answer(people, person, meta["type"]) not in row["golden_answers"]:
        return None
    steps = [Call("search", {"query": person.name})]
    if meta.get("hops") == 2:
        steps.append(Call("search", {"query": person.teacher}))
    return steps + [Answer(row["golden_answers"][0])]


TASK = SearchTask(
    name="search_qa",
    description="multi-hop questions answered by searching a corpus (default: the shipped offline world); EM",
    build=build,
    is_correct=is_correct,
    scores=qa_scores,
    demonstrate=demonstrate,
    answer_of=answer_of,
    corpus=str(world_dir() / "corpus.jsonl"),
)


def build_gaia(num_train: int, num_eval: int, seed: int = 0, path: str | None = None,
               template: str = "bare") -> tuple[list[dict], list[dict]]:
    """([], held-out rows) of a GAIA metadata.jsonl (GAIA is never trained on)."""
    if path is None:
        raise ValueError("data.task_args.path: the gaia task needs GAIA's metadata.jsonl (the set is gated: "
                         "download it from the hub yourself)")
    rows = [r for r in load_gaia(path) if r["golden_answers"]]
    return [], _prepare(rows[:num_eval] if num_eval else rows, template)


def is_correct_gaia(completion: str, row: dict) -> bool:
    golds = row.get("golden_answers") or []
    return bool(golds) and gaia_question_scorer(extract_gaia_answer(completion), golds[0])


GAIA_TASK = Task(
    name="gaia",
    description="GAIA metadata.jsonl (task_args.path) scored with GAIA's official question scorer; eval only",
    build=build_gaia,
    is_correct=is_correct_gaia,
)
