"""Method name -> the function that runs it, as "module:function" strings: config validation checks a
name here without importing any method (tinyrl.registry.Registry loads one when a run uses it).

Every runner has one signature, `run(cfg, run_dir) -> tinyrl.runs.Run`, and continues whatever
progress the run folder holds (a fresh folder starts from the beginning).
"""

from tinyrl.registry import Registry

METHODS = Registry("method", {
    "grpo": "tinyrl.methods.grpo:run",
    "sft": "tinyrl.methods.sft:run",
    "rest_em": "tinyrl.methods.selfimprove:run_rest_em",
    "star": "tinyrl.methods.selfimprove:run_star",
})
CHAIN = "tinyrl.methods.chain:run"  # several stages in one run folder, each from the previous one's adapter
