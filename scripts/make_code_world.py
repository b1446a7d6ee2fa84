"""Write the shipped code world (tinyrl/assets/code-world/{train,test}.jsonl) from tinyrl.tasks.code_world.

    python scripts/make_code_world.py            # 5 rows per train composition, 2 per held-out one
    python scripts/make_code_world.py --out /tmp/cw --train-per-pair 3

The rows are MBPP-style (`task_id`, `text`, `test_list`, `entry_point`, plus the reference `code`
and the `composition`); test.jsonl holds only compositions (pairs of operations) that train.jsonl
never has. The `code` task loads this folder when no path is given. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from tinyrl.tasks.code_world import make_rows, split

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tinyrl" / "assets" / "code-world"


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-per-pair", type=int, default=5)
    p.add_argument("--test-per-pair", type=int, default=2)
    args = p.parse_args()
    train_pairs, test_pairs = split(args.seed)
    rng = random.Random(f"code-world-rows-{args.seed}")
    train = make_rows(train_pairs, args.train_per_pair, rng, "train")
    test = make_rows(test_pairs, args.test_per_pair, rng, "test")
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out / "train.jsonl", train)
    write(args.out / "test.jsonl", test)
    print(f"{len(train_pairs)} train compositions ({len(train)} rows), {len(test_pairs)} held-out ({len(test)} rows) "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
