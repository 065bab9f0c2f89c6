"""Profilers for `Trainer(profiler=...)`: Lightning's `lightning.pytorch.profilers` names (see base.py)."""

from __future__ import annotations

from typing import Any

from strategies.exceptions import ConfigError
from strategies.from_lightning import package_lookups
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


# Lightning's names (docs/from-lightning.md): resolved on first use, or an error naming what to use instead
__getattr__, __dir__ = package_lookups(__name__, "trainer.from_lightning")
