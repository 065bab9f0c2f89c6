"""DataParallel: one process drives every local GPU with `torch.nn.DataParallel` (threads, one replica each).

Kept for single-machine convenience; DDP is faster and is what we recommend. DP needs CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from strategies.base import Strategy
from strategies.exceptions import ConfigError
from strategies.model.step_router import StepRouter
from strategies.precision import Precision


def _mean_over_replicas(value: Any) -> Any:
    """DataParallel gathers one loss per replica into a vector; the step's loss is their mean."""
    if isinstance(value, Tensor) and value.ndim == 1 and value.is_floating_point():
        return value.mean()
    if isinstance(value, Mapping) and "loss" in value:
        return {**value, "loss": _mean_over_replicas(value["loss"])}
    return value


class DataParallelStrategy(Strategy):
    """`strategy="dp"`: scatter each batch over the local GPUs, average the per-replica losses.

    One process and one thread per GPU; the replicas are re-broadcast every step, so DDP is faster.
    No distributed sampler is injected: each batch is split along its first dimension.

    Args:
        devices: the CUDA devices to use; None means `cuda:0`.
        precision: the Precision object; full fp32 when None.

    Raises:
        ConfigError: without CUDA (use `strategy="ddp", accelerator="cpu"` on CPU), or with non-CUDA devices.
    """

    def __init__(self, devices: list[torch.device] | None = None, precision: Precision | None = None,
                 activation_checkpointing: Sequence[type[nn.Module]] | None = None) -> None:
        super().__init__(precision, activation_checkpointing)
        if not torch.cuda.is_available():
            raise ConfigError(
                "strategy='dp' (torch.nn.DataParallel) needs CUDA GPUs, and none is available. "
                "On CPU, use strategy='ddp' with accelerator='cpu', devices=N."
            )
        self.parallel_devices = list(devices) if devices else [torch.device("cuda", 0)]
        if any(d.type != "cuda" for d in self.parallel_devices):
            raise ConfigError("strategy='dp' runs on CUDA devices only; use accelerator='gpu'.")

    @classmethod
    def register(cls, registry: Any) -> None:
        registry.register("dp", cls, description="torch.nn.DataParallel over the local GPUs")

    @classmethod
    def from_flags(cls, devices: list[torch.device], num_nodes: int, precision: Precision,
                   **kwargs: Any) -> DataParallelStrategy:
        if num_nodes != 1:
            raise ConfigError("strategy='dp' runs on one machine; for num_nodes > 1 use strategy='ddp'.")
        return cls(devices=devices, precision=precision)

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[0]

    def _wrap(self, router: StepRouter) -> nn.Module:
        return nn.DataParallel(router, device_ids=[d.index for d in self.parallel_devices])

    def compile_module(self, compiler: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        # DataParallel copies the module into one replica per GPU each step: a forward compiled on the module
        # would stay bound to the first GPU's copy.
        raise ConfigError("A torch.compile'd module cannot train with strategy='dp' (DataParallel replicates the "
                          "module every step); use strategy='ddp', or pass the module uncompiled.")

    def batch_to_device(self, batch: Any, move: Callable[[Any, torch.device], Any] | None = None) -> Any:
        """Leave the batch where it is: DataParallel scatters it to the GPUs itself. A `move` given (the
        module's own `transfer_batch_to_device`) still runs, to the first GPU, as in a one-device run."""
        if move is not None:
            batch = move(batch, self.root_device)
        return self.precision.convert_input(batch)  # DataParallel scatters the batch itself

    def step(self, method: str, *args: Any) -> Any:
        return _mean_over_replicas(super().step(method, *args))
