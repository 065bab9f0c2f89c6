"""The project's exception types.

They live in the leaf package so that strategies, callbacks and the trainer can all raise them;
`trainer.exceptions` re-exports them for users.
"""

from __future__ import annotations


class TrainerError(Exception):
    """Base class of every error this project raises on purpose."""


class MisconfigurationException(TrainerError):
    """Lightning's name for a refused configuration: the base of ConfigError and MisconfigurationError, so that a
    ported `except MisconfigurationException` catches what this project raises for the same refusals."""


class ConfigError(MisconfigurationException, ValueError):
    """A Trainer flag or config value is invalid. The message names the flag and the accepted values."""


class MisconfigurationError(MisconfigurationException, ValueError):
    """The user's TrainModule, DataModule or callbacks break the contract (a missing or malformed hook)."""


class MetricNotFoundError(MisconfigurationError, RuntimeError):
    """A callback monitors a metric that was never logged. Also a RuntimeError, the type Lightning's EarlyStopping
    raises for it, so code that catches that keeps working."""


class StateKeyCollisionError(ConfigError, RuntimeError):
    """Two callbacks with a state share a `state_key`, so one state would overwrite the other in checkpoints. Also a
    RuntimeError, the type Lightning raises for it."""


class CheckpointError(TrainerError):
    """A checkpoint could not be saved or loaded. The message names the path and the fix."""


class CheckpointLoadError(CheckpointError):
    """A checkpoint could not be read: missing, truncated, foreign or unsafe."""


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written; the previous checkpoint is left intact."""


class DistributedDesyncError(TrainerError, RuntimeError):
    """Ranks disagreed about what to do next (a dead rank, uneven data, mismatched collectives)."""


class PossibleUserWarning(UserWarning):
    """A warning about something that is often a mistake but may be meant (Lightning's category, so that
    `disable_possible_user_warnings()` or a `filterwarnings` entry silences exactly these)."""


class LightningDeprecationWarning(DeprecationWarning):
    """The category of `rank_zero_deprecation` (Lightning's name)."""
