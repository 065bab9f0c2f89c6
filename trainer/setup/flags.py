"""The Trainer's flags: one table (name, default, check) → a frozen RunSpec. Pure: no process groups, no I/O.

`FLAGS` is the single definition. `parse_flags` runs each flag's check from it, then resolves the flags that
depend on each other (devices, strategy and precision; the epoch limit; fast_dev_run), so a bad flag fails at
`Trainer(...)` time, before any work starts, with a message naming the flag and the accepted values.
The constructor's signature, RunSpec's fields and docs/index.md are tested against the table
(tests/trainer/test_flag_agreement.py): a new flag is one row here plus its parameter and field.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from strategies.base import Strategy
from strategies.checkpoint_io.filesystem import AnyPath, to_path
from strategies.exceptions import ConfigError
from strategies.launch.devices import Hardware, resolve_accelerator, resolve_devices
from strategies.precision import canonical_precision, precision_from_flag
from strategies.registry import STRATEGY_REGISTRY
from trainer.setup import flag_checks as check
from trainer.setup.flag_checks import Check

DEFAULT_MAX_EPOCHS = 1000  # Lightning's default when neither max_epochs nor max_steps is given
_NO_ACCELERATOR = Hardware(cuda_device_count=0, mps_available=False)


@dataclass(frozen=True)
class RunSpec:
    """Every resolved Trainer flag. Limits are int batch counts or float fractions (see data.py)."""

    device_type: str
    devices: tuple[torch.device, ...]
    num_nodes: int
    strategy: Strategy
    precision: str
    max_epochs: int  # -1: no epoch limit
    min_epochs: int
    min_steps: int  # 0: no minimum
    max_steps: int  # -1: no step limit
    max_time: timedelta | None
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    overfit_batches: int | float  # 0: off; else the train and val limits (data shuffling off in fit)
    val_check_interval: int | float | timedelta  # a timedelta: validate when that much wall time has passed
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int  # -1: all
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: str
    log_every_n_steps: int  # 0: no step values reach the loggers
    default_root_dir: AnyPath  # a Path, or an fsspec URL (s3://...)
    deterministic: bool | str
    fast_dev_run: int  # 0: off
    enable_checkpointing: bool
    enable_progress_bar: bool
    enable_model_summary: bool
    use_distributed_sampler: bool
    detect_anomaly: bool
    terminate_on_nan: bool
    agree_every_n_steps: int
    checkpoint_on_interrupt: bool
    inference_mode: bool
    benchmark: bool | None  # None: torch.backends.cudnn.benchmark as it is (False under deterministic=True)
    sync_batchnorm: bool
    barebones: bool
    reload_dataloaders_every_n_epochs: int  # 0: the fit's loaders are requested once
    plugins: Any  # the precision plugin given, or None
    enable_autolog_hparams: bool  # the module's and datamodule's hparams go to the loggers at fit start
    model_registry: None  # refused unless None


def _resolve_strategy(strategy: Any, devices: list[torch.device], num_nodes: int, precision: str) -> Strategy:
    if isinstance(strategy, str):
        name = strategy.strip().lower()
        if name == "auto":
            name = "single" if len(devices) * num_nodes == 1 else "ddp"
        return STRATEGY_REGISTRY.create(name, devices, num_nodes, precision_from_flag(precision, devices[0].type))
    if not callable(getattr(strategy, "adopt_flags", None)):
        raise ConfigError(f"strategy={strategy!r} is not valid: pass a strategy name or a Strategy instance.")
    strategy.adopt_flags(devices, num_nodes)
    if strategy.precision.name != precision:
        if strategy.precision.name != "32-true":
            raise ConfigError(
                f"precision={precision!r} conflicts with the {strategy.precision.name!r} precision the "
                f"{type(strategy).__name__} instance was built with; pass only one of them."
            )
        strategy.precision = precision_from_flag(precision, strategy.root_device.type)
    return strategy


def _check_strategy_precision(strategy: Strategy, precision: str) -> None:
    supported = strategy.supported_precisions()
    if precision not in supported:
        raise ConfigError(
            f"precision={precision!r} is not supported by {type(strategy).__name__}; "
            f"it supports: {', '.join(supported)}."
        )


@dataclass(frozen=True)
class Flag:
    """One Trainer flag: its default (the constructor's) and the check that validates and normalises a value."""

    name: str
    default: Any
    check: Check
    none_means: Any = None  # a flag whose signature default is None (as Lightning's): the value None stands for

    @property
    def resolved_default(self) -> Any:
        """The value the flag has when it is not given (None resolved)."""
        return self.none_means if self.default is None and self.name in NONE_MEANS_DEFAULT else self.default


_EPOCHS = " (-1 means no limit)"
FLAGS: tuple[Flag, ...] = (
    Flag("accelerator", "auto", check.as_given),
    Flag("devices", "auto", check.as_given),
    Flag("gpus", None, check.as_given),
    Flag("num_nodes", 1, check.int_at_least(1)),
    Flag("strategy", "auto", check.as_given),
    Flag("precision", "32-true", check.as_given),
    Flag("max_epochs", None, check.int_at_least(-1, _EPOCHS, allow_none=True)),
    Flag("min_epochs", None, check.int_at_least(0, allow_none=True)),
    Flag("max_steps", -1, check.int_at_least(-1, _EPOCHS)),
    Flag("min_steps", None, check.int_at_least(0, allow_none=True)),
    Flag("max_time", None, check.max_time),
    Flag("limit_train_batches", 1.0, check.batch_limit),
    Flag("limit_val_batches", 1.0, check.batch_limit),
    Flag("limit_test_batches", 1.0, check.batch_limit),
    Flag("limit_predict_batches", 1.0, check.batch_limit),
    Flag("overfit_batches", 0.0, check.batch_limit),
    Flag("val_check_interval", 1.0, check.check_interval),
    Flag("check_val_every_n_epoch", 1, check.int_at_least(1, " or None", allow_none=True)),
    Flag("num_sanity_val_steps", None, check.int_at_least(-1, " (-1 runs all validation batches)"), 2),
    Flag("accumulate_grad_batches", 1, check.int_at_least(1)),
    Flag("gradient_clip_val", None, check.clip_value),
    Flag("gradient_clip_algorithm", None, check.one_of("norm", "value"), "norm"),
    Flag("log_every_n_steps", None, check.int_at_least(0, " (0: no step values reach the loggers)"), 50),
    Flag("enable_checkpointing", None, check.boolean, True),
    Flag("enable_progress_bar", None, check.boolean, True),
    Flag("enable_model_summary", None, check.boolean, True),
    Flag("default_root_dir", None, check.optional_path),
    Flag("deterministic", False, check.one_of(True, False, "warn")),
    Flag("fast_dev_run", False, check.fast_dev_run),
    Flag("use_distributed_sampler", True, check.boolean),
    Flag("detect_anomaly", False, check.boolean),
    Flag("terminate_on_nan", False, check.boolean),
    Flag("agree_every_n_steps", 1, check.int_at_least(1)),
    Flag("checkpoint_on_interrupt", False, check.boolean),
    Flag("inference_mode", True, check.boolean),
    Flag("benchmark", None, check.optional_boolean),
    Flag("sync_batchnorm", False, check.boolean),
    Flag("barebones", False, check.boolean),
    Flag("reload_dataloaders_every_n_epochs", 0, check.int_at_least(0)),
    Flag("plugins", None, check.plugins),
    Flag("enable_autolog_hparams", True, check.boolean),
    Flag("model_registry", None, check.model_registry),
)
# Lightning's signature takes None for these and means the default by it (a YAML `null` included)
NONE_MEANS_DEFAULT = frozenset({
    "precision", "limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
    "val_check_interval", "num_sanity_val_steps", "log_every_n_steps", "enable_checkpointing", "enable_progress_bar",
    "enable_model_summary", "gradient_clip_algorithm", "deterministic",
})
FLAG_NAMES: tuple[str, ...] = tuple(flag.name for flag in FLAGS)


def parse_flags(hardware: Hardware | None = None, **given: Any) -> RunSpec:
    """Validate and resolve Trainer flags (any subset of `FLAGS`; the rest take their defaults).

    Raises ConfigError naming the flag and the accepted values. `hardware` defaults to what this machine has;
    tests pass another to resolve, say, 4 nodes of 8 GPUs on a CPU-only machine without starting anything.
    """
    unknown = sorted(set(given) - set(FLAG_NAMES))
    if unknown:
        raise ConfigError(f"unknown Trainer flag(s): {', '.join(unknown)}; the flags are listed in docs/index.md.")
    values = {flag.name: flag.check(flag.name, _given(given, flag)) for flag in FLAGS}
    device_type, devices = _resolve_hardware(values.pop("accelerator"), values.pop("devices"), values.pop("gpus"),
                                             hardware)
    values["precision"] = canonical_precision(values["precision"])
    if values["max_epochs"] is None:
        no_other_limit = values["max_steps"] == -1 and values["max_time"] is None
        values["max_epochs"] = DEFAULT_MAX_EPOCHS if no_other_limit else -1
    if values["min_epochs"] is None:  # Lightning's rule: a min_steps alone also waits for the first epoch's end
        values["min_epochs"] = 0 if values["min_steps"] is None else 1
    if values["min_steps"] is None:
        values["min_steps"] = 0
    if values["sync_batchnorm"] and device_type != "cuda" and len(devices) * values["num_nodes"] > 1:
        raise ConfigError("sync_batchnorm=True needs CUDA devices: torch's SyncBatchNorm runs on GPUs only (DDP "
                          "refuses it on CPU). Remove the flag, or train on GPUs.")
    root = values["default_root_dir"]
    values["default_root_dir"] = Path.cwd() if root is None else to_path(root)
    if dev_run := values["fast_dev_run"]:
        values.update(max_epochs=1, max_steps=dev_run, num_sanity_val_steps=0, limit_train_batches=dev_run,
                      limit_val_batches=dev_run, limit_test_batches=dev_run, limit_predict_batches=dev_run,
                      val_check_interval=1.0, check_val_every_n_epoch=1)  # checkpoint callbacks stay; they do not save
    _check_validation_cadence(values)
    if overfit := values["overfit_batches"]:  # Lightning's rule: it sets both limits, over fast_dev_run's too
        values.update(limit_train_batches=overfit, limit_val_batches=overfit)
    values["strategy"] = _resolve_strategy(values["strategy"], devices, values["num_nodes"],
                                           _precision_with_plugin(values, given.get("precision")))
    if values["plugins"] is not None:
        values["strategy"].precision = values["plugins"]
    _check_strategy_precision(values["strategy"], values["precision"])
    return RunSpec(device_type=device_type, devices=tuple(devices), **values)


def _check_validation_cadence(values: dict[str, Any]) -> None:
    """Lightning's rule: without `check_val_every_n_epoch` validation is counted across epochs, in batches or by the
    clock, so a fraction of an epoch (a float, 1.0 included) means nothing there."""
    interval = values["val_check_interval"]
    if values["check_val_every_n_epoch"] is None and isinstance(interval, float):
        raise ConfigError(
            f"val_check_interval={interval!r} is a fraction of an epoch, which check_val_every_n_epoch=None does not "
            "have: give an int (validate every N training batches, counted across epochs) or a time "
            "('DD:HH:MM:SS', a timedelta or a dict), or set check_val_every_n_epoch."
        )


def _precision_with_plugin(values: dict[str, Any], precision_given: Any) -> str:
    """The run's precision name: a precision object given in `plugins=` is the precision (as in Lightning)."""
    plugin = values["plugins"]
    if plugin is not None:
        if precision_given not in (None, "32-true", 32, "32", plugin.name):  # the default stands for "not given"
            raise ConfigError(f"precision={precision_given!r} conflicts with the {plugin.name!r} precision plugin "
                              "in plugins=; pass only one of them.")
        values["precision"] = plugin.name
    return str(values["precision"])


def _given(given: dict[str, Any], flag: Flag) -> Any:
    value = given.get(flag.name, flag.default)
    return flag.resolved_default if value is None and flag.name in NONE_MEANS_DEFAULT else value


def _resolve_hardware(accelerator: Any, devices: Any, gpus: Any,
                      hardware: Hardware | None) -> tuple[str, list[torch.device]]:
    """`gpus=N` is an alias of `accelerator="gpu", devices=N`; the rest is resolved against the hardware, which is
    detected (`hardware=None`) only when the answer depends on it: `accelerator="cpu"` needs no CUDA probe (one
    that can take a while on a machine with GPUs)."""
    if gpus is not None:
        if accelerator not in ("auto", "gpu", "cuda"):
            raise ConfigError(
                f"gpus={gpus!r} conflicts with accelerator={accelerator!r}; gpus=N means accelerator='gpu'."
            )
        if devices != "auto":
            raise ConfigError(
                f"gpus={gpus!r} and devices={devices!r} were both given; gpus=N is an alias of devices=N."
            )
        accelerator, devices = "gpu", gpus
    if hardware is None:
        cpu = isinstance(accelerator, str) and accelerator.lower() == "cpu"
        hardware = _NO_ACCELERATOR if cpu else Hardware.detect()  # CPU devices are resolved without the counts
    device_type = resolve_accelerator(accelerator, hardware)
    return device_type, resolve_devices(device_type, devices, hardware)
