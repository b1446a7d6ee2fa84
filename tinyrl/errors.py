"""The errors a user can cause, in one module that imports nothing else of tinyrl.

Every module that validates user input, or meets a run it cannot continue, raises these; the
CLI turns each into one clear paragraph on stderr (never a traceback) without importing the
modules that raise them.
"""


class ConfigError(ValueError):
    """A preset or override that cannot be turned into a valid RunConfig (names the field)."""


class ModelLoadError(RuntimeError):
    """A model, tokenizer or adapter that cannot be loaded (names the folder or file and the field).

    Re-exported as `tinyrl.model.ModelLoadError`; here so that the model backends
    (tinyrl.backends) raise it without importing the loader that imports them."""


class RewardImportError(ValueError):
    """A reward function named in `reward.functions` that cannot be imported or called."""


class ResumeError(RuntimeError):
    """A run folder that cannot be continued (no checkpoint, or one of another model)."""


class StaleWeightsError(RuntimeError):
    """The rollout engine is not sampling from the trained weights (the monitor's canary)."""


class MissingExtra(ImportError):
    """An optional dependency a run needs is not installed (names the feature and the extra to install).
    An ImportError, so code that falls back when a package is missing still catches it."""


class PeerLostError(RuntimeError):
    """A collective failed: another process of the run died, or stalled past `dist.timeout_s`."""


# what the CLI reports as one paragraph (an OSError and an out-of-memory error are reported too, in their own words)
USER_ERRORS = (ConfigError, ModelLoadError, RewardImportError, ResumeError, StaleWeightsError, PeerLostError,
               MissingExtra)
