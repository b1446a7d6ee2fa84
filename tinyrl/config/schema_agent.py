"""The run config's `agent:` section: multi-turn tool rollouts (off unless `enabled`).

The format and tool names are checked against their registries by
`tinyrl.config.resolve.check_names` (this module imports no agent code)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from tinyrl.config.coerce import check


@dataclass
class AgentConfig:
    LIMITS = {"max_turns": (1, 256), "max_obs_tokens": (1, 131072), "top_k": (1, 1000), "tool_workers": (1, 1024),
              "tool_timeout": (0, 86400)}

    enabled: bool = False  # multi-turn tool rollouts
    format: str = "search_r1"  # a name in tinyrl.agents.formats.FORMATS: "search_r1" | "hermes"
    tools: list[str] = field(default_factory=lambda: ["search"])  # TOOLS names or "module:function"
    environment: Optional[str] = None  # "module:Class": a stateful Environment (or TRL-style env class)
    max_turns: int = 4  # model turns per trajectory (a turn ends at a tool call, the answer, EOS or the budget)
    max_obs_tokens: int = 256  # each observation is cut to this many tokens
    mask_observations: bool = True  # False only for the ablation: observation tokens are trained on
    tool_timeout: float = 10.0  # seconds per tool call
    retriever: Literal["bm25", "dense"] = "bm25"
    corpus: Optional[str] = None  # Search-R1-format corpus jsonl (or a bm25s index dir); None = the task's own
    top_k: int = 3  # passages per search
    retriever_model: Optional[str] = None  # dense: a sentence-transformers model dir or hub id (e5-base-v2)
    index: Optional[str] = None  # dense: a prebuilt faiss index of the corpus; bm25: a saved bm25s index dir
    # streaming: a trajectory whose tool returned joins the running decode batch at the next decode step
    # (tinyrl.rollout.episodes); off: turn-synchronous, every turn waits for every tool call of the turn
    streaming: bool = False
    tool_workers: int = 8  # tool calls running at once (turn-synchronous and streaming)

    def validate(self, p: str) -> None:
        check(len(set(self.tools)) == len(self.tools), f"{p}.tools", f"names a tool twice: {self.tools}")
        env = self.environment
        check(env is None or (":" in env and all(env.split(":", 1))), f"{p}.environment",
               f"must be 'package.module:Class' or null, got {env!r}")
        check(self.max_turns >= 1, f"{p}.max_turns", f"must be >= 1, got {self.max_turns}")
        check(self.max_obs_tokens >= 1, f"{p}.max_obs_tokens", f"must be >= 1, got {self.max_obs_tokens}")
        check(self.tool_timeout > 0, f"{p}.tool_timeout", f"must be > 0, got {self.tool_timeout}")
        check(self.top_k >= 1, f"{p}.top_k", f"must be >= 1, got {self.top_k}")
        check(self.tool_workers >= 1, f"{p}.tool_workers", f"must be >= 1, got {self.tool_workers}")
        check(self.retriever != "dense" or self.retriever_model is not None, f"{p}.retriever_model",
               "is required when agent.retriever is 'dense' (a sentence-transformers model, e.g. intfloat/e5-base-v2)")
