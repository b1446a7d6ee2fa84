"""Multi-turn tool rollouts: generate, call a tool, splice its observation in, generate again.

`AgentEngine` wraps any engine with `sample(contexts, params, n, greedy, max_new)` (HF, vLLM)
and is itself a `RolloutEngine`: the trainer cannot tell its batches from single-turn ones.
Each trajectory is one `Rollouts` row whose completion is every token after the prompt:

    [model turn 1] [observation 1] [model turn 2] [observation 2] ... [final turn]

- Exact ids: the model's tokens are the sampled ids, the observations are the tokenised
  observation text; nothing is ever re-tokenised from the joined text (that changes ids at the
  seams and breaks the policy ratio). `observation_mask` marks the observation tokens: they
  carry logprob 0 and are left out of the loss (unless `agent.mask_observations` is off: the
  ablation), of every token statistic and of length shaping.
- Turns: a model turn ends at a tool-call end tag (`fmt.stop`), a final-answer end tag
  (`fmt.final`), EOS or the budget. After a tool call the environment runs it and the
  observation (cut to `agent.max_obs_tokens`) is appended; at most `agent.max_turns` tool
  calls, then a trajectory that still calls a tool ends there (`hit_max_turns`). The whole
  trajectory stays within `rollout.max_new_tokens`; running out of it is truncation.
- Turn-synchronous (default): every live trajectory's next turn is one `sample` call, however many
  there are; tool calls of a turn run concurrently (a slow tool does not serialise the batch), and
  the next turn waits for all of them.
- Streaming (`agent.streaming`): trajectories advance independently through one decode session
  (tinyrl.rollout.episodes): a trajectory whose tool returned joins the running decode batch at the
  next decode step while others decode or wait on their tools. The same ids, observation masks and
  logprobs under greedy decoding; sampled turns after the first draw from the session's generator.
- Failures never crash: the environment turns a tool that raises, hangs or is unknown into a
  fixed observation with an error kind, counted in `trajectories[i]["tool_errors"]`.

The call format (`fmt`: stop, final, parse, observation) and the environments (one per
trajectory: `env_factory(row)` returns one already reset with `row`; the loop calls its
`step(calls)`) come from `tinyrl.agents`; `AgentEngine.from_config` builds them from a run's
`agent:` section and task (`tinyrl.rollout.make_engine` does when `agent.enabled`).
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from tinyrl.agents.demonstrations import Call, step_text
from tinyrl.agents.environments import build_agent
from tinyrl.agents.prompts import render_agent_prompt
from tinyrl.agents.tools import ToolResult
from tinyrl.rollout.base import Rollouts, SamplingParams, pack_rollouts
from tinyrl.rollout.engine import Episodes
from tinyrl.rollout.episodes import EpisodeRunner, Trajectory


class AgentEngine:
    """A RolloutEngine that runs multi-turn tool episodes on top of a sampling engine."""

    def __init__(self, inner, tokenizer, fmt, env_factory, agent_cfg, workers: int | None = None, toolbox=None):
        self.inner, self.tokenizer, self.fmt, self.env_factory, self.cfg = inner, tokenizer, fmt, env_factory, agent_cfg
        self.workers = workers or getattr(agent_cfg, "tool_workers", 8)
        self.toolbox = toolbox  # the tools the prompt describes (None: the format's own instructions only)

    @classmethod
    def from_config(cls, inner, tokenizer, agent_cfg, task=None) -> "AgentEngine":
        """The run's agent: call format, tools and environments from its `agent:` section; the
        task supplies defaults such as the corpus the `search` tool reads."""
        setup = build_agent(agent_cfg, task)
        return cls(inner, tokenizer, setup.format, setup.make_env, agent_cfg, toolbox=setup.toolbox)

    def render(self, prompt: str, cfg_data) -> str:
        """A user prompt rendered for this agent: chat template with the format's system prompt
        (and, for templates that render tools, the tool schemas); `tinyrl.data.render_prompt` otherwise."""
        return render_agent_prompt(self.tokenizer, prompt, self.fmt, self.toolbox, cfg_data)

    # ------------------------------------------------------------------ RolloutEngine

    def generate(self, prompts: list[str], n: int, params: SamplingParams,
                 columns: list[dict] | None = None, greedy: bool = False) -> Rollouts:
        tok = self.tokenizer
        cols = columns if columns is not None else [{} for _ in prompts]
        prompt_ids = tok(list(prompts), add_special_tokens=False)["input_ids"]
        trajs = [self.start(prompt_ids[i], cols[i]) for i in range(len(prompts)) for _ in range(n)]
        turn_params = self.turn_params(params)
        budget = params.max_new_tokens
        if getattr(self.cfg, "streaming", False):
            groups = [trajs[i * n:(i + 1) * n] for i in range(len(prompts))]
            streams = [None if params.stream is None else params.stream + i for i in range(len(prompts))]
            with self.inner.session(turn_params, greedy) as session:
                EpisodeRunner(self, budget, self.workers).run(session, groups, streams)
        else:
            self._turn_synchronous(trajs, n, turn_params, budget, greedy)
        batch = self.pack(trajs, [i // n for i in range(len(trajs))], [prompts[i // n] for i in range(len(trajs))])
        batch.versions = None  # one call, one adapter: every token is the current policy's
        return batch

    def sample(self, contexts, params: SamplingParams, n: int = 1, greedy: bool = False, max_new=None):
        """Plain continuations, no tools: the inner engine's (what a turn of an episode is drawn with)."""
        return self.inner.sample(contexts, params, n=n, greedy=greedy, max_new=max_new)

    def session(self, params: SamplingParams, greedy: bool = False):
        """The inner engine's decode session: the turns of episodes are decoded there (see `episodes`)."""
        return self.inner.session(params, greedy)

    def episodes(self, params: SamplingParams) -> Episodes:
        """Tool episodes: this agent's turn rules, turns decoded by the inner engine, stopping at the tags."""
        return Episodes(self, self.inner, self.turn_params(params))

    def bound_to(self, model) -> "AgentEngine":
        """The same agent (format, tools, environments) over the inner engine bound to `model`."""
        out = copy.copy(self)
        out.inner = self.inner.bound_to(model)
        return out

    def turn_params(self, params: SamplingParams) -> SamplingParams:
        """A model turn's sampling: it also stops at the format's tool-call and answer end tags."""
        return replace(params, stop=list(dict.fromkeys([*self.fmt.stop, *self.fmt.final, *params.stop])))

    def _turn_synchronous(self, trajs: list[Trajectory], n: int, turn_params: SamplingParams, budget: int,
                          greedy: bool) -> None:
        # the first turn shares each prompt's prefill over its n samples
        first = self.inner.sample([t.prompt_ids for t in trajs[::n]], turn_params, n=n, greedy=greedy)
        self._advance(trajs, [s for group in first for s in group], budget)
        while any(not t.done for t in trajs):
            live = [t for t in trajs if not t.done]
            # later turns: contexts are live trajectories, not prompts; no prompt stream (per-call seeds)
            out = self.inner.sample([t.prompt_ids + t.ids for t in live], replace(turn_params, stream=None), n=1,
                                    greedy=greedy,
                                    max_new=[budget - len(t.ids) for t in live])
            self._advance(live, [g[0] for g in out], budget)

    def pack(self, trajs: list[Trajectory], group: list[int], prompts: list[str]) -> Rollouts:
        """Trajectories -> one Rollouts batch (observation tokens marked; each token's policy version)."""
        batch = pack_rollouts(self.tokenizer, [t.prompt_ids for t in trajs], [t.ids for t in trajs],
                              [t.logprobs for t in trajs], [t.truncated for t in trajs], group, prompts,
                              [t.row for t in trajs], observation=[t.obs for t in trajs],
                              trajectories=[t.info() for t in trajs], versions=[t.versions for t in trajs])
        if not self.cfg.mask_observations:  # the ablation: observation tokens trained on as if sampled
            batch.loss_mask = batch.completion_mask.clone()
        return batch

    def release(self) -> None:
        self.inner.release()

    def sync(self, model) -> None:
        self.inner.sync(model)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def replay(self, prompt_ids: list[int], row: dict, steps: list, budget: int) -> tuple[list[int], list[int]] | None:
        """An expert episode (`tinyrl.agents.demonstrations`) through this engine's tools and turn logic:
        (completion ids, observation mask: 1 on observation tokens), or None when it does not fit in
        `budget` tokens (a rollout could never produce it). Each step is tokenised alone, as a sampled
        turn would stand; the tool really runs; the answer step ends with EOS."""
        t = self.start(prompt_ids, row)
        eos = self.tokenizer.eos_token_id
        for step in steps:
            text = step_text(self.fmt, step)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            t.add(ids if isinstance(step, Call) or eos is None else ids + [eos], None, observation=False)
            t.turns += 1
            entry = {"role": "assistant", "text": text}
            if isinstance(step, Call):
                calls, results = self._call_tools(t, text)
                self._observe(t, entry, calls, results, budget)
        return None if len(t.ids) > budget else (t.ids, t.obs)

    # ------------------------------------------------------------------ turns

    def start(self, prompt_ids: list[int], row: dict) -> Trajectory:
        return Trajectory(list(prompt_ids), row, self.env_factory(row))  # the factory resets it with row

    def _advance(self, trajs: list[Trajectory], samples, budget: int) -> None:
        """Turn-synchronous: append each trajectory's new turn; run the tool calls of those that made one."""
        calling = []
        for t, s in zip(trajs, samples):
            t.add(s.token_ids, s.logprobs, observation=False)
            job = self.end_turn(t, s.finish, budget)
            if job is not None:
                calling.append((t, job))
        if not calling:
            return
        with ThreadPoolExecutor(max_workers=min(self.workers, len(calling))) as pool:
            results = list(pool.map(lambda c: self.run_tool(*c), calling))
        for (t, job), res in zip(calling, results):
            self.observe(t, job, res, budget)

    # ------------------------------------------------------------------ TurnRules (tinyrl.rollout.episodes)

    def end_turn(self, t: Trajectory, finish: str, budget: int):
        """The turn's tokens (t.ids[t.turn_start:]) are in t: mark t done, or return (log entry, turn text)
        for a tool call to run."""
        t.turns += 1
        text = self.tokenizer.decode(t.ids[t.turn_start:], skip_special_tokens=True)
        entry = {"role": "assistant", "text": text}
        t.log.append(entry)
        # generation stops at the first stop string, so a tool tag in the text is the one that ended it
        made_call = finish == "stop" and any(x in text for x in self.fmt.stop)
        if not made_call:
            t.done, t.truncated = True, finish == "length" or len(t.ids) >= budget
        elif t.tool_calls >= self.cfg.max_turns:
            t.done, t.hit_max_turns = True, True
        elif len(t.ids) >= budget:
            t.done, t.truncated = True, True
        else:
            return entry, text
        return None

    def run_tool(self, t: Trajectory, job):
        return self._call_tools(t, job[1])

    def observe(self, t: Trajectory, job, result, budget: int) -> None:
        calls, res = result
        self._observe(t, job[0], calls, res, budget)
        t.turn_start = len(t.ids)  # the next model turn starts after the observation

    def _call_tools(self, t: Trajectory, text: str):
        calls = self.fmt.parse(text)
        if not calls:
            return [], [ToolResult("could not read a tool call in that turn", "parse_error")]
        return calls, t.env.step(calls)

    def _observation_ids(self, results) -> list[int]:
        """The observation's tokens, at most `agent.max_obs_tokens`: the tool texts are shortened so the
        format's wrapper (e.g. the closing `</information>`) survives; a hard cut only as a last resort.
        (Observation text is tokenised here for the first time: it was never sampled.)"""
        limit = self.cfg.max_obs_tokens
        for _ in range(6):
            ids = self.tokenizer(self.fmt.observation(results, self.tokenizer), add_special_tokens=False)["input_ids"]
            if len(ids) <= limit:
                return ids
            keep = limit / len(ids) * 0.9
            results = [replace(r, text=r.text[: int(len(r.text) * keep)]) for r in results]
        return ids[:limit]

    def _observe(self, t: Trajectory, entry: dict, calls, results, budget: int) -> None:
        t.tool_calls += max(len(calls), 1)
        t.tool_errors += sum(r.error is not None for r in results)
        entry["calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
        ids = self._observation_ids(results)[: max(budget - len(t.ids), 0)]
        t.add(ids, None, observation=True)
        t.log.append({"role": "tool", "text": self.tokenizer.decode(ids, skip_special_tokens=True),
                      "errors": [r.error for r in results if r.error is not None]})
        if len(t.ids) >= budget:
            t.done, t.truncated = True, True
