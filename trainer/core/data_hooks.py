"""What TrainModule and DataModule share: the optional `*_dataloader()` hooks, `prepare_data`, the three
batch-transfer hooks and the `hparams` dict (Lightning's `DataHooks`, which both classes have too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from strategies.model.device_move import move_to_device


class AttributeDict(dict):
    """A dict whose keys are also attributes: `self.hparams.lr`."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"hparams has no key {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        try:
            del self[key]
        except KeyError:
            raise AttributeError(f"hparams has no key {key!r}") from None

    def __eq__(self, other: object) -> bool:
        """Equal to a mapping that is not a dict too (an omegaconf DictConfig the hyperparameters came from)."""
        if isinstance(other, Mapping) and not isinstance(other, dict):
            return dict(self) == dict(other.items())
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # a dict is unhashable; defining __eq__ must not change that


def _default_hook(fn: Any) -> Any:
    """Mark a base-class data hook so the Trainer can tell that the user did not define it."""
    fn._is_default_hook = True
    return fn


class DataHooks:
    """The optional data hooks shared by TrainModule and DataModule; the `*_dataloader()` ones are marked so
    the Trainer can tell a hook the user defined from this default.

    Attributes:
        prepare_data_per_node: True (the default): `prepare_data` runs on local rank 0 of every machine;
            False: only on global rank 0 (a shared filesystem). Set it in `__init__`.
    """

    prepare_data_per_node: bool = True

    def prepare_data(self) -> None:
        """Download or write files here, once per machine (see `prepare_data_per_node`), before `setup`.

        The other ranks wait in a barrier until it returns; do not set state on `self` here (the other
        ranks never run it): build datasets in `setup`.
        """

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device (runs on the CPU, in the main process); return it."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to `device`: tensors in (nested) lists, tuples, dicts, and objects with a `.to()`.

        Override it for batch types the default does not know, and return the moved batch.
        """
        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch after it moved to the device (e.g. GPU augmentation); return it."""
        return batch

    @_default_hook
    def train_dataloader(self) -> Any:
        """The training loader, when not passed to `fit`: a `DataLoader` (or any iterable of batches)."""
        return None

    @_default_hook
    def val_dataloader(self) -> Any:
        """The validation loader, or a list of them (metric keys then get `/dataloader_idx_N`)."""
        return None

    @_default_hook
    def test_dataloader(self) -> Any:
        """The test loader, or a list of them, for `trainer.test()`."""
        return None

    @_default_hook
    def predict_dataloader(self) -> Any:
        """The predict loader, or a list of them, for `trainer.predict()`."""
        return None
