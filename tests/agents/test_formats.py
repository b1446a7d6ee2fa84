"""Both call formats: well-formed and malformed calls, observations, instructions, chat-template tool turns."""

import json

import pytest

from tinyrl.agents.formats import HermesFormat, SearchR1Format, make_format
from tinyrl.agents.tools import Toolbox, ToolCall, ToolResult


def python(code: str) -> str:
    """Run code.

    Args:
        code: the program.
    """
    return ""


def search(query: str) -> str:
    """Search.

    Args:
        query: the query.
    """
    return ""


# --------------------------------------------------------------------------- search_r1

SR1 = [
    ("<search> Bales Bavax </search>", [ToolCall("search", {"query": "Bales Bavax"}, "<search> Bales Bavax </search>")]),
    ("let me look. <search>a b</search>", [ToolCall("search", {"query": "a b"}, "<search>a b</search>")]),
    ("<think>hmm</think>\n<search>\nq\n</search>", [ToolCall("search", {"query": "q"}, "<search>\nq\n</search>")]),
    ("<answer> Kelmora </answer>", None),
    ("<answer> x </answer> <search> y </search>", None),  # the answer came first: the episode is over
    ("I think it is Kelmora", None),  # EOS / budget: no call
    ("<search> unfinished", None),
]


@pytest.mark.parametrize("text,calls", SR1)
def test_search_r1_parses_well_formed_turns(text, calls):
    assert SearchR1Format().parse(text) == calls


@pytest.mark.parametrize("text,error", [
    ("<search>   </search>", "empty <search>"),
    ("no opening tag </search>", "</search> without <search>"),
])
def test_search_r1_malformed_calls_are_parse_errors(text, error):
    (call,) = SearchR1Format().parse(text)
    assert call.error == error
    assert Toolbox([search]).call(call).error == "parse_error"


def test_search_r1_stops_and_other_tools():
    fmt = make_format("search_r1", Toolbox([search, python]))
    assert fmt.stop == ["</search>", "</python>"] and fmt.final == ["</answer>"]
    assert fmt.parse("<python>print(1)</python>") == [ToolCall("python", {"code": "print(1)"}, "<python>print(1)</python>")]
    # with no tools at all, <search> still ends a turn: the call then reaches no tool (the ablation)
    bare = make_format("search_r1", Toolbox([]))
    assert bare.stop == ["</search>"] and bare.parse("<search> q </search>")[0].name == "search"


def test_search_r1_observation_is_search_r1s_information_block():
    obs = SearchR1Format().observation([ToolResult("Doc 1(Title: \"A\") a\n"), ToolResult("Error: the tool failed.")])
    assert obs == "\n\n<information>Doc 1(Title: \"A\") a\nError: the tool failed.</information>\n\n"
    assert SearchR1Format().instructions(Toolbox([search])) is None  # the task's template carries it


# --------------------------------------------------------------------------- hermes


def _call(name, args):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_hermes_parses_qwen_tool_calls():
    fmt = HermesFormat()
    text = "I will search.\n" + _call("search", {"query": "Bales Bavax"})
    assert fmt.parse(text) == [ToolCall("search", {"query": "Bales Bavax"}, _call("search", {"query": "Bales Bavax"}))]
    two = _call("search", {"query": "a"}) + "\n" + _call("python", {"code": "1"})
    assert [c.name for c in fmt.parse(two)] == ["search", "python"]  # parallel calls when no stop cut them
    stringy = '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}\n</tool_call>'
    assert fmt.parse(stringy)[0].arguments == {"query": "x"}
    assert fmt.parse("<answer> Kelmora </answer>") is None
    assert fmt.parse("plain answer") is None
    assert fmt.parse("<tool_call>\n{\"name\": \"search\", \"arg") is None  # cut by the budget: no call
    assert fmt.stop == ["</tool_call>"]


@pytest.mark.parametrize("body,error", [
    ('{"name": "search", "arguments": {"query": }', "invalid JSON in <tool_call>"),
    ('["search"]', '<tool_call> needs {"name": ..., "arguments": {...}}'),
    ('{"arguments": {}}', '<tool_call> needs {"name": ..., "arguments": {...}}'),
    ('{"name": "search", "arguments": "not json"}', "arguments are not a JSON object"),
])
def test_hermes_malformed_calls_are_parse_errors(body, error):
    (call,) = HermesFormat().parse(f"<tool_call>\n{body}\n</tool_call>")
    assert call.error == error
    assert Toolbox([search]).call(call).error == "parse_error"


def test_hermes_close_without_open_is_a_parse_error():
    (call,) = HermesFormat().parse('{"name": "search"}</tool_call>')
    assert call.error == "</tool_call> without <tool_call>"


# A chat template that renders tool calls and tool messages the way Qwen2.5's does (written for
# this test; the structure follows Qwen2.5-Instruct's tokenizer_config chat_template).
QWEN25_LIKE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture
def chat_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<|im_end|>": 1, "<|im_start|>": 2, "<unk>": 3}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<|im_end|>", unk_token="<unk>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = QWEN25_LIKE
    return tok


def test_hermes_observation_is_the_chat_templates_tool_turn(chat_tokenizer):
    fmt = HermesFormat()
    obs = fmt.observation([ToolResult("Doc 1"), ToolResult("Doc 2")], chat_tokenizer)
    assert obs == ("<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1\n</tool_response>\n<tool_response>\n"
                   "Doc 2\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # the whole trajectory, model text + observation, is exactly what the template renders for the conversation
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
    convo = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}]},
             {"role": "tool", "content": "Doc 1"}, {"role": "tool", "content": "Doc 2"}]
    head = chat_tokenizer.apply_chat_template(convo[:1], tokenize=False, add_generation_prompt=True)
    full = chat_tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    # Qwen2.5 opens an assistant turn that only calls with "<|im_start|>assistant\n<tool_call>": the head's
    # generation prompt already ends in that newline, so the model's turn is the call itself
    assert head.endswith("<|im_start|>assistant\n") and head + call + obs == full


def test_hermes_without_tool_template_falls_back_to_chatml(chat_tokenizer):
    chat_tokenizer.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
                                    "'<|im_end|>\\n' }}{% endfor %}")  # SmolLM2-like: no tool support
    obs = HermesFormat().observation([ToolResult("r")], chat_tokenizer)
    assert obs == "<|im_end|>\n<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    instructions = HermesFormat().instructions(Toolbox([search]), chat_tokenizer)
    assert "<tools>" in instructions and '"name": "search"' in instructions and "<answer>" in instructions


def test_hermes_instructions_leave_the_schemas_to_a_tool_template(chat_tokenizer):
    from tinyrl.agents.prompts import render_agent_prompt

    fmt, box = HermesFormat(), Toolbox([search])
    assert "<tools>" not in fmt.instructions(box, chat_tokenizer)
    rendered = render_agent_prompt(chat_tokenizer, "where?", fmt, box)
    assert rendered.count("<tools>") == 1 and '"name": "search"' in rendered
    assert rendered.endswith("<|im_start|>user\nwhere?<|im_end|>\n<|im_start|>assistant\n")


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="agent.format: must be one of"):
        make_format("xml")
