"""One process of a scale-out test run (tests/test_distributed.py), started by `accelerate launch` or
run alone: trains a preset with overrides through the public API, then writes what this rank holds.

    python tests/dist_worker.py OUT_DIR [--resume RUN_DIR] [section.field=value ...]

TINYRL_TEST_OOM_RANK=r: rank r's first policy-loss call raises an out-of-memory error.
OUT_DIR/pid<r>: this rank's process id, written first. OUT_DIR/rank<r>.pt: {"world": processes, "adapter": this rank's trainable tensors (after training),
"trained_rows": rows each policy_update call trained on (per call, this rank), "groups": the groups of this rank's
batch each step}.
"""

import os
import sys
from pathlib import Path

import torch


def main(argv: list[str]) -> None:
    out, args = Path(argv[0]), argv[1:]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pid{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))  # for the kill -9 test
    resume = None
    if args and args[0] == "--resume":
        resume, args = args[1], args[2:]
    from tinyrl import api, distributed
    from tinyrl import trainer as trainer_mod
    from tinyrl.config import parse_override

    kv = {".".join(k): v for k, v in map(parse_override, args)}
    calls: list[int] = []
    real_update = trainer_mod.policy_update

    def counting_update(*a, **k):  # records this rank's share of the work (a rank may train on 0 rows)
        result = real_update(*a, **k)
        calls.append(int(result.rows.numel()))
        return result

    trainer_mod.policy_update = counting_update
    groups: list[int] = []
    real_collect = trainer_mod.Trainer.collect_batch

    def counting_collect(self):  # this rank's groups each step (whole groups, as many on every rank)
        batch, stats = real_collect(self)
        groups.append(int(batch.group.max()) + 1 if batch.num_rows else 0)
        return batch, stats

    trainer_mod.Trainer.collect_batch = counting_collect
    if os.environ.get("TINYRL_TEST_OOM_RANK") == os.environ.get("RANK", "0"):  # one injected OOM on this rank
        from tinyrl import update

        real_loss, fired = update.kernels.fused_linear_grpo_loss, []

        def oom_once(*a, **k):
            if not fired:
                fired.append(1)
                raise torch.OutOfMemoryError("injected by tests/dist_worker.py")
            return real_loss(*a, **k)

        update.kernels.fused_linear_grpo_loss = oom_once
    t = api.build_trainer(resume=resume, overrides=kv)
    try:
        t.train()
    finally:
        t.run.unlock()
    d = distributed.setup()
    adapter = {n: p.detach().cpu().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"world": d.world, "adapter": adapter, "trained_rows": calls, "groups": groups, "run": str(t.run.path)},
               out / f"rank{d.rank}.pt")
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
