"""One check per kind of Trainer flag value: each takes (name, value), returns the value to keep, or raises a
ConfigError naming the flag and the accepted values. The flag table in flags.py picks one for each flag."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from strategies.durations import parse_duration
from strategies.exceptions import ConfigError

Check = Callable[[str, Any], Any]


def as_given(name: str, value: Any) -> Any:
    """For flags resolved together with others (devices, strategy, precision): checked where they are resolved."""
    return value


def boolean(name: str, value: Any) -> bool:
    """True or False only: bool('false') is True, so a string from a config or a command line would mean the
    opposite of what was written."""
    if not isinstance(value, bool):
        hint = (" A string is not a bool (bool('false') is True): pass the Python value, or write true/false "
                "unquoted in a YAML config.") if isinstance(value, str) else ""
        raise ConfigError(f"{name}={value!r} is not valid: use True or False.{hint}")
    return value


def optional_boolean(name: str, value: Any) -> bool | None:
    """True, False, or None (leave the setting as it is)."""
    return None if value is None else boolean(name, value)


def optional_path(name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise ConfigError(
            f"{name}={value!r} is not valid: use a path (a str or pathlib.Path, or an fsspec URL such as "
            f"'s3://bucket/run'), or None for the current directory; got {type(value).__name__}."
        )
    return value


def check_int(name: str, value: Any, minimum: int, extra: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r} is not valid: it must be an int >= {minimum}{extra}.")
    return value


def int_at_least(minimum: int, extra: str = "", allow_none: bool = False) -> Check:
    """An int >= minimum (or None when `allow_none`)."""
    def check(name: str, value: Any) -> Any:
        return value if allow_none and value is None else check_int(name, value, minimum, extra)
    return check


def batch_limit(name: str, value: Any) -> int | float:
    """An int number of batches, or a float fraction of them."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not valid: use a float in [0.0, 1.0] or an int >= 0.")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value} is not valid: an int must be >= 0 (a number of batches).")
        return value
    if isinstance(value, float):
        if value > 1.0 and value.is_integer():  # Lightning's rule: 2.0 or 1e50 mean a number of batches
            return int(value)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(
                f"{name}={value} is not valid: a float must be in [0.0, 1.0] (a fraction of the batches); "
                "pass an int for a number of batches."
            )
        return value
    raise ConfigError(f"{name}={value!r} is not valid: use a float in [0.0, 1.0] or an int >= 0.")


def plugins(name: str, value: Any) -> Any:
    """Lightning's `plugins=`: one plugin or a list. A precision object (strategies.Precision) is taken; the other
    kinds of Lightning plugin have no object here, and each is refused naming what takes its place."""
    from strategies.precision import Precision

    given = [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
    precisions = [p for p in given if isinstance(p, Precision)]
    others = [p for p in given if not isinstance(p, Precision)]
    if others:
        raise ConfigError(
            f"{name}={others!r}: only a precision plugin (a strategies.Precision such as MixedPrecision) is taken "
            "here. The cluster environment is read from the environment (torchrun, SLURM, MASTER_ADDR ...), "
            "checkpoints are written by the strategy (atomic, loaded weights-only), and sync_batchnorm=True converts "
            "BatchNorm layers; remove the plugin."
        )
    if len(precisions) > 1:
        raise ConfigError(f"{name}= holds {len(precisions)} precision plugins; pass one.")
    return precisions[0] if precisions else None


def check_interval(name: str, value: Any) -> int | float | timedelta:
    """A float in (0, 1] (a fraction of an epoch), an int >= 1 (every N training batches), or a wall-clock time as
    Lightning takes it: a timedelta, a dict of its keyword arguments, or "DD:HH:MM:SS"."""
    if isinstance(value, (str, dict, timedelta)):
        interval = parse_duration(value, name)
        if interval is None or interval.total_seconds() < 0:
            raise ConfigError(f"{name}={value!r} is not valid: a time interval cannot be negative.")
        return interval
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and not 0.0 < value <= 1.0
    ) or (isinstance(value, int) and value < 1):
        raise ConfigError(
            f"{name}={value!r} is not valid: use a float in (0.0, 1.0] (fraction of an epoch) or an int >= 1 "
            "(every N training batches), or a time: 'DD:HH:MM:SS', a datetime.timedelta or a dict like "
            "{'minutes': 30}."
        )
    return value


def clip_value(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}={value!r} is not valid: use None or a number >= 0.")
    return float(value)


def one_of(*choices: Any) -> Check:
    """One of a few fixed values (compared with ==, so True and 1 are the same choice)."""
    def check(name: str, value: Any) -> Any:
        # a container is never one of the choices: refused before `in`, whatever its items compare equal to
        if isinstance(value, (list, dict, set)) or value not in choices:
            raise ConfigError(f"{name}={value!r} is not valid: use {_choice_list(choices)}.")
        return value
    return check


def _choice_list(choices: tuple[Any, ...]) -> str:
    shown = [repr(c) for c in choices]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


def fast_dev_run(name: str, value: Any) -> int:
    """True means 1 batch of each kind; an int N means N batches; False or 0 switches it off."""
    return int(value) if isinstance(value, bool) else check_int(name, value, 0, " (or a bool)")


def parse_max_time(value: Any) -> timedelta | None:
    """Accept None, a timedelta, a dict of timedelta kwargs, or "DD:HH:MM:SS" (strategies/durations.py)."""
    return parse_duration(value, "max_time")


def max_time(name: str, value: Any) -> timedelta | None:
    """The flag table's check for `max_time` (a check takes the flag's name; parse_max_time does not need it)."""
    return parse_max_time(value)


def model_registry(name: str, value: Any) -> None:
    """Lightning 2.6's `model_registry` (Lightning AI's model registry, through `litmodels`): not here."""
    if value is not None:
        raise ConfigError(f"{name}={value!r}: there is no model registry here; checkpoints go where ModelCheckpoint "
                          "(dirpath, fsspec URLs included) puts them. Remove the flag.")
