"""The name tables a run config is checked against, torch-free: checking `algo.estimator: rloo` or
`agent.tools: [search]` imports no torch, no algorithm and no agent code (`import tinyrl.config` loads
neither torch nor tinyrl.agents; tests/test_architecture.py holds it).

Where the entries are "module:attr" strings (tools, call formats) this table is the registry itself,
loaded entry by entry when a run uses one (tinyrl.registry). The algorithm's tables (estimators, loss
aggregations) are dicts of torch functions in tinyrl.algo; their names are listed here, and a test holds
each dict's keys equal to its list.
"""

from tinyrl.registry import Registry

# tinyrl.algo.advantages.ESTIMATORS
ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
TOKEN_REWARD_ESTIMATORS = frozenset({"reinforce_pp"})  # estimators that fold a per-token KL into the rewards
# tinyrl.algo.losses.AGGREGATIONS
AGGREGATIONS = ("token_mean", "seq_mean", "constant")

# agent.tools: a name here, or "module:function" (a builder returning the tool)
TOOLS = Registry("agent.tools", {
    "search": "tinyrl.agents.retrieval:build_search_tool",
    "python": "tinyrl.agents.python_tool:build_python_tool",
})

# agent.format: the call format's class
FORMATS = Registry("agent.format", {
    "search_r1": "tinyrl.agents.formats:SearchR1Format",
    "hermes": "tinyrl.agents.formats:HermesFormat",
})

# data.task -> the check of its data.task_args, run when the config resolves (before any data is read); a task
# without one checks its arguments when it builds its rows
TASK_ARGS = Registry("data.task_args", {
    "code": "tinyrl.tasks.code:check_args",
})
SANDBOX_LIMITS = "tinyrl.rewards.sandbox:check_limits"  # a reward's kwargs that bound its sandbox (cpu_s, ...)
SANDBOX_KWARGS = ("cpu_s", "wall_s", "memory_mb")
