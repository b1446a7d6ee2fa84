"""Multi-turn tool-using agents: tools, environments, call formats, the search world.

The pieces the multi-turn rollout loop (`tinyrl.rollout.agent`) plugs together:

- `tools`: `Toolbox` over plain typed functions (TRL's `tools=` convention), never raising;
  the `TOOLS` registry (`search`, `python`) for presets;
- `retrieval`: BM25 (bm25s) and dense (faiss + sentence-transformers) retrievers over a
  Search-R1-format corpus, and the `search` tool;
- `formats`: `search_r1` tags and `hermes` (Qwen2.5 chat-template) tool calls, one interface;
- `environments`: `Environment` (reset/step), `ToolEnvironment`, `make_environment`;
- `config`: the run config's `agent:` section;
- `data`, `world`, `prompts`, `probe`: loaders, the offline search world, prompt templates, and a
  reference sampler that measures an agent (EM, pass@k, searches per question).

Importing this package is light: bm25s, faiss and sentence-transformers load when used.
"""

from tinyrl.agents.config import AgentConfig
from tinyrl.agents.environments import (AgentSetup, Environment, ToolEnvironment, build_agent, make_environment,
                                        safe_step)
from tinyrl.agents.formats import FORMATS, CallFormat, HermesFormat, SearchR1Format, make_format
from tinyrl.agents.tools import TOOLS, ToolCall, Toolbox, ToolResult, register_tool

# Built-in tools register themselves on import (their heavy imports are lazy).
from tinyrl.agents import python_tool, retrieval  # noqa: E402,F401

__all__ = ["AgentConfig", "AgentSetup", "CallFormat", "Environment", "FORMATS", "HermesFormat", "SearchR1Format",
           "TOOLS", "ToolCall", "ToolEnvironment", "ToolResult", "Toolbox", "build_agent", "make_environment",
           "make_format", "register_tool", "safe_step"]


def _register_models() -> None:
    """The shipped tiny search-agent model as a built-in model name (beside tiny-arith)."""
    from importlib import resources

    from tinyrl.model import BUILTIN_MODELS, ResolvedModel

    BUILTIN_MODELS.setdefault("tiny-search", lambda: ResolvedModel(str(resources.files("tinyrl.assets") / "tiny-search")))


_register_models()
