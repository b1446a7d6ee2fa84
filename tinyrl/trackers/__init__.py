"""Experiment trackers: a run's step metrics, config, alarms, sample tables and held-out results, sent to
trackio, Weights & Biases or TensorBoard as well as to the run folder's own JSONL files.

Off unless `log.report_to` names them (nothing here imports a tracker package then). `registry.py`
names the trackers; `base.py` is the interface each implements (one module per tracker);
`fanout.py` opens those a run names, from rank 0 only, sends every call to each, and keeps a
tracker's failure from ever stopping the run: one warning naming the fix, then its errors are
counted; `guard.py` runs each tracker on a thread of its own with time-boxed calls, so a tracker that
hangs cannot stall it either. `tracker.json` in the run folder keeps each tracker's run id, so a resumed run continues the
same tracker run.
"""

from tinyrl.trackers.registry import TRACKERS

__all__ = ["TRACKERS"]
