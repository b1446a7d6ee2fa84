"""Multi-turn tool-using agents: tools, environments, call formats, the search world.

The pieces the multi-turn rollout loop (`tinyrl.rollout.agent`) plugs together:

- `tools`: `Toolbox` over plain typed functions (TRL's `tools=` convention), never raising;
  the tools presets name (`search`, `python`) are registered in `tinyrl.names.TOOLS`;
- `retrieval`: BM25 (bm25s) and dense (faiss + sentence-transformers) retrievers over a
  Search-R1-format corpus, and the `search` tool;
- `formats`: `search_r1` tags and `hermes` (Qwen2.5 chat-template) tool calls, one interface;
- `environments`: `Environment` (reset/step), `ToolEnvironment`, `make_environment`;
- `data`, `world`, `prompts`, `probe`: loaders, the offline search world, prompt templates, and a
  reference sampler that measures an agent (EM, pass@k, searches per question).

Importing this package imports none of its modules; import what you use from its module
(`tinyrl.agents.tools`, `tinyrl.agents.environments`, ...). The run config's `agent:` section is
`tinyrl.config.schema_agent.AgentConfig`.
"""
