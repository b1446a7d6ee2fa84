"""Environments and the agent setup: stateless tools, a stateful environment, a TRL-style environment
plugged in unchanged, a raising environment contained; the search tool on the shipped world."""

import pytest

from tinyrl.agents.environments import Environment, build_agent, make_environment, safe_step
from tinyrl.agents.tools import ToolCall, ToolResult
from tinyrl.config.schema_agent import AgentConfig
from tinyrl.errors import ConfigError


class Counter(Environment):
    """A stateful environment: `bump` counts per trajectory, starting from the row's `start`."""

    def __init__(self, toolbox=None):
        self.toolbox = toolbox
        self.count = 0

    def reset(self, row):
        self.count = row.get("start", 0)

    def step(self, calls):
        out = []
        for c in calls:
            if c.name == "bump":
                self.count += 1
                out.append(ToolResult(str(self.count)))
            else:
                out.extend(self.toolbox.call_many([c]))
        return out


class Guess:
    """TRL's environment_factory convention: reset(**row) and public methods as tools."""

    def reset(self, **row):
        self.secret = row["secret"]

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: your guess.
        """
        return "right" if number == self.secret else ("higher" if number < self.secret else "lower")


class Broken(Environment):
    def step(self, calls):
        raise RuntimeError("env bug")


class BadReset(Environment):
    def reset(self, row):
        raise KeyError("secret")

    def step(self, calls):
        return [ToolResult("fine") for _ in calls]


class Miscounts(Environment):
    def step(self, calls):
        return [ToolResult("one")]


def test_search_environment_on_the_shipped_world():
    setup = build_agent(AgentConfig(enabled=True, top_k=2), _task())
    env = setup.make_env({"question": "where was Bales Bavax born?"})
    (res,) = env.step([ToolCall("search", {"query": "Bales Bavax"})])
    assert res.error is None and res.text.startswith('Doc 1(Title: "Bales Bavax") ') and "Doc 3" not in res.text
    obs = setup.format.observation([res])
    assert obs.startswith("\n\n<information>Doc 1") and obs.endswith("</information>\n\n")
    assert setup.format.stop == ["</search>"] and setup.toolbox.names == ["search"]


def test_search_tool_disabled_answers_every_call_with_the_fixed_line():
    setup = build_agent(AgentConfig(enabled=True, tools=[]), _task())
    (res,) = setup.make_env({}).step([ToolCall("search", {"query": "Bales Bavax"})])
    assert (res.text, res.error) == ("Error: unknown tool. Available tools: none.", "unknown_tool")


def test_stateful_environment_one_instance_per_trajectory():
    cfg = AgentConfig(enabled=True, tools=["tests.agents.test_tools:get_weather"],
                      environment="tests.agents.test_environments:Counter")
    make = make_environment(cfg)
    a, b = make({"start": 10}), make({})  # each reset with its row by the factory
    assert [r.text for r in a.step([ToolCall("bump"), ToolCall("bump")])] == ["11", "12"]
    assert b.step([ToolCall("bump")])[0].text == "1"  # its own state
    assert a.step([ToolCall("get_weather", {"city": "Oslo"})])[0].text == "Oslo: 21 degrees celsius"


def test_trl_style_environment_plugs_in_unchanged():
    setup = build_agent(AgentConfig(enabled=True, tools=[], environment="tests.agents.test_environments:Guess",
                                    format="hermes"))
    assert [s["function"]["name"] for s in setup.toolbox.schemas()] == ["guess"]
    row = {"secret": 7, "question": "guess"}
    env = setup.make_env(row)
    assert [r.text for r in env.step([ToolCall("guess", {"number": 3}), ToolCall("guess", {"number": 7})])] == [
        "higher", "right"]
    assert env.step([ToolCall("guess", {"number": "seven"})])[0].error == "bad_arguments"


def _contained(name):
    return make_environment(AgentConfig(enabled=True, tools=[], environment=f"tests.agents.test_environments:{name}"))({})


def test_a_raising_environment_is_contained():
    env = _contained("Broken")
    out = env.step([ToolCall("x"), ToolCall("y")])  # what the factory hands the loop never raises
    assert [(r.text, r.error) for r in out] == [("Error: the tool failed.", "exception")] * 2
    assert "env bug" in out[0].detail
    assert safe_step(env.env, [ToolCall("x")])[0].error == "exception"  # the bare environment, through safe_step
    with pytest.raises(RuntimeError, match="env bug"):
        env.env.step([ToolCall("x")])


def test_a_raising_reset_or_a_miscounting_step_is_contained():
    broken = _contained("BadReset")
    assert [r.error for r in broken.step([ToolCall("x"), ToolCall("y")])] == ["exception", "exception"]
    assert "KeyError" in broken.step([ToolCall("x")])[0].detail
    (res,) = _contained("Miscounts").step([ToolCall("x"), ToolCall("y")])[:1]
    assert res.error == "exception" and "1 results for 2 calls" in res.detail


@pytest.mark.parametrize("overrides,message", [
    ({"agent.format": "xml"}, "agent.format: must be one of ['hermes', 'search_r1']"),
    ({"agent.tools": ["serch"]}, "agent.tools[0]: must be one of ['python', 'search'] or 'module:function'"),
    ({"agent.tools": ["search", "search"]}, "agent.tools: names a tool twice"),
    ({"agent.environment": "NoColon"}, "agent.environment: must be 'package.module:Class' or null"),
    ({"agent.max_turns": 0}, "agent.max_turns: must be >= 1"),
    ({"agent.top_k": 0}, "agent.top_k: must be >= 1"),
    ({"agent.retriever": "sparse"}, "agent.retriever: expected one of 'bm25', 'dense'"),
    ({"agent.retriever": "dense"}, "agent.retriever_model: is required"),
    ({"agent.mask_observations": "no"}, "agent.mask_observations: expected bool"),
])
def test_agent_config_errors_name_the_field(overrides, message):
    from tinyrl.config import load_config

    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


def test_build_errors_are_clear():
    with pytest.raises(FileNotFoundError, match="agent.corpus: file not found"):
        build_agent(AgentConfig(enabled=True, corpus="/no/such/corpus.jsonl"), _task())
    with pytest.raises(ValueError, match="this task has none of its own"):
        build_agent(AgentConfig(enabled=True), None)
    with pytest.raises(ValueError, match="cannot import"):
        make_environment(AgentConfig(enabled=True, tools=[], environment="no.such:Env"))


def _task():
    from tinyrl.tasks import get_task

    return get_task("search_qa")
