"""ModelCheckpoint's rules as pure functions: a `filename` template filled with the logged metrics (Lightning's rules:
fields `{name}` or `{name:spec}`, `name=` inserted before each field unless asked not to, a missing metric reads 0),
the folder as a string, and the checks of the constructor's arguments."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_io.filesystem import is_remote, to_path
from strategies.exceptions import ConfigError

# a field: `{` + a metric name (anything but braces and the spec colon) + an optional `:spec` + `}`
_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


def fill_template(template: str, metrics: dict[str, Any], insert_names: bool, equals: str = "=") -> str:
    """`template` with each `{name:spec}` replaced by the metric formatted with `spec` (a 0-d tensor formats as its
    number), preceded by `name=` when `insert_names`. A `/` inside a filled field becomes `_`, so a metric called
    `val/loss` does not turn into a sub-folder."""

    def fill(match: re.Match[str]) -> str:
        key, spec = match.group(1), (match.group(2) or ":")[1:]
        value = metrics.get(key)
        text = format(torch.tensor(0) if value is None else value, spec)
        return (f"{key}{equals}{text}" if insert_names else text).replace("/", "_")

    return _FIELD.sub(fill, template)


def resolve_dirpath(dirpath: str | Path | None) -> str | None:
    """The folder as Lightning keeps it: a string, `~` expanded and made absolute for a local path; a URL as given
    (its protocol checked now, so a typo fails at construction)."""
    if dirpath is None or dirpath == "":
        return None
    if is_remote(dirpath):
        return str(to_path(dirpath))
    text = os.fspath(dirpath)  # not through Path, which turns "./~/x" into "~/x"
    if text.startswith(("file://", "local://")):
        text = text.split("://", 1)[1]
    return os.path.realpath(os.path.expanduser(text))


def check_options(save_last: Any, mode: str, save_top_k: int, monitor: str | None, every_n_train_steps: int,
                   every_n_epochs: int, train_time_interval: timedelta | None) -> None:
    """Refuse what Lightning refuses, naming the value and the fix: an unknown `save_last` or `mode`, `save_top_k`
    below -1, a negative cadence, two cadences at once, a top-k above 1 without `monitor`."""
    if save_last not in (None, True, False, "link"):
        raise ConfigError(f"ModelCheckpoint(save_last={save_last!r}) is not valid: use True, False, None or 'link'.")
    if mode not in ("min", "max"):
        raise ConfigError(f"ModelCheckpoint(mode={mode!r}): `mode` can be 'min' or 'max' but got {mode}.")
    if save_top_k < -1:
        raise ConfigError(f"ModelCheckpoint: invalid value for save_top_k={save_top_k}. Must be >= -1 (-1 keeps "
                          "every checkpoint, 0 none, k the best k).")
    for flag, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
        if value < 0:
            raise ConfigError(f"ModelCheckpoint: invalid value for {flag}={value}. Must be >= 0 (0 turns it off).")
    if (every_n_train_steps >= 1) + (every_n_epochs >= 1) + (train_time_interval is not None) > 1:
        raise ConfigError(
            f"ModelCheckpoint: Combination of parameters every_n_train_steps={every_n_train_steps}, every_n_epochs="
            f"{every_n_epochs} and train_time_interval={train_time_interval} should be mutually exclusive: pass one.")
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise ConfigError(f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration: "
                          "top-k needs a quantity to rank by; pass monitor= or save_top_k in (-1, 0, 1).")
