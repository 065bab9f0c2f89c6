"""`reload_dataloaders_every_n_epochs` with Lightning 2.x as the oracle: the loader hooks are called at the same
epochs, training sees the same batches in the same shuffled order (loaders whose contents and length change per
request), validation runs on the same batches, and the weights end equal."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies.exceptions import ConfigError

QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
         "accelerator": "cpu", "devices": 1}


def _module(base: type) -> Any:
    class Reloading(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            self.calls: list[tuple[str, int]] = []
            self.seen: list[tuple[str, int, list[int]]] = []

        def _loader(self, kind: str, offset: int) -> DataLoader:
            self.calls.append((kind, self.current_epoch))
            n = 8 + 4 * self.current_epoch  # each epoch's request gives a longer loader
            gen = torch.Generator().manual_seed(n)
            data = TensorDataset(torch.arange(offset, offset + n), torch.randn(n, 4, generator=gen))
            return DataLoader(data, batch_size=4, shuffle=kind == "train")

        def train_dataloader(self) -> DataLoader:
            return self._loader("train", 100 * self.current_epoch)

        def val_dataloader(self) -> DataLoader:
            return self._loader("val", 1000 + 100 * self.current_epoch)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.seen.append(("train", self.current_epoch, batch[0].tolist()))
            return self.layer(batch[1]).pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.seen.append(("val", self.current_epoch, batch[0].tolist()))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Reloading()


@pytest.mark.parametrize("flags", [{"reload_dataloaders_every_n_epochs": 1},
                                   {"reload_dataloaders_every_n_epochs": 2, "val_check_interval": 0.5},
                                   {"reload_dataloaders_every_n_epochs": 2, "check_val_every_n_epoch": 2,
                                    "num_sanity_val_steps": 2}])
def test_reloads_as_lightning_does(flags: dict[str, Any]) -> None:
    pl = pytest.importorskip("lightning.pytorch", reason="Lightning (the [dev] extra) is not installed")
    import trainer

    runs = []
    for module_base, trainer_cls in ((pl.LightningModule, pl.Trainer), (trainer.TrainModule, trainer.Trainer)):
        torch.manual_seed(1)
        model = _module(module_base)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer_cls(max_epochs=5, **{"num_sanity_val_steps": 0, **QUIET, **flags}).fit(model)
        runs.append(model)
    theirs, ours = runs
    for kind in ("train", "val"):  # the epochs each hook is called at (with a sanity check Lightning's first
        # request of the validation loaders comes before the training loader's; ours after it)
        assert [e for k, e in ours.calls if k == kind] == [e for k, e in theirs.calls if k == kind]
    assert len(ours.calls) > 3
    assert ours.seen == theirs.seen
    assert torch.equal(ours.layer.weight, theirs.layer.weight)


def test_a_negative_value_is_refused() -> None:
    import trainer

    with pytest.raises(ConfigError, match="reload_dataloaders_every_n_epochs"):
        trainer.Trainer(reload_dataloaders_every_n_epochs=-1)


def test_resume_with_reloads_is_bit_exact(tmp_path: Any) -> None:
    """From a checkpoint at an epoch end (the next epoch requests its loaders again) and from one mid-epoch, the
    resumed run sees the batches of the uninterrupted one and ends with its weights."""
    import trainer
    from callbacks import ModelCheckpoint

    flags = {**QUIET, "num_sanity_val_steps": 0, "reload_dataloaders_every_n_epochs": 1, "max_epochs": 4}

    def fit(root: Any, ckpt: Any = None, save: bool = False) -> Any:
        trainer.seed_everything(5)
        model = _module(trainer.TrainModule)
        callbacks = [ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1, filename="{step}")] \
            if save else []
        trainer.Trainer(**{**flags, "enable_checkpointing": save}, callbacks=callbacks).fit(model, ckpt_path=ckpt)
        return model

    reference = fit(tmp_path / "ref", save=True)
    steps = [i for i, (kind, _, _) in enumerate(s for s in reference.seen if s[0] == "train")]
    train_seen = [s for s in reference.seen if s[0] == "train"]
    for step in (3, 5):  # the end of epoch 0 (3 batches), and inside epoch 1
        resumed = fit(tmp_path / f"r{step}", ckpt=tmp_path / "ref" / f"step={step}.ckpt")
        assert [s for s in resumed.seen if s[0] == "train"] == train_seen[step:]
        assert torch.equal(resumed.layer.weight, reference.layer.weight)
    assert steps
