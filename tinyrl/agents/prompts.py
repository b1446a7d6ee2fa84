"""Prompts for agent tasks: question templates, and rendering a prompt with the format's instructions.

Templates (a task's `template` arg):

- `search_r1`: Search-R1's own user prompt, its instruction then `Question: ...` (what its
  models and data expect; the search_r1 format's instructions live here, in the user turn);
- `plain`: `Question: ...` and a newline (the shipped tiny search model was pretrained on this);
- `bare`: the question alone (chat models whose format supplies a system prompt, e.g. hermes).

`render_agent_prompt` is `tinyrl.data.render_prompt` for agent runs: it adds the call format's
instructions as the system prompt and, for a chat template that renders tools (Qwen2.5), passes
the tool schemas so the template writes its own `# Tools` block.
"""

from __future__ import annotations

from tinyrl.agents.formats import SEARCH_R1_INSTRUCTION

TEMPLATES = {
    "search_r1": SEARCH_R1_INSTRUCTION + " Question: {question}\n",
    "plain": "Question: {question}\n",
    "bare": "{question}",
}


def normalize_question(question: str) -> str:
    """Search-R1's cleaning: strip, and end with a question mark.

    >>> normalize_question(" who taught Bales Bavax ")
    'who taught Bales Bavax?'
    """
    q = question.strip()
    return q if q.endswith("?") else q + "?"


def question_prompt(question: str, template: str = "search_r1") -> str:
    """The user prompt for `question`.

    >>> question_prompt("where was Bales Bavax born?", "plain")
    'Question: where was Bales Bavax born?\\n'
    """
    if template not in TEMPLATES:
        raise ValueError(f"data.task_args.template: must be one of {sorted(TEMPLATES)}, got {template!r}")
    return TEMPLATES[template].format(question=question)


def render_agent_prompt(tokenizer, prompt: str, fmt, toolbox, cfg_data=None) -> str:
    """The rendered prompt of an agent run: chat template (when the model has one and
    `data.chat_template` allows it) with the format's system prompt and tool schemas."""
    mode = getattr(cfg_data, "chat_template", "auto")
    system = getattr(cfg_data, "system_prompt", None) or fmt.instructions(toolbox, tokenizer)
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if mode == "never" or (mode == "auto" and not has_template):
        return prompt if system is None else f"{system}\n{prompt}"
    if not has_template:
        raise ValueError("data.chat_template is 'always' but the tokenizer has no chat template")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    kwargs = {}
    if fmt.name == "hermes" and toolbox is not None and fmt._template_affixes(tokenizer) is not None:
        kwargs["tools"] = toolbox.schemas()  # the template writes the tools block itself
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
