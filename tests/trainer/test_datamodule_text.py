"""`str(datamodule)`: a line per stage with the size of each loader's dataset, as Lightning prints it (Lightning's own
DataModule over the same datasets is the oracle)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from trainer import DataModule


class Endless(IterableDataset):
    def __iter__(self) -> Any:
        yield torch.zeros(2)


def _hooks(stage: str | None) -> dict[str, Any]:
    """Loader hooks that work only for the stages `setup(stage)` prepared (a missing dataset raises, as usual)."""
    ready = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}.get(
        stage or "", ())

    def hook(name: str, loaders: Any) -> Any:
        def make(self: Any) -> Any:
            if name not in ready:
                raise AttributeError(f"{name} data set not set up")
            return loaders()
        return make

    return {"train_dataloader": hook("train", lambda: [DataLoader(TensorDataset(torch.zeros(16, 2))),
                                                       DataLoader(Endless())]),
            "val_dataloader": hook("val", lambda: DataLoader(Endless())),
            "test_dataloader": hook("test", lambda: DataLoader(TensorDataset(torch.zeros(64, 2)))),
            "predict_dataloader": hook("predict", lambda: {"a": DataLoader(TensorDataset(torch.zeros(3, 2)))})}


@pytest.mark.parametrize("stage", [None, "fit", "validate", "test", "predict"])
def test_the_text_is_lightnings(stage: str | None):
    ours = type("Ours", (DataModule,), _hooks(stage))()
    text = str(ours)
    assert text.splitlines()[0] in ("{Train dataloader: None}", "{Train dataloader: 1. size=16 ; 2. size=NA}")
    pl = pytest.importorskip("lightning.pytorch")
    theirs = type("Theirs", (pl.LightningDataModule,), _hooks(stage))()
    if stage == "predict":  # Lightning's str() fails on a dict of loaders (it numbers the keys): ours its values
        assert text.splitlines()[3] == "{Predict dataloader: 1. size=3}"
    else:
        assert text == str(theirs)
