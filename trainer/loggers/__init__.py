"""Loggers. TensorBoardLogger imports tensorboard only when it first writes."""

from trainer.loggers.base import Logger
from trainer.loggers.csv import CSVLogger
from trainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]
