"""What TrainModule and DataModule share: the optional `*_dataloader()` hooks and the `hparams` dict."""

from __future__ import annotations

from typing import Any


class AttributeDict(dict):
    """A dict whose keys are also attributes: `self.hparams.lr`."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"hparams has no key {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def _default_hook(fn: Any) -> Any:
    """Mark a base-class data hook so the Trainer can tell that the user did not define it."""
    fn._is_default_hook = True
    return fn


class DataHooks:
    """The optional `*_dataloader()` hooks shared by TrainModule and DataModule; marked so the Trainer can
    tell a hook the user defined from this default."""

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
