"""Prompt order is a pure function of (seed, position): resumable, epoch-shuffled, complete."""

from tinyrl.data import PromptSource


def test_prompt_source_is_resumable_and_covers_every_row():
    rows = [{"prompt": str(i)} for i in range(10)]
    a = PromptSource(rows, seed=3)
    first = [r["prompt"] for r in a.next_batch(7)]
    state = a.state_dict()
    rest = [r["prompt"] for r in a.next_batch(13)]
    b = PromptSource(rows, seed=3)
    b.load_state_dict(state)
    assert [r["prompt"] for r in b.next_batch(13)] == rest
    epoch0 = first + rest[:3]
    assert sorted(epoch0, key=int) == [str(i) for i in range(10)]  # one epoch = every row once
    assert epoch0 != rest[3:13]  # the next epoch is reshuffled
    assert [r["prompt"] for r in PromptSource(rows, seed=4).next_batch(7)] != first
