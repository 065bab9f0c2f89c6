"""DDP: one process per device, `torch.nn.parallel.DistributedDataParallel` around the step router.

The ranks, the process group and the failure handling come from `ParallelStrategy` (strategies/parallel.py);
this file owns only what DDP does differently: the wrapper, its `no_sync`, and manual backward inside forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from strategies.base import NULL_CONTEXT
from strategies.model.step_router import StepRouter
from strategies.parallel import ParallelStrategy, default_backend
from strategies.precision import Precision

__all__ = ["DDPStrategy", "default_backend"]


class DDPStrategy(ParallelStrategy):
    """Data-parallel training over `len(devices) x num_nodes` processes with torch's DDP.

    `strategy="ddp"` and `"ddp_spawn"` build this class; pass an instance for its options. Under torchrun or
    SLURM the ranks join the launcher's world; otherwise rank 0 starts the other local ranks (see
    docs/distributed.md). A DistributedSampler is injected into plain DataLoaders.

    Args:
        devices: this machine's devices, one process each; None takes the Trainer's `devices`.
        num_nodes: the number of machines (an instance built without `devices` takes the Trainer's devices
            and num_nodes).
        precision: the Precision object; full fp32 when None.
        process_group_backend: `"nccl"` (default for CUDA), `"gloo"` (default for CPU) or `"mpi"`.
        timeout: how long every collective waits for a missing rank (a `timedelta` or seconds). None (the default):
            the hang bound follows the run, see `min_timeout` and docs/reliability.md.
        start_method: `"subprocess"` re-runs the script per extra rank (`"ddp"`); `"spawn"` uses
            torch.multiprocessing (`"ddp_spawn"`); `"fork"` forks.
        find_unused_parameters: passed to DistributedDataParallel.
        static_graph: passed to DistributedDataParallel.
        min_timeout: with `timeout=None`, collectives in training batches wait at most
            max(min_timeout, timeout_steps x the measured batch time); torch's default elsewhere. Default 120 s.
        timeout_steps: see `min_timeout`; default 20.
        activation_checkpointing: module classes whose forward is recomputed in backward (see Strategy).
        **ddp_kwargs: further DistributedDataParallel options (e.g. `gradient_as_bucket_view=True`).

    Raises:
        ConfigError: an unknown backend or start method, `"nccl"` without CUDA, or `"mpi"` without MPI.

    Example:
        ```python
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(minutes=30))
        trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy)
        ```
    """

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        num_nodes: int = 1,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = None,
        start_method: str = "subprocess",
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        min_timeout: timedelta | float | None = None,
        timeout_steps: int | None = None,
        activation_checkpointing: Sequence[type[torch.nn.Module]] | None = None,
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(devices, num_nodes, precision, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method, min_timeout=min_timeout,
                         timeout_steps=timeout_steps, activation_checkpointing=activation_checkpointing)
        self._ddp_kwargs = {"find_unused_parameters": find_unused_parameters, "static_graph": static_graph,
                            **ddp_kwargs}
        self._ddp: DistributedDataParallel | None = None
        self._trainable_when_wrapped: tuple[bool, ...] = ()

    @classmethod
    def register(cls, registry: Any) -> None:
        registry.register("ddp", cls, description="DDP, ranks started by re-running the script")
        registry.register("ddp_spawn", cls, description="DDP, ranks started by torch.multiprocessing",
                          start_method="spawn")

    def _wrap(self, router: StepRouter) -> torch.nn.Module:
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        self._ddp = DistributedDataParallel(router, device_ids=device_ids, **self._ddp_kwargs)
        self._trainable_when_wrapped = _trainable(router)
        return self._ddp

    def sync_trainable_parameters(self) -> None:
        """DDP builds its gradient reducer from the parameters that require grad when it wraps the module: a parameter
        unfrozen later (fine-tuning) would be trained on each rank's own gradient, and the ranks would drift apart
        without an error. When that set has changed, wrap again (a collective: every rank changes it alike)."""
        router = self._wrapped.module
        if _trainable(router) != self._trainable_when_wrapped:
            self._model = self._step = self._wrap(router)

    @property
    def _wrapped(self) -> DistributedDataParallel:
        if self._ddp is None:
            raise RuntimeError("DDPStrategy.setup_module() has not run yet.")
        return self._ddp

    # --- the step -----------------------------------------------------------------------------
    def manual_step_context(self) -> AbstractContextManager:
        # DDP would prepare its gradient sync after forward returns, i.e. after the user's manual_backward already
        # ran inside it, leaving the reducer waiting for a backward that never comes. manual_backward prepares it.
        return self._wrapped.no_sync()

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        ddp = self._wrapped
        if torch.is_grad_enabled():
            ddp.require_forward_param_sync = True
            ddp.reducer.prepare_for_backward(list(_find_tensors(loss)) if ddp.find_unused_parameters else [])
        self.backward(loss, *args, **kwargs)

    def no_backward_sync(self, enabled: bool) -> AbstractContextManager:
        return self._wrapped.no_sync() if enabled else NULL_CONTEXT

    def __repr__(self) -> str:
        return (f"DDPStrategy(devices={len(self.parallel_devices)}, num_nodes={self.num_nodes}, "
                f"backend={self.process_group_backend!r}, start_method={self.start_method!r})")


def _trainable(module: torch.nn.Module) -> tuple[bool, ...]:
    return tuple(param.requires_grad for param in module.parameters())
