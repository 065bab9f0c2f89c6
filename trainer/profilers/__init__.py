"""Profilers for `Trainer(profiler=...)`: Lightning's `lightning.pytorch.profilers` names (see base.py)."""

from __future__ import annotations

from typing import Any

from strategies.exceptions import ConfigError
from trainer.profilers.advanced import AdvancedProfiler
from trainer.profilers.base import PassThroughProfiler, Profiler
from trainer.profilers.pytorch import PyTorchProfiler
from trainer.profilers.simple import SimpleProfiler

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler",
           "build_profiler"]

_SHORTCUTS: dict[str, type[Profiler]] = {"simple": SimpleProfiler, "advanced": AdvancedProfiler,
                                         "pytorch": PyTorchProfiler}


def build_profiler(profiler: Any) -> Profiler:
    """`Trainer(profiler=...)`: None (no profiling), "simple" | "advanced" | "pytorch", or a Profiler."""
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, Profiler):
        return profiler
    if isinstance(profiler, str) and profiler.lower() in _SHORTCUTS:
        return _SHORTCUTS[profiler.lower()](filename="profile")
    raise ConfigError(f"profiler={profiler!r} is not valid: use None, 'simple', 'advanced', 'pytorch' or a "
                      "trainer.profilers.Profiler instance.")


def __getattr__(name: str) -> Any:
    """Lightning's names (trainer/from_lightning.py): resolved on first use, or an error naming what to use."""
    from strategies.from_lightning import resolve
    from trainer.from_lightning import TABLES

    value = resolve(__name__, TABLES[__name__], name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    from strategies.from_lightning import names_here
    from trainer.from_lightning import TABLES

    return sorted({*globals(), *names_here(TABLES[__name__])})
