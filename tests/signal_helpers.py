"""Rewards for the signal tests in tests/test_resume.py: a start-up and a first step that take a while,
each saying when it began (a file at the path its environment variable names)."""

import os
import time

if os.environ.get("TINYRL_TEST_SLOW_IMPORT"):  # imported as the run starts: its folder exists, its trainer does not
    open(os.environ["TINYRL_TEST_SLOW_IMPORT"], "w").close()
    time.sleep(60)


def slow(prompts, completions, **kw):
    mark = os.environ.get("TINYRL_TEST_SLOW_REWARD")
    if mark:
        open(mark, "w").close()
    time.sleep(60)
    return [0.0] * len(completions)
