"""`python -m tinyrl ...` is the `tinyrl` command (what `accelerate launch ... -m tinyrl train ...` runs)."""

from tinyrl.cli import entry

entry()
