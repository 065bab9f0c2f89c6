"""Strategy names → classes. Each class registers its own names (Fabric-style `register`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from strategies.base import Strategy
from strategies.exceptions import ConfigError
from strategies.precision import Precision


@dataclass(frozen=True)
class _Entry:
    cls: type[Strategy]
    kwargs: dict[str, Any]
    description: str


class StrategyRegistry:
    """Maps a strategy name to the class and fixed kwargs that build it."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def register(self, name: str, cls: type[Strategy], description: str = "", **kwargs: Any) -> None:
        if name in self._entries:
            raise ValueError(f"strategy name {name!r} is already registered")
        self._entries[name] = _Entry(cls, kwargs, description)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def create(
        self, name: str, devices: list[torch.device], num_nodes: int, precision: Precision
    ) -> Strategy:
        """Build the named strategy for the resolved devices, or raise ConfigError listing the valid names."""
        if name not in self._entries:
            valid = ", ".join(repr(n) for n in ["auto", *self.names()])
            raise ConfigError(
                f"strategy={name!r} is not a known strategy. Accepted values: {valid}, or a Strategy instance."
            )
        entry = self._entries[name]
        return entry.cls.from_flags(devices=devices, num_nodes=num_nodes, precision=precision, **entry.kwargs)


def _build_default_registry() -> StrategyRegistry:
    from strategies.ddp import DDPStrategy
    from strategies.dp import DataParallelStrategy
    from strategies.model_parallel import ModelParallelStrategy
    from strategies.single_device import SingleDeviceStrategy
    from strategies.zero import ZeroStrategy

    registry = StrategyRegistry()
    for cls in (SingleDeviceStrategy, DDPStrategy, DataParallelStrategy, ZeroStrategy, ModelParallelStrategy):
        cls.register(registry)
    return registry


STRATEGY_REGISTRY = _build_default_registry()
