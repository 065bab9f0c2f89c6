"""Callbacks: hooks that observe or steer a run (checkpointing, early stopping, LR logging, progress)."""

from callbacks.base import Callback
from callbacks.checkpoint import ModelCheckpoint
from callbacks.device_stats import DeviceStatsMonitor
from callbacks.early_stopping import EarlyStopping
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
from callbacks.swa import StochasticWeightAveraging
from callbacks.throughput_monitor import ThroughputMonitor
from callbacks.timer import Timer
from callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

__all__ = [
    "BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "BatchSizeFinder", "Callback",
    "DeviceStatsMonitor", "EMAWeightAveraging", "EarlyStopping", "GradientAccumulationScheduler", "LambdaCallback",
    "LearningRateFinder", "LearningRateMonitor", "ModelCheckpoint", "ModelSummary", "OnExceptionCheckpoint",
    "ProgressBar", "ProgressBarBase", "RichModelSummary", "RichProgressBar", "RichProgressBarTheme",
    "StochasticWeightAveraging", "ThroughputMonitor", "Timer",
    "WeightAveraging",
]
