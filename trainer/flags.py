"""Trainer flags → a frozen RunSpec. A pure function: no process groups, no I/O.

All validation of flag values happens here, at `Trainer(...)` time, so a bad flag fails before any
work starts, with a message naming the flag and the accepted values.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from strategies.base import Strategy
from strategies.devices import Hardware, resolve_accelerator, resolve_devices
from strategies.exceptions import ConfigError
from strategies.filesystem import AnyPath, to_path
from strategies.precision import canonical_precision, precision_from_flag
from strategies.registry import STRATEGY_REGISTRY

DEFAULT_MAX_EPOCHS = 1000  # Lightning's default when neither max_epochs nor max_steps is given


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
    max_steps: int  # -1: no step limit
    max_time: timedelta | None
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int  # -1: all
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: str
    log_every_n_steps: int
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


# The kind of each flag whose type a wrong value would otherwise slip past: a bool flag takes True or False only
# (bool('false') is True, so a string from a config file or a command line would silently mean the opposite);
# a path flag takes a str or os.PathLike (or None). Checked first, before any value is used.
_BOOL = "bool"
_PATH = "path"
_FLAG_KINDS: dict[str, str] = {
    "enable_checkpointing": _BOOL, "enable_progress_bar": _BOOL, "enable_model_summary": _BOOL,
    "use_distributed_sampler": _BOOL, "detect_anomaly": _BOOL, "terminate_on_nan": _BOOL,
    "checkpoint_on_interrupt": _BOOL,
    "default_root_dir": _PATH,
}


def _check_kinds(flags: dict[str, Any]) -> None:
    """Refuse a value of the wrong kind for every flag in the table, naming the flag and the fix."""
    for name, kind in _FLAG_KINDS.items():
        value = flags[name]
        if kind == _BOOL and not isinstance(value, bool):
            hint = (" A string is not a bool (bool('false') is True): pass the Python value, or write true/false "
                    "unquoted in a YAML config.") if isinstance(value, str) else ""
            raise ConfigError(f"{name}={value!r} is not valid: use True or False.{hint}")
        if kind == _PATH and value is not None and not isinstance(value, (str, os.PathLike)):
            raise ConfigError(
                f"{name}={value!r} is not valid: use a path (a str or pathlib.Path, or an fsspec URL such as "
                f"'s3://bucket/run'), or None for the current directory; got {type(value).__name__}."
            )


def _check_int(name: str, value: Any, minimum: int, extra: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r} is not valid: it must be an int >= {minimum}{extra}.")
    return value


def _check_limit(name: str, value: Any) -> int | float:
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not valid: use a float in [0.0, 1.0] or an int >= 0.")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value} is not valid: an int must be >= 0 (a number of batches).")
        return value
    if isinstance(value, float):
        if not 0.0 <= value <= 1.0:
            raise ConfigError(
                f"{name}={value} is not valid: a float must be in [0.0, 1.0] (a fraction of the batches); "
                "pass an int for a number of batches."
            )
        return value
    raise ConfigError(f"{name}={value!r} is not valid: use a float in [0.0, 1.0] or an int >= 0.")


_TIME_PATTERN = re.compile(r"^(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})$")


def parse_max_time(value: Any) -> timedelta | None:
    """Accept None, a timedelta, a dict of timedelta kwargs, or "DD:HH:MM:SS"."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value
    if isinstance(value, dict):
        try:
            return timedelta(**value)
        except TypeError as err:
            raise ConfigError(f"max_time={value!r} is not valid: {err}") from None
    if isinstance(value, str) and (m := _TIME_PATTERN.match(value.strip())):
        days, hours, minutes, seconds = (int(g) for g in m.groups())
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    raise ConfigError(
        f"max_time={value!r} is not valid: use 'DD:HH:MM:SS', a datetime.timedelta, or a dict like {{'hours': 2}}."
    )


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


def parse_flags(  # noqa: C901  # one check per flag until the single flag table (issue 19) replaces it
    *,
    accelerator: str = "auto",
    devices: Any = "auto",
    gpus: Any = None,
    num_nodes: int = 1,
    strategy: Any = "auto",
    precision: Any = "32-true",
    max_epochs: int | None = None,
    min_epochs: int | None = None,
    max_steps: int = -1,
    max_time: Any = None,
    limit_train_batches: int | float = 1.0,
    limit_val_batches: int | float = 1.0,
    limit_test_batches: int | float = 1.0,
    limit_predict_batches: int | float = 1.0,
    val_check_interval: int | float = 1.0,
    check_val_every_n_epoch: int | None = 1,
    num_sanity_val_steps: int = 2,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: str = "norm",
    log_every_n_steps: int = 50,
    default_root_dir: str | Path | None = None,
    deterministic: bool | str = False,
    fast_dev_run: bool | int = False,
    enable_checkpointing: bool = True,
    enable_progress_bar: bool = True,
    enable_model_summary: bool = True,
    use_distributed_sampler: bool = True,
    detect_anomaly: bool = False,
    terminate_on_nan: bool = False,
    agree_every_n_steps: int = 1,
    checkpoint_on_interrupt: bool = False,
    hardware: Hardware | None = None,
) -> RunSpec:
    """Validate and resolve Trainer flags. Raises ConfigError naming the flag and accepted values.

    `hardware` defaults to what this machine has; tests pass another to resolve, say, 4 nodes of
    8 GPUs on a CPU-only machine without starting anything.
    """
    _check_kinds(locals())
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
    hardware = hardware or Hardware.detect()
    device_type = resolve_accelerator(accelerator, hardware)
    device_list = resolve_devices(device_type, devices, hardware)
    _check_int("num_nodes", num_nodes, 1)
    canonical = canonical_precision(precision)

    dev_run = int(fast_dev_run) if isinstance(fast_dev_run, bool) else _check_int(
        "fast_dev_run", fast_dev_run, 0, " (or a bool)"
    )
    if max_epochs is None:
        max_epochs = DEFAULT_MAX_EPOCHS if max_steps == -1 and max_time is None else -1
    _check_int("max_epochs", max_epochs, -1, " (-1 means no limit)")
    min_epochs = _check_int("min_epochs", 0 if min_epochs is None else min_epochs, 0)
    _check_int("max_steps", max_steps, -1, " (-1 means no limit)")
    limits = [_check_limit(n, v) for n, v in (
        ("limit_train_batches", limit_train_batches), ("limit_val_batches", limit_val_batches),
        ("limit_test_batches", limit_test_batches), ("limit_predict_batches", limit_predict_batches))]
    if isinstance(val_check_interval, bool) or not isinstance(val_check_interval, (int, float)) or (
        isinstance(val_check_interval, float) and not 0.0 < val_check_interval <= 1.0
    ) or (isinstance(val_check_interval, int) and val_check_interval < 1):
        raise ConfigError(
            f"val_check_interval={val_check_interval!r} is not valid: use a float in (0.0, 1.0] (fraction of an "
            "epoch) or an int >= 1 (every N training batches)."
        )
    if check_val_every_n_epoch is not None:
        _check_int("check_val_every_n_epoch", check_val_every_n_epoch, 1, " or None")
    _check_int("num_sanity_val_steps", num_sanity_val_steps, -1, " (-1 runs all validation batches)")
    _check_int("accumulate_grad_batches", accumulate_grad_batches, 1)
    if gradient_clip_val is not None and (
        isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, (int, float))
        or not math.isfinite(gradient_clip_val) or gradient_clip_val < 0
    ):
        raise ConfigError(f"gradient_clip_val={gradient_clip_val!r} is not valid: use None or a number >= 0.")
    if gradient_clip_algorithm not in ("norm", "value"):
        raise ConfigError(f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not valid: use 'norm' or 'value'.")
    _check_int("log_every_n_steps", log_every_n_steps, 1)
    _check_int("agree_every_n_steps", agree_every_n_steps, 1)
    if deterministic not in (True, False, "warn"):
        raise ConfigError(f"deterministic={deterministic!r} is not valid: use True, False or 'warn'.")

    if dev_run:
        max_epochs, max_steps, num_sanity_val_steps = 1, dev_run, 0
        limits = [dev_run] * 4
        val_check_interval, check_val_every_n_epoch = 1.0, 1

    strategy_obj = _resolve_strategy(strategy, device_list, num_nodes, canonical)
    _check_strategy_precision(strategy_obj, canonical)
    return RunSpec(
        device_type=device_type, devices=tuple(device_list), num_nodes=num_nodes, strategy=strategy_obj,
        precision=canonical, max_epochs=max_epochs, min_epochs=min_epochs, max_steps=max_steps,
        max_time=parse_max_time(max_time), limit_train_batches=limits[0], limit_val_batches=limits[1],
        limit_test_batches=limits[2], limit_predict_batches=limits[3], val_check_interval=val_check_interval,
        check_val_every_n_epoch=check_val_every_n_epoch, num_sanity_val_steps=num_sanity_val_steps,
        accumulate_grad_batches=accumulate_grad_batches,
        gradient_clip_val=None if gradient_clip_val is None else float(gradient_clip_val),
        gradient_clip_algorithm=gradient_clip_algorithm, log_every_n_steps=log_every_n_steps,
        default_root_dir=to_path(default_root_dir) if default_root_dir is not None else Path.cwd(),
        deterministic=deterministic, fast_dev_run=dev_run,
        enable_checkpointing=enable_checkpointing and not dev_run,
        enable_progress_bar=enable_progress_bar, enable_model_summary=enable_model_summary,
        use_distributed_sampler=use_distributed_sampler, detect_anomaly=detect_anomaly,
        terminate_on_nan=terminate_on_nan, agree_every_n_steps=agree_every_n_steps,
        checkpoint_on_interrupt=checkpoint_on_interrupt,
    )
