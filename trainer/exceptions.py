"""User-facing exception types (defined in the leaf `strategies` package, re-exported here)."""

from strategies.exceptions import (
    CheckpointError,
    CheckpointLoadError,
    CheckpointSaveError,
    ConfigError,
    DistributedDesyncError,
    MetricNotFoundError,
    MisconfigurationError,
    MisconfigurationException,
    StateKeyCollisionError,
    TrainerError,
)

__all__ = [
    "CheckpointError",
    "CheckpointLoadError",
    "CheckpointSaveError",
    "ConfigError",
    "DistributedDesyncError",
    "MetricNotFoundError",
    "MisconfigurationError",
    "MisconfigurationException",
    "StateKeyCollisionError",
    "TrainerError",
]
