"""Tool-call formats: how a model writes a call, and how the observation is written back.

Two formats behind one interface (`CallFormat`), registered by name in `tinyrl.names.FORMATS`:

- `search_r1`: Search-R1's tags. The model writes `<search> query </search>` (generation
  stops at `</search>`), the environment answers with
  `\\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n`, and the episode ends with
  `<answer> ... </answer>`. Any other tool `t` with one argument is called as `<t> ... </t>`.
- `hermes`: the chat-template tool calls of Qwen2.5 / Hermes models,
  `<tool_call>\\n{"name": "search", "arguments": {"query": "..."}}\\n</tool_call>`. The
  observation is the chat template's own tool turn, rendered by the tokenizer's template when
  it renders tool messages (Qwen2.5: `<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...\\n
  </tool_response><|im_end|>\\n<|im_start|>assistant\\n`), else the same text by hand.

`parse(text)` reads the turn just generated: the calls in it, or None when the turn made no
call (it ended with a final answer, EOS or the budget). A call the parser cannot read is still
returned, with `ToolCall.error` set, so the environment answers with the fixed parse-error
observation and the loop counts it.
"""

from __future__ import annotations

import json
import re
from typing import Protocol, runtime_checkable

from tinyrl.agents.tools import ToolCall, ToolResult
from tinyrl.names import FORMATS

SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>."
)  # Search-R1's "base" template (scripts/data_process/nq_search.py), verbatim: its models expect it

ANSWER_INSTRUCTION = (
    "Answer the given question. Use the tools to look up what you do not know. When you have the answer, "
    "write it inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>."
)


@runtime_checkable
class CallFormat(Protocol):
    name: str
    stop: list[str]  # strings that end a tool-call turn
    final: list[str]  # strings that end the episode

    def parse(self, text: str) -> list[ToolCall] | None: ...

    def observation(self, results: list[ToolResult], tokenizer=None) -> str: ...

    def instructions(self, toolbox, tokenizer=None) -> str | None: ...

    def call_text(self, name: str, arguments: dict) -> str: ...  # how the model writes a call (demonstrations)

    def answer_text(self, answer: str) -> str: ...  # how it writes the final answer


def answer_tags(answer: str) -> str:
    """The final answer as both formats write it: `<answer> ... </answer>`."""
    return f"<answer> {answer} </answer>"


def _first_marker(text: str, markers: list[str]) -> tuple[int, str | None]:
    """(position, marker) of the earliest marker in text; (len(text), None) when none occurs."""
    best, which = len(text), None
    for m in markers:
        i = text.find(m)
        if i != -1 and (i < best or (i == best and which is not None and len(m) > len(which))):
            best, which = i, m
    return best, which


class SearchR1Format:
    """`<search> q </search>` calls, `<information>` observations, `<answer>` to finish.

    >>> f = SearchR1Format()
    >>> f.parse("I need it. <search> Brenna Tillen </search>")
    [ToolCall(name='search', arguments={'query': 'Brenna Tillen'}, raw='<search> Brenna Tillen </search>', error=None)]
    >>> f.parse("<answer> Kelmora </answer>") is None, f.parse("no tags at all") is None
    (True, True)
    >>> f.observation([ToolResult("Doc 1(Title: X) x")])
    '\\n\\n<information>Doc 1(Title: X) x</information>\\n\\n'
    """

    name = "search_r1"

    def __init__(self, tool_names: list[str] | None = None, arguments: dict[str, str] | None = None):
        # "search" always parses: with the tool disabled (agent.tools=[]) a <search> call is an unknown tool
        self.tags = ["search"] + [t for t in (tool_names or []) if t != "search"]
        self.arguments = {"search": "query", **(arguments or {})}  # tag -> the one argument's name
        self.stop = [f"</{t}>" for t in self.tags]
        self.final = ["</answer>"]

    def parse(self, text: str) -> list[ToolCall] | None:
        pos, marker = _first_marker(text, self.stop + self.final)
        if marker is None or marker in self.final:
            return None
        tag = marker[2:-1]
        head = text[:pos]
        start = head.rfind(f"<{tag}>")
        raw = text[start if start != -1 else max(0, pos - 200): pos + len(marker)]
        if start == -1:
            return [ToolCall(tag, {}, raw, error=f"</{tag}> without <{tag}>")]
        content = head[start + len(tag) + 2:].strip()
        if not content:
            return [ToolCall(tag, {}, raw, error=f"empty <{tag}>")]
        return [ToolCall(tag, {self.arguments.get(tag, "query"): content}, raw)]

    def observation(self, results: list[ToolResult], tokenizer=None) -> str:
        body = "\n".join(r.text.strip() for r in results)
        return f"\n\n<information>{body}</information>\n\n"

    def instructions(self, toolbox, tokenizer=None) -> str | None:
        """Search-R1 puts its instruction in the user turn (the task's `search_r1` template does)."""
        return None

    def call_text(self, name: str, arguments: dict) -> str:
        """`<name> value </name>` (the tools this format calls take one argument).

        >>> SearchR1Format().call_text("search", {"query": "Brenna Tillen"})
        '<search> Brenna Tillen </search>'
        """
        (value,) = arguments.values()
        return f"<{name}> {value} </{name}>"

    answer_text = staticmethod(answer_tags)


class HermesFormat:
    """Qwen2.5 / Hermes `<tool_call>` JSON calls and `<tool_response>` observations.

    >>> f = HermesFormat()
    >>> f.parse('<tool_call>\\n{"name": "search", "arguments": {"query": "Kelmora"}}\\n</tool_call>')[0].arguments
    {'query': 'Kelmora'}
    >>> f.parse('<tool_call>\\n{"name": "search", "arguments": {"query": </tool_call>')[0].error
    'invalid JSON in <tool_call>'
    >>> f.observation([ToolResult("r1")])  # no tokenizer: the Qwen2.5 text by hand, without special tokens
    '\\n<tool_response>\\nr1\\n</tool_response>\\n'
    """

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, tool_names: list[str] | None = None, arguments: dict | None = None):
        self.stop = [self.CLOSE]
        self.final = ["</answer>"]
        self._suffix_cache: dict[int, tuple[str, str] | None] = {}

    def parse(self, text: str) -> list[ToolCall] | None:
        pos, marker = _first_marker(text, [self.OPEN] + self.final)
        if marker is None or marker in self.final:
            if self.CLOSE in text and marker is None:
                return [ToolCall("", {}, text[-200:], error=f"{self.CLOSE} without {self.OPEN}")]
            return None
        calls = []
        for m in re.finditer(re.escape(self.OPEN) + r"(.*?)(?:" + re.escape(self.CLOSE) + r"|$)", text[pos:], re.DOTALL):
            raw = m.group(0)
            if not raw.endswith(self.CLOSE):
                break  # an unfinished call at the end of the turn (budget): not a call
            calls.append(self._read(m.group(1), raw))
        return calls or None

    @staticmethod
    def _read(body: str, raw: str) -> ToolCall:
        try:
            obj = json.loads(body.strip())
        except ValueError:
            return ToolCall("", {}, raw, error="invalid JSON in <tool_call>")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ToolCall("", {}, raw, error="<tool_call> needs {\"name\": ..., \"arguments\": {...}}")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return ToolCall(obj["name"], {}, raw, error="arguments are not a JSON object")
        return ToolCall(obj["name"], args if args is not None else {}, raw)

    def observation(self, results: list[ToolResult], tokenizer=None) -> str:
        """The text after the model's `</tool_call>` up to the next assistant turn's start."""
        affixes = self._template_affixes(tokenizer)
        if affixes is not None:
            return self._render(results, tokenizer)
        if tokenizer is not None and "<|im_start|>" in tokenizer.get_vocab():
            body = "".join(f"\n<tool_response>\n{r.text}\n</tool_response>" for r in results)
            return f"<|im_end|>\n<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n"
        return "".join(f"\n<tool_response>\n{r.text}\n</tool_response>" for r in results) + "\n"

    def instructions(self, toolbox, tokenizer=None) -> str | None:
        """The system prompt. With a tokenizer whose chat template renders tools, the template
        writes the tool schemas itself (pass `tools=toolbox.schemas()`); otherwise they are here."""
        if self._template_affixes(tokenizer) is not None:
            return ANSWER_INSTRUCTION
        tools = "\n".join(json.dumps(s, ensure_ascii=False) for s in toolbox.schemas())
        return (f"{ANSWER_INSTRUCTION}\n\n# Tools\n\nYou may call one or more functions to assist with the user "
                f"query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
                f"{tools}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                f"within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
                f"<args-json-object>}}\n</tool_call>")  # Qwen2.5's tools block, as its chat template writes it

    def call_text(self, name: str, arguments: dict) -> str:
        """The `<tool_call>` JSON block Qwen2.5's chat template writes for a call.

        >>> print(HermesFormat().call_text("search", {"query": "Kelmora"}))
        <tool_call>
        {"name": "search", "arguments": {"query": "Kelmora"}}
        </tool_call>
        """
        return f"{self.OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{self.CLOSE}"

    answer_text = staticmethod(answer_tags)

    # -- the chat template's tool turn

    _DUMMY = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}]}]

    def _template_affixes(self, tokenizer):
        """(rendered conversation up to the call's `</tool_call>`, marker) when the tokenizer's chat
        template renders tool calls and tool messages; None otherwise (cached per tokenizer)."""
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            return None
        key = id(tokenizer)
        if key not in self._suffix_cache:
            self._suffix_cache[key] = None
            try:
                prefix = tokenizer.apply_chat_template(self._DUMMY, tokenize=False)
                probe = tokenizer.apply_chat_template(
                    self._DUMMY + [{"role": "tool", "name": "search", "content": "SENTINEL_7f3a"}],
                    tokenize=False, add_generation_prompt=True)
                cut = prefix.rfind(self.CLOSE)
                if cut != -1 and "SENTINEL_7f3a" in probe and probe.startswith(prefix[:cut + len(self.CLOSE)]):
                    self._suffix_cache[key] = (prefix[:cut + len(self.CLOSE)], self.CLOSE)
            except Exception:  # a template that cannot render tools
                pass
        return self._suffix_cache[key]

    def _render(self, results: list[ToolResult], tokenizer) -> str:
        head, _ = self._template_affixes(tokenizer)
        tool_msgs = [{"role": "tool", "name": "tool", "content": r.text} for r in results]
        full = tokenizer.apply_chat_template(self._DUMMY + tool_msgs, tokenize=False, add_generation_prompt=True)
        return full[len(head):]




def make_format(name: str, toolbox=None) -> CallFormat:
    """The call format `name` for a run with `toolbox` (its tool names and argument names)."""
    if name not in FORMATS:
        raise ValueError(f"agent.format: must be one of {sorted(FORMATS)}, got {name!r}")
    names = toolbox.names if toolbox is not None else []
    first_arg = {}
    for schema in (toolbox.schemas() if toolbox is not None else []):
        props = list(schema["function"].get("parameters", {}).get("properties", {}))
        if props:
            first_arg[schema["function"]["name"]] = props[0]
    return FORMATS[name](names, first_arg)
