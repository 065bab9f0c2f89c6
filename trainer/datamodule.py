"""DataModule: the data side of a run (download/prepare, split, loaders), kept apart from the model."""

from __future__ import annotations

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
