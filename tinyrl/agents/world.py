"""An offline multi-hop search world: invented people, facts about them, a corpus, questions.

Nobody knows these facts without searching: names, places and who-taught-whom are drawn at
random from a seed. Each person has a birthplace (a city), a job and a teacher (another
person); the corpus has one short document per person, in Search-R1's corpus format:

    {"id": "17", "contents": "\\"Brenna Tillen\\"\\nBrenna Tillen works as a potter. Brenna Tillen
     was born in Kelmora. Brenna Tillen was taught by Zorvak Quist."}

Questions (Search-R1 / FlashRAG format: `question`, `golden_answers`, plus `metadata`), five
per person:

    1-hop  where was X born?                    -> X's city
    1-hop  what is the job of X?                -> X's job
    1-hop  who taught X?                        -> X's teacher
    2-hop  where was the teacher of X born?     -> the teacher's city
    2-hop  what is the job of the teacher of X? -> the teacher's job

Train / held-out split **by person**: a held-out share of the people (and every question about
them) is held out, and teachers are drawn within each side, so a held-out question's chain
never passes through a train person. Names are a first name and a last name from two pools
shared by both sides (every name *token* is seen in training), but no held-out person (the
pair) appears in a train question, and their documents are in the corpus: only searching
answers a held-out question. Cities and jobs are values, not people: both sides share them.

`make_world(WorldSpec(seed=...))` is deterministic for a seed; `write_world` writes
`corpus.jsonl`, `train.jsonl`, `test.jsonl` and `world.json` (the people table).
`scripts/make_search_world.py` is its command line; the shipped world is
`tinyrl/assets/search-world` (seed 0).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

JOBS = ["potter", "baker", "weaver", "sailor", "farmer", "painter", "tailor", "miner",
        "hunter", "fisher", "smith", "carpenter", "singer", "doctor", "gardener", "brewer"]

QUESTIONS = {  # type -> (template, hops)
    "born": ("where was {x} born?", 1),
    "job": ("what is the job of {x}?", 1),
    "teacher": ("who taught {x}?", 1),
    "born2": ("where was the teacher of {x} born?", 2),
    "job2": ("what is the job of the teacher of {x}?", 2),
}
SENTENCES = {
    "born": "{x} was born in {v}.",
    "job": "{x} works as a {v}.",
    "teacher": "{x} was taught by {v}.",
}

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "t", "th", "v", "z"]
_VOWELS = ["a", "e", "i", "o", "u"]
_MIDDLES = ["l", "r", "n", "m", "v", "s", "th", "nd", "rk", "lv", "st", "z"]
_CODAS = ["", "n", "r", "k", "s", "l", "th", "x"]


@dataclass
class WorldSpec:
    seed: int = 0
    n_people: int = 300
    held_out_share: float = 0.2
    n_first_names: int = 40
    n_last_names: int = 40
    n_cities: int = 24


@dataclass
class Person:
    name: str
    first: str
    last: str
    born: str
    job: str
    teacher: str
    split: str  # "train" | "test"


@dataclass
class World:
    spec: WorldSpec
    first_names: list[str]
    last_names: list[str]
    cities: list[str]
    jobs: list[str]
    people: list[Person] = field(default_factory=list)

    def by_name(self) -> dict[str, Person]:
        return {p.name: p for p in self.people}


def _invent(rng: random.Random, n: int, taken: set[str], suffixes: list[str] | None = None) -> list[str]:
    """n new capitalised two-syllable names, none in `taken` (which grows)."""
    out = []
    while len(out) < n:
        word = rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_MIDDLES) + rng.choice(_VOWELS)
        word += rng.choice(suffixes) if suffixes else rng.choice(_CODAS)
        word = word.capitalize()
        if word not in taken and 4 <= len(word) <= 9:
            taken.add(word)
            out.append(word)
    return out


def make_world(spec: WorldSpec | None = None) -> World:
    """People with facts, split by person; deterministic for `spec.seed` (default: `WorldSpec()`)."""
    spec = spec or WorldSpec()
    rng = random.Random(f"search-world-{spec.seed}")
    taken: set[str] = set()
    first = _invent(rng, spec.n_first_names, taken)
    last = _invent(rng, spec.n_last_names, taken)
    cities = _invent(rng, spec.n_cities, taken, suffixes=["ra", "dell", "mor", "wick", "holm", "ton", "via"])
    pairs = [(f, la) for f in first for la in last]
    if spec.n_people > len(pairs):
        raise ValueError(f"n_people={spec.n_people} exceeds the {len(pairs)} distinct names of the pools")
    chosen = rng.sample(pairs, spec.n_people)
    n_test = round(spec.n_people * spec.held_out_share)
    sides = {"test": chosen[:n_test], "train": chosen[n_test:]}
    people = []
    for split, members in sides.items():
        names = [f"{f} {la}" for f, la in members]
        if len(names) < 2:
            raise ValueError("each side of the split needs at least two people (a teacher is someone else)")
        for (f, la), name in zip(members, names):
            teacher = rng.choice([n for n in names if n != name])
            people.append(Person(name, f, la, rng.choice(cities), rng.choice(JOBS), teacher, split))
    people.sort(key=lambda p: p.name)
    return World(spec, first, last, cities, list(JOBS), people)


def document(person: Person, rng: random.Random) -> str:
    """The person's corpus `contents`: the quoted title line, then the three facts in random order."""
    facts = [SENTENCES[r].format(x=person.name, v=getattr(person, r)) for r in ("born", "job", "teacher")]
    rng.shuffle(facts)
    return f'"{person.name}"\n' + " ".join(facts)


def answer(world_people: dict[str, Person], person: Person, qtype: str) -> str:
    subject = world_people[person.teacher] if qtype.endswith("2") else person
    relation = qtype.rstrip("2")
    return getattr(subject, relation)


def questions(world: World, split: str) -> list[dict]:
    """The questions about the people of `split`, in a fixed order."""
    people = world.by_name()
    rows = []
    for person in world.people:
        if person.split != split:
            continue
        for qtype, (template, hops) in QUESTIONS.items():
            rows.append({
                "id": f"{split}_{len(rows)}",
                "question": template.format(x=person.name),
                "golden_answers": [answer(people, person, qtype)],
                "metadata": {"type": qtype, "hops": hops, "entity": person.name},
            })
    return rows


def corpus(world: World) -> list[dict]:
    rng = random.Random(f"search-world-docs-{world.spec.seed}")
    return [{"id": str(i), "contents": document(p, rng)} for i, p in enumerate(world.people)]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_world(world: World, out: str | Path) -> dict[str, Path]:
    """Write corpus.jsonl, train.jsonl, test.jsonl and world.json under `out`; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.jsonl" for name in ("corpus", "train", "test")}
    _write_jsonl(paths["corpus"], corpus(world))
    _write_jsonl(paths["train"], questions(world, "train"))
    _write_jsonl(paths["test"], questions(world, "test"))
    paths["world"] = out / "world.json"
    table = {"spec": asdict(world.spec), "first_names": world.first_names, "last_names": world.last_names,
             "cities": world.cities, "jobs": world.jobs,
             "people": [[p.name, p.born, p.job, p.teacher, p.split] for p in world.people]}
    paths["world"].write_text(json.dumps(table, separators=(",", ":")) + "\n")
    return paths


def read_world(folder: str | Path) -> World:
    """The World written by `write_world` (its world.json)."""
    table = json.loads((Path(folder) / "world.json").read_text())
    people = [Person(n, n.split(" ")[0], n.split(" ")[1], b, j, t, s) for n, b, j, t, s in table["people"]]
    return World(WorldSpec(**table["spec"]), table["first_names"], table["last_names"], table["cities"],
                 table["jobs"], people)
