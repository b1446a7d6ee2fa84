"""Generate tinyrl's offline multi-hop search world (see tinyrl/agents/world.py for what is in it).

    python scripts/make_search_world.py                 # writes tinyrl/assets/search-world/ (seed 0)
    python scripts/make_search_world.py --out /tmp/w --seed 3 --people 1000

Writes, in Search-R1's own formats so one loader serves this world and real Search-R1 data:
corpus.jsonl (`{"id", "contents": "\\"Title\\"\\ntext"}`), train.jsonl and test.jsonl (FlashRAG
rows: `id`, `question`, `golden_answers`, `metadata`), and world.json (the people table, for
scripts/pretrain_tiny_search.py). The split is by person; the same seed writes the same bytes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tinyrl.agents.world import WorldSpec, make_world, write_world

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tinyrl" / "assets" / "search-world"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--people", type=int, default=WorldSpec.n_people)
    p.add_argument("--held-out-share", type=float, default=WorldSpec.held_out_share)
    args = p.parse_args()
    world = make_world(WorldSpec(seed=args.seed, n_people=args.people, held_out_share=args.held_out_share))
    paths = write_world(world, args.out)
    n_train = sum(p.split == "train" for p in world.people)
    print(f"{len(world.people)} people ({n_train} train, {len(world.people) - n_train} held out), "
          f"{len(world.cities)} cities, {len(world.jobs)} jobs")
    for path in paths.values():
        print(f"  {path}  {path.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
