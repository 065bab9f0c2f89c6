"""Loggers. TensorBoardLogger imports tensorboard only when it first writes; MLFlowLogger and WandbLogger import
mlflow and wandb only when their run starts (install them with the `mlflow` and `wandb` extras)."""


from strategies.from_lightning import package_lookups
from trainer.loggers.base import DummyLogger, Logger
from trainer.loggers.csv import CSVLogger, ExperimentWriter
from trainer.loggers.mlflow import MLFlowLogger
from trainer.loggers.tensorboard import TensorBoardLogger
from trainer.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "DummyLogger", "ExperimentWriter", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]


# Lightning's names (docs/from-lightning.md): resolved on first use, or an error naming what to use instead
__getattr__, __dir__ = package_lookups(__name__, "trainer.from_lightning")
