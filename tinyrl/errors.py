"""The errors a user can cause, in one module that imports nothing else of tinyrl.

Every module that validates user input raises these; the CLI turns each into one clear
paragraph on stderr (never a traceback). Keeping them here breaks the import circle
config <-> algo.recipes <-> monitor.
"""


class ConfigError(ValueError):
    """A preset or override that cannot be turned into a valid RunConfig (names the field)."""
