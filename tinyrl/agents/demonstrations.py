"""Expert demonstrations for an agent's SFT cold start: scripted steps replayed through the real tools.

A small instruct model that never writes the call format gets no reward, so GRPO has nothing
to select from: SmolLM2-135M-Instruct on `smollm2-135m_search_cpu` wrote no `<search>` or
`<answer>` tag in any of its 160 samples over 5 steps, and every group's reward was 0. The cure
the field uses is a short supervised cold start on a few expert trajectories (DeepSeek-R1's
cold-start data; ReSearch and R1-Searcher warm-start weak models the same way) before RL.

A task's `demonstrate(row)` returns the expert's steps, `Call(name, arguments)`s then one
`Answer(text)`, or None for a row it cannot demonstrate. `AgentEngine.replay` turns them into
a trajectory exactly as a rollout would build it: each step written in the run's call format
(`CallFormat.call_text` / `answer_text`) and tokenised on its own, the tool really called
through the run's environment, and its observation the engine's own observation tokens (cut
to `agent.max_obs_tokens`), marked so that SFT does not learn them (`tinyrl.methods.sft_data.tokenize`).

    sft:
      data: demonstrations     # the task's expert steps, replayed through the agent's tools
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEMONSTRATIONS = "demonstrations"  # the `sft.data` value that asks for them


@dataclass(frozen=True)
class Call:
    """A tool call the expert makes: `name(**arguments)`."""

    name: str
    arguments: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """The expert's final answer (ends the episode)."""

    text: str


def step_text(fmt, step: Call | Answer) -> str:
    """How the run's call format writes one step.

    >>> from tinyrl.agents.formats import SearchR1Format
    >>> [step_text(SearchR1Format(), s) for s in (Call("search", {"query": "Brenna Tillen"}), Answer("Kelmora"))]
    ['<search> Brenna Tillen </search>', '<answer> Kelmora </answer>']
    """
    if isinstance(step, Call):
        return fmt.call_text(step.name, step.arguments)
    return fmt.answer_text(step.text)
