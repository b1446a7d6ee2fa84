"""TensorBoard (`log.report_to: [tensorboard]`, `pip install "tinyrl-rlvr[tensorboard]"`): event files
in `<run>/tensorboard/`, through torch's SummaryWriter; `tensorboard --logdir <run>/tensorboard`.

A resume from step k writes with purge_step k + 1, so TensorBoard drops what the interrupted run
logged after its checkpoint (the resumed run logs those steps again).
"""

from __future__ import annotations

import yaml

from tinyrl.trackers.base import Tracker, TrackerContext, require

FLUSH_SECS = 10  # a live run's curves reach TensorBoard within this


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    fix = "check that the run folder is writable"

    def __init__(self, ctx: TrackerContext):
        super().__init__(ctx)
        require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.dir = ctx.run_path / "tensorboard"
        self.first = ctx.start_step + 1 if ctx.start_step else 0  # the first step this process logs
        self.writer = SummaryWriter(str(self.dir), purge_step=self.first or None, flush_secs=FLUSH_SECS)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def log_config(self, config: dict, step: int) -> None:
        # not before the purge step: an earlier step would read as a restart and drop the curves before it
        text = "    " + yaml.safe_dump(config, sort_keys=False).replace("\n", "\n    ")  # markdown: verbatim
        self.writer.add_text("config", text, max(step, self.first))

    def log_event(self, name: str, text: str, step: int, level: str = "warn") -> None:
        self.writer.add_text(f"alarms/{name}", f"**{level}** at step {step}: {text}", step)
        self.writer.flush()

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        esc = lambda v: "" if v is None else str(v).replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in rows]
        self.writer.add_text(name, "\n".join(lines), step)

    def finish(self) -> None:
        self.writer.close()

    def state(self) -> dict:
        return {"dir": str(self.dir), "command": f"tensorboard --logdir {self.dir}"}
