"""`Trainer(barebones=True)`: Lightning's mode for measuring the Trainer's own overhead. Everything that may cost
speed is off (checkpointing, loggers, the progress bar, the model summary, step logging, the sanity check), and
asking for one of those, or for a debugging aid (fast_dev_run, detect_anomaly, a profiler), together with it is an
error naming the flag, as in Lightning 2.x. `self.log` under it warns and records nothing (Lightning's rule)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strategies.comm.distributed import rank_zero_info
from strategies.exceptions import ConfigError
from trainer.setup.loaded_classes import instances_of


def _truthy(value: Any) -> bool:
    return bool(value)


def _set(value: Any) -> bool:
    return value is not None and value is not False and not (isinstance(value, int) and value == 0)


# flag -> (what asks for it, the value barebones gives it or _KEEP, why it is off): Lightning 2.x's list and rules
_KEEP = object()
_RULES: dict[str, tuple[Callable[[Any], bool], Any, str]] = {
    "enable_checkpointing": (_truthy, False, "Checkpointing can impact raw speed"),
    "logger": (lambda v: v is not None and v is not False, False, "Logging can impact raw speed"),
    "enable_progress_bar": (_truthy, False, "The progress bar can impact raw speed"),
    "log_every_n_steps": (_set, 0, "Logging can impact raw speed"),
    "enable_model_summary": (_truthy, False, "Model summary can impact raw speed"),
    "num_sanity_val_steps": (_set, 0, "Sanity checking can impact raw speed"),
    "fast_dev_run": (_set, _KEEP, "Development run is not meant for raw speed evaluation"),
    "detect_anomaly": (_truthy, _KEEP, "Anomaly detection can impact raw speed"),
    "profiler": (lambda v: v is not None, _KEEP, "Profiling can impact raw speed"),
}

NOTICE = ("You are running in `Trainer(barebones=True)` mode: checkpointing, the progress bar, the model summary, "
          "logging (the logger, log_every_n_steps, self.log and self.log_dict), the sanity check, fast_dev_run, "
          "detect_anomaly and the profiler are off, so that what remains is the Trainer's own overhead.")
STARTED = ("`Trainer(barebones=True)` started running; the progress bar is off, so print the progress yourself if you "
           "need to see it.")


def announce_start(barebones: bool) -> None:
    """At each run's start under barebones, as Lightning: nothing shows progress, so say that it runs."""
    if barebones:
        rank_zero_info(STARTED)


def apply_barebones(given: dict[str, Any]) -> dict[str, Any]:
    """The Trainer's arguments with barebones' settings in force; unchanged when `barebones` is not True.

    Raises:
        ConfigError: a flag barebones switches off or refuses was asked for (the message names it).
    """
    if given.get("barebones") is not True:
        return given
    out = dict(given)
    for name, (asks_for, off, why) in _RULES.items():
        if asks_for(given.get(name)):
            raise ConfigError(
                f"`Trainer(barebones=True, {name}={given.get(name)!r})` was passed. {why}, so it is disabled in "
                "barebones mode; drop one of the two."
            )
        if off is not _KEEP:
            out[name] = off
    _refuse_progress_bar(given.get("callbacks"))
    rank_zero_info(NOTICE)
    return out


def _refuse_progress_bar(callbacks: Any) -> None:
    given = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
    bars = instances_of(given, "callbacks.progress", "ProgressBar")
    if bars:
        raise ConfigError(
            f"`Trainer(barebones=True)` turns the progress bar off, but {type(bars[0]).__name__} is in callbacks; "
            "drop it, or drop barebones=True."
        )
