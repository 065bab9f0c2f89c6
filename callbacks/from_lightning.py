"""Lightning 2.6.6's `lightning.pytorch.callbacks` names as `callbacks` provides them (docs/from-lightning.md,
"Every Lightning import"): each resolves to our callback of that name, or names what to use instead.

Data only; `callbacks/__init__.py` looks a name up here when it is not one of ours (strategies/from_lightning.py).
"""

from __future__ import annotations

from strategies.from_lightning import Row, ours, refused, same

_RICH_COLUMN = "RichProgressBar's columns are its own here: style the bar with RichProgressBarTheme"

NAMES: dict[str, Row] = {
    "Callback": same("callbacks.base", "callbacks", "callbacks.callback"),
    "BackboneFinetuning": same("callbacks.finetuning", "callbacks", "callbacks.finetuning"),
    "BaseFinetuning": same("callbacks.finetuning", "callbacks", "callbacks.finetuning"),
    "multiplicative": same("callbacks.finetuning", "callbacks.finetuning"),
    "BasePredictionWriter": same("callbacks.prediction_writer", "callbacks", "callbacks.prediction_writer"),
    "WriteInterval": same("callbacks.prediction_writer", "callbacks.prediction_writer"),
    "BatchSizeFinder": same("callbacks.finders", "callbacks", "callbacks.batch_size_finder"),
    "LearningRateFinder": same("callbacks.finders", "callbacks", "callbacks.lr_finder"),
    "DeviceStatsMonitor": same("callbacks.device_stats", "callbacks", "callbacks.device_stats_monitor"),
    "EarlyStopping": same("callbacks.early_stopping", "callbacks", "callbacks.early_stopping"),
    "EarlyStoppingReason": same("callbacks.early_stopping", "callbacks.early_stopping"),
    "GradientAccumulationScheduler": same("callbacks.gradient_accumulation", "callbacks",
                                          "callbacks.gradient_accumulation_scheduler"),
    "LambdaCallback": same("callbacks.lambda_function", "callbacks", "callbacks.lambda_function"),
    "LearningRateMonitor": same("callbacks.lr_monitor", "callbacks", "callbacks.lr_monitor"),
    "ModelCheckpoint": same("callbacks.checkpoint", "callbacks", "callbacks.model_checkpoint"),
    "Checkpoint": same("callbacks.base", "callbacks", "callbacks.checkpoint"),
    "OnExceptionCheckpoint": same("callbacks.on_exception_checkpoint", "callbacks",
                                  "callbacks.on_exception_checkpoint"),
    "ModelSummary": same("callbacks.model_summary", "callbacks", "callbacks.model_summary"),
    "RichModelSummary": same("callbacks.rich_model_summary", "callbacks", "callbacks.rich_model_summary"),
    "ModelPruning": refused("prune in a callback of your own with torch.nn.utils.prune (e.g. l1_unstructured in "
                            "on_train_epoch_end)", "callbacks", "callbacks.pruning"),
    "SpikeDetection": same("callbacks.spike", "callbacks", "callbacks.spike"),
    "ProgressBar": ours("callbacks.progress", "", "the contract renames TQDMProgressBar to ProgressBar, so "
                        "ProgressBar is the tqdm bar here; Lightning's abstract ProgressBar is ProgressBarBase",
                        "callbacks", "callbacks.progress", "callbacks.progress.progress_bar"),
    "TQDMProgressBar": same("callbacks.progress", "callbacks", "callbacks.progress",
                            "callbacks.progress.tqdm_progress"),
    "get_standard_metrics": refused("ProgressBarBase.get_metrics(trainer, module) returns `v_num` with the "
                                    "progress-bar metrics", "callbacks.progress.progress_bar"),
    "Tqdm": same("callbacks.tqdm_bar", "callbacks.progress.tqdm_progress"),
    "convert_inf": refused("ProgressBar gives tqdm no total for a loader without length itself",
                           "callbacks.progress.tqdm_progress"),
    "RichProgressBar": same("callbacks.rich_progress", "callbacks", "callbacks.progress",
                            "callbacks.progress.rich_progress"),
    "RichProgressBarTheme": same("callbacks.rich_progress", "callbacks.progress.rich_progress"),
    "BatchesProcessedColumn": refused(_RICH_COLUMN, "callbacks.progress.rich_progress"),
    "CustomBarColumn": refused(_RICH_COLUMN, "callbacks.progress.rich_progress"),
    "CustomInfiniteTask": refused(_RICH_COLUMN, "callbacks.progress.rich_progress"),
    "CustomProgress": refused(_RICH_COLUMN, "callbacks.progress.rich_progress"),
    "CustomTimeColumn": refused(_RICH_COLUMN, "callbacks.progress.rich_progress"),
    "MetricsTextColumn": refused(_RICH_COLUMN, "callbacks.progress.rich_progress"),
    "ProcessingSpeedColumn": refused(_RICH_COLUMN, "callbacks.progress.rich_progress"),
    "StochasticWeightAveraging": same("callbacks.swa", "callbacks", "callbacks.stochastic_weight_avg"),
    "ThroughputMonitor": same("callbacks.throughput_monitor", "callbacks", "callbacks.throughput_monitor"),
    "Timer": same("callbacks.timer", "callbacks", "callbacks.timer"),
    "Interval": same("callbacks.timer", "callbacks.timer"),
    "EMAWeightAveraging": same("callbacks.weight_averaging", "callbacks", "callbacks.weight_averaging"),
    "WeightAveraging": same("callbacks.weight_averaging", "callbacks", "callbacks.weight_averaging"),
}
