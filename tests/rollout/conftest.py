"""Fixtures of the rollout tests."""

from __future__ import annotations

import pytest

from tests.conftest import make_char_model


@pytest.fixture(scope="module")
def char_policy(tmp_path_factory):
    """A random Llama over tiny-arith's printable-ASCII tokenizer: it emits "]" and "!" often (the toy
    call format of test_agent_loop: "]" ends a tool call, "!" the episode)."""
    from tinyrl.config import LoraConfig, ModelConfig
    from tinyrl.model import load_policy

    path = make_char_model(tmp_path_factory.mktemp("char-random"))
    return load_policy(ModelConfig(name=path), LoraConfig(r=4, alpha=8))
