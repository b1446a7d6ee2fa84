"""Advantage estimators and policy losses of the GRPO family: pure math on tensors.

Import what you use from its module (`tinyrl.algo.advantages`, `.losses`, `.movement`, `.shaping`,
`.recipes`): this package imports none of them, so the config can read `tinyrl.algo.recipes` (plain data)
without loading torch. The names a config may give are listed in tinyrl.names.
"""
