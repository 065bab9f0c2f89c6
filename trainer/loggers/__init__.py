"""Loggers. TensorBoardLogger imports tensorboard only when it first writes; MLFlowLogger and WandbLogger import
mlflow and wandb only when their run starts (install them with the `mlflow` and `wandb` extras)."""

from trainer.loggers.base import Logger
from trainer.loggers.csv import CSVLogger, ExperimentWriter
from trainer.loggers.mlflow import MLFlowLogger
from trainer.loggers.tensorboard import TensorBoardLogger
from trainer.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "ExperimentWriter", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]

# Lightning loggers that have no counterpart here, with what to use instead (a clear ImportError, not a bare one).
_NOT_HERE = ("CometLogger", "NeptuneLogger", "LitLogger")


def __getattr__(name: str) -> object:
    if name in _NOT_HERE:
        raise ImportError(f"Lightning's {name} is not implemented in trainer.loggers: use TensorBoardLogger, "
                          "CSVLogger, MLFlowLogger or WandbLogger, or subclass trainer.loggers.Logger (log_metrics, "
                          "log_hyperparams) to send to another service.")
    raise AttributeError(f"module 'trainer.loggers' has no attribute {name!r}")
