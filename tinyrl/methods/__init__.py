"""Training methods, one module each, set up by the same shared pieces (tinyrl/methods/common.py):

    grpo.py         GRPO and its family (the trainer, tinyrl/trainer.py)
    sft.py          LoRA / QLoRA SFT through TRL's SFTTrainer (rows and TRL glue: sft_data.py, sft_trl.py)
    selfimprove.py  ReST-EM and STaR
    chain.py        several methods in order in one run folder (`stages: [sft, grpo]`)

`tinyrl.methods.runner.run_method(resolved)` opens the run folder once (common.open_run) and hands
it to the method's runner (registry.py); every runner writes the same summary.json schema. This
package's __init__ imports nothing: config validation reads registry.py without loading a method.
"""
