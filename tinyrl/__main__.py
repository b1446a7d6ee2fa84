"""`python -m tinyrl ...` is the `tinyrl` command (what `accelerate launch ... -m tinyrl train ...` runs)."""

import sys

from tinyrl.cli import main

sys.exit(main())
