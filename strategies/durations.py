"""Durations as Lightning's flags and callbacks take them (`max_time`, `Timer(duration=...)`): a
`datetime.timedelta`, a dict of its keyword arguments, or "DD:HH:MM:SS". Here, in the leaf package, so that the
Trainer's flag checks and the callbacks parse them with the same code."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from strategies.exceptions import ConfigError

_PATTERN = re.compile(r"^(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})$")


def parse_duration(value: Any, what: str) -> timedelta | None:
    """None, or the timedelta `value` stands for; `what` names the argument in the error (e.g. "max_time")."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value
    if isinstance(value, dict):
        try:
            return timedelta(**value)
        except TypeError as err:
            raise ConfigError(f"{what}={value!r} is not valid: {err}") from None
    if isinstance(value, str) and (m := _PATTERN.match(value.strip())):
        days, hours, minutes, seconds = (int(g) for g in m.groups())
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    raise ConfigError(
        f"{what}={value!r} is not valid: use a string in the format DD:HH:MM:SS ('00:12:00:00'), a "
        "datetime.timedelta, or a dict like {'hours': 2}."
    )
