"""DataModule: the data side of a run (download/prepare, split, loaders), kept apart from the model."""

from __future__ import annotations

import os
from collections.abc import Sized
from pathlib import Path
from typing import Any

from trainer.core.data_hooks import DataHooks
from trainer.core.hparams import HyperparametersMixin


class DataModule(HyperparametersMixin, DataHooks):
    """Subclass and define the `*_dataloader` hooks you need; `setup(stage)` runs on every rank.

    `prepare_data` (once per machine), the batch-transfer hooks and `prepare_data_per_node` are shared with
    TrainModule (trainer/core/data_hooks.py); a transfer hook defined here wins over the module's, as in Lightning.

    Attributes:
        name: an optional name for the data set (Lightning's attribute; not used by the Trainer).
    """

    name: str | None = None
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self) -> None:
        self.trainer: Any = None

    @classmethod
    def from_datasets(
        cls,
        train_dataset: Any = None,
        val_dataset: Any = None,
        test_dataset: Any = None,
        predict_dataset: Any = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **datamodule_kwargs: Any,
    ) -> DataModule:
        """A DataModule whose `*_dataloader()` hooks return plain DataLoaders over the given datasets.

        Each dataset may be one Dataset or a list of them (several loaders). Training loaders shuffle (unless the
        dataset is iterable-style); `num_workers > 0` keeps the workers alive between epochs. `batch_size` and
        `num_workers` also go to `__init__` when it takes them, with `datamodule_kwargs`.

        Example:
            ```python
            data = DataModule.from_datasets(train_ds, val_ds, batch_size=32)
            trainer.fit(model, datamodule=data)
            ```
        """
        import inspect

        from torch.utils.data import DataLoader, IterableDataset

        def loader(dataset: Any, shuffle: bool) -> DataLoader:
            return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                              shuffle=shuffle and not isinstance(dataset, IterableDataset),
                              persistent_workers=num_workers > 0)

        def hook(datasets: Any, shuffle: bool) -> Any:
            if isinstance(datasets, (list, tuple)):
                return lambda: [loader(ds, shuffle) for ds in datasets]
            return lambda: loader(datasets, shuffle)

        accepted = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())  # `**kwargs`: all go
        extra = {k: v for k, v in (("batch_size", batch_size), ("num_workers", num_workers))
                 if k in accepted or takes_any}
        datamodule = cls(**datamodule_kwargs, **extra)
        given = (("train_dataloader", train_dataset, True), ("val_dataloader", val_dataset, False),
                 ("test_dataloader", test_dataset, False), ("predict_dataloader", predict_dataset, False))
        for name, datasets, shuffle in given:
            if datasets is not None:
                setattr(datamodule, name, hook(datasets, shuffle))
        return datamodule

    def setup(self, stage: str) -> None:
        """Build datasets; `stage` (by keyword) is the run's `TrainerFn`, equal to 'fit', 'validate', 'test' or
        'predict'."""

    def teardown(self, stage: str) -> None:
        """Release what setup built."""

    def on_exception(self, exception: BaseException) -> None:
        """Called on every rank when fit/validate/test/predict raises, before teardown (after the callbacks')."""

    def __str__(self) -> str:
        """One line per stage, as Lightning prints a DataModule: `{Train dataloader: size=64}` (the dataset's
        length, `NA` without one), `1. size=16 ; 2. size=NA` for several loaders, `None` where the hook is missing
        or fails (e.g. before `setup` made the dataset)."""
        lines = []
        for stage, hook in (("Train", "train_dataloader"), ("Validation", "val_dataloader"),
                            ("Test", "test_dataloader"), ("Predict", "predict_dataloader")):
            try:
                loaders = getattr(self, hook)()
            except Exception:  # noqa: BLE001 - any failure shows as None, as in Lightning
                lines.append(f"{{{stage} dataloader: None}}")
                continue
            if isinstance(loaders, (list, tuple, dict)):
                several = loaders.values() if isinstance(loaders, dict) else loaders
                shown = " ; ".join(f"{i}. {_size(loader)}" for i, loader in enumerate(several, start=1))
            else:
                shown = _size(loaders)
            lines.append(f"{{{stage} dataloader: {shown}}}")
        return os.linesep.join(lines)

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
        from trainer.checkpoint.schema import load_datamodule_from_checkpoint

        return load_datamodule_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, overrides)


def _size(loader: Any) -> str:
    dataset = getattr(loader, "dataset", None)
    return f"size={len(dataset)}" if isinstance(dataset, Sized) else "size=NA"
