"""Loggers. TensorBoardLogger imports tensorboard only when it first writes; MLFlowLogger and WandbLogger import
mlflow and wandb only when their run starts (install them with the `mlflow` and `wandb` extras)."""

from typing import Any

from trainer.loggers.base import Logger
from trainer.loggers.csv import CSVLogger, ExperimentWriter
from trainer.loggers.mlflow import MLFlowLogger
from trainer.loggers.tensorboard import TensorBoardLogger
from trainer.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "ExperimentWriter", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]


def __getattr__(name: str) -> Any:
    """Lightning's names (trainer/from_lightning.py): resolved on first use, or an error naming what to use."""
    from strategies.from_lightning import resolve
    from trainer.from_lightning import TABLES

    value = resolve(__name__, TABLES[__name__], name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    from strategies.from_lightning import names_here
    from trainer.from_lightning import TABLES

    return sorted({*globals(), *names_here(TABLES[__name__])})
