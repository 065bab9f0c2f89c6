"""Callbacks: hooks that observe or steer a run (checkpointing, early stopping, LR logging, progress).

Each name is imported from its module on first use (PEP 562), so `import callbacks` and a Trainer that needs
three callbacks do not load the other twenty: time to first step is a benchmark. Lightning's other callback names
resolve through callbacks/from_lightning.py, or name what to use instead."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from callbacks.base import Callback, Checkpoint
    from callbacks.checkpoint import ModelCheckpoint
    from callbacks.device_stats import DeviceStatsMonitor
    from callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
    from callbacks.finders import BatchSizeFinder, LearningRateFinder
    from callbacks.finetuning import BackboneFinetuning, BaseFinetuning
    from callbacks.gradient_accumulation import GradientAccumulationScheduler
    from callbacks.lambda_function import LambdaCallback
    from callbacks.lr_monitor import LearningRateMonitor
    from callbacks.model_summary import ModelSummary
    from callbacks.on_exception_checkpoint import OnExceptionCheckpoint
    from callbacks.prediction_writer import BasePredictionWriter
    from callbacks.progress import ProgressBar
    from callbacks.progress_base import ProgressBarBase
    from callbacks.rich_model_summary import RichModelSummary
    from callbacks.rich_progress import RichProgressBar, RichProgressBarTheme
    from callbacks.spike import SpikeDetection, TrainingSpikeException
    from callbacks.swa import StochasticWeightAveraging
    from callbacks.throughput_monitor import ThroughputMonitor
    from callbacks.timer import Timer
    from callbacks.tqdm_bar import Tqdm
    from callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

_MODULES = {
    "BackboneFinetuning": "callbacks.finetuning",
    "BaseFinetuning": "callbacks.finetuning",
    "BasePredictionWriter": "callbacks.prediction_writer",
    "BatchSizeFinder": "callbacks.finders",
    "Callback": "callbacks.base",
    "Checkpoint": "callbacks.base",
    "DeviceStatsMonitor": "callbacks.device_stats",
    "EMAWeightAveraging": "callbacks.weight_averaging",
    "EarlyStopping": "callbacks.early_stopping",
    "EarlyStoppingReason": "callbacks.early_stopping",
    "GradientAccumulationScheduler": "callbacks.gradient_accumulation",
    "LambdaCallback": "callbacks.lambda_function",
    "LearningRateFinder": "callbacks.finders",
    "LearningRateMonitor": "callbacks.lr_monitor",
    "ModelCheckpoint": "callbacks.checkpoint",
    "ModelSummary": "callbacks.model_summary",
    "OnExceptionCheckpoint": "callbacks.on_exception_checkpoint",
    "ProgressBar": "callbacks.progress",
    "ProgressBarBase": "callbacks.progress_base",
    "RichModelSummary": "callbacks.rich_model_summary",
    "RichProgressBar": "callbacks.rich_progress",
    "RichProgressBarTheme": "callbacks.rich_progress",
    "SpikeDetection": "callbacks.spike",
    "StochasticWeightAveraging": "callbacks.swa",
    "ThroughputMonitor": "callbacks.throughput_monitor",
    "Timer": "callbacks.timer",
    "TrainingSpikeException": "callbacks.spike",
    "Tqdm": "callbacks.tqdm_bar",
    "WeightAveraging": "callbacks.weight_averaging",
}
__all__ = [
    "BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "BatchSizeFinder", "Callback", "Checkpoint",
    "DeviceStatsMonitor", "EMAWeightAveraging", "EarlyStopping", "EarlyStoppingReason", "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder", "LearningRateMonitor", "ModelCheckpoint", "ModelSummary", "OnExceptionCheckpoint",
    "ProgressBar", "ProgressBarBase", "RichModelSummary", "RichProgressBar", "RichProgressBarTheme",
    "SpikeDetection", "StochasticWeightAveraging", "ThroughputMonitor", "Timer", "Tqdm", "TrainingSpikeException",
    "WeightAveraging",
]




def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        from callbacks.from_lightning import NAMES
        from strategies.from_lightning import resolve

        value = resolve(__name__, NAMES, name)
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    from callbacks.from_lightning import NAMES
    from strategies.from_lightning import names_here

    return sorted({*globals(), *_MODULES, *names_here(NAMES)})
