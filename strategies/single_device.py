"""One process, one device: the strategy behind `strategy="single"` and `"auto"` with one device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from strategies.base import Strategy
from strategies.exceptions import ConfigError
from strategies.precision import Precision


class SingleDeviceStrategy(Strategy):
    """Train on exactly one device with no wrapper; every collective is the identity.

    Args:
        device: the device, e.g. `"cpu"` or `"cuda:0"`.
        precision: the Precision object; full fp32 when None.
        activation_checkpointing: module classes whose forward is recomputed in backward (see Strategy).
    """

    def __init__(self, device: str | torch.device = "cpu", precision: Precision | None = None,
                 activation_checkpointing: Sequence[type[nn.Module]] | None = None) -> None:
        super().__init__(precision, activation_checkpointing)
        self._device = torch.device(device)

    @classmethod
    def register(cls, registry: Any) -> None:
        registry.register("single", cls, description="one device, no wrapper")

    @classmethod
    def from_flags(
        cls, devices: list[torch.device], num_nodes: int, precision: Precision, **kwargs: Any
    ) -> SingleDeviceStrategy:
        """Build from resolved Trainer flags; one device on one node only."""
        if len(devices) != 1 or num_nodes != 1:
            raise ConfigError(
                f"strategy='single' runs on exactly one device, but devices={len(devices)} and "
                f"num_nodes={num_nodes} were requested. Use devices=1, or a multi-device strategy."
            )
        return cls(devices[0], precision=precision, **kwargs)

    @property
    def root_device(self) -> torch.device:
        return self._device

    def __repr__(self) -> str:
        return f"SingleDeviceStrategy(device={self._device}, precision={self.precision.name!r})"
