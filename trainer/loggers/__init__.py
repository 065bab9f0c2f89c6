"""Loggers. TensorBoardLogger imports tensorboard only when it first writes; MLFlowLogger and WandbLogger import
mlflow and wandb only when their run starts (install them with the `mlflow` and `wandb` extras)."""

from typing import Any

from trainer.loggers.base import Logger
from trainer.loggers.csv import CSVLogger
from trainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]


def __getattr__(name: str) -> Any:  # PEP 562: the tracking loggers' modules load on first use
    if name == "MLFlowLogger":
        from trainer.loggers.mlflow import MLFlowLogger

        return MLFlowLogger
    if name == "WandbLogger":
        from trainer.loggers.wandb import WandbLogger

        return WandbLogger
    raise AttributeError(f"module 'trainer.loggers' has no attribute {name!r}")
