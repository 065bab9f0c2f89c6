"""DataModule: the data side of a run (download/prepare, split, loaders), kept apart from the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.data_hooks import DataHooks
from trainer.hparams import HyperparametersMixin


class DataModule(HyperparametersMixin, DataHooks):
    """Subclass and define the `*_dataloader` hooks you need; `setup(stage)` runs on every rank."""

    def __init__(self) -> None:
        self.trainer: Any = None

    def prepare_data(self) -> None:
        """Download or write files here. Called on every rank before `setup` (Lightning: once per node),
        so make it safe to run concurrently."""

    def setup(self, stage: str) -> None:
        """Build datasets; `stage` is 'fit', 'validate', 'test' or 'predict'."""

    def teardown(self, stage: str) -> None:
        """Release what setup built."""

    def state_dict(self) -> dict[str, Any]:
        """Extra state to save in checkpoints (primitives and tensors only)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what state_dict returned."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | Path, map_location: Any = None,
                             hparams_file: str | Path | None = None, **overrides: Any) -> DataModule:
        """Rebuild the DataModule from the `datamodule_hyper_parameters` of a checkpoint (plus `hparams_file` and
        `overrides`, as in Lightning), then restore what its `state_dict()` saved."""
        from trainer.checkpoint import load_datamodule_from_checkpoint

        return load_datamodule_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, overrides)
