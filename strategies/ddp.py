"""DDP: one process per device, `torch.nn.parallel.DistributedDataParallel` around the step router.

The ranks, the process group and the failure handling come from `ParallelStrategy` (strategies/parallel.py);
this file owns only what DDP does differently: the wrapper, its `no_sync`, and manual backward inside forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from strategies.base import NULL_CONTEXT
from strategies.exceptions import ConfigError
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
        accelerator: Lightning's: "cpu", "gpu"/"cuda", "mps" or an accelerator object; checked against the
            Trainer's devices (the Trainer's `accelerator=` picks them), a mismatch is a ConfigError.
        parallel_devices: Lightning's name for `devices`.
        ddp_comm_state: the state given to `ddp_comm_hook`.
        ddp_comm_hook: a DDP communication hook, registered on the wrapped model with
            `register_comm_hook(ddp_comm_state, hook)`.
        ddp_comm_wrapper: wraps the hook first (`ddp_comm_wrapper(ddp_comm_hook)`), e.g. to compress in fp16.
        **ddp_kwargs: further DistributedDataParallel options (e.g. `gradient_as_bucket_view=True`); a name
            DistributedDataParallel does not take is a ConfigError here, not a TypeError on every rank later.

    Raises:
        ConfigError: an unknown backend or start method, `"nccl"` without CUDA, `"mpi"` without MPI, an unknown
            keyword, a Lightning-only one (`cluster_environment`, `checkpoint_io`, `precision_plugin`,
            `model_averaging_period`), or an `accelerator` that is not the run's.

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
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        ddp_comm_state: Any = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        **ddp_kwargs: Any,
    ) -> None:
        _check_ddp_kwargs(ddp_kwargs)
        if parallel_devices is not None and devices is not None:
            raise ConfigError("DDPStrategy: pass devices= or Lightning's parallel_devices=, not both.")
        devices = devices if devices is not None else parallel_devices
        self._device_type = _device_type(accelerator)
        super().__init__(devices, num_nodes, precision, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method, min_timeout=min_timeout,
                         timeout_steps=timeout_steps, activation_checkpointing=activation_checkpointing)
        if devices is not None:
            self._check_device_type()
        self._ddp_kwargs = {"find_unused_parameters": find_unused_parameters, "static_graph": static_graph,
                            **ddp_kwargs}
        self._comm_hook = (ddp_comm_state, ddp_comm_wrapper(ddp_comm_hook) if ddp_comm_wrapper and ddp_comm_hook
                           else ddp_comm_hook)
        self._ddp: DistributedDataParallel | None = None
        self._trainable_when_wrapped: tuple[bool, ...] = ()

    def adopt_flags(self, devices: list[torch.device], num_nodes: int) -> None:
        super().adopt_flags(devices, num_nodes)
        self._check_device_type()

    def _check_device_type(self) -> None:
        found = self.parallel_devices[0].type
        if self._device_type is not None and self._device_type != found:
            raise ConfigError(f"DDPStrategy(accelerator={self._device_type!r}) but the run's devices are {found}: the "
                              f"Trainer's accelerator picks them. Pass Trainer(accelerator={self._device_type!r}), or "
                              "drop accelerator= from DDPStrategy.")

    @classmethod
    def register(cls, registry: Any) -> None:
        registry.register("ddp", cls, description="DDP, ranks started by re-running the script")
        registry.register("ddp_spawn", cls, description="DDP, ranks started by torch.multiprocessing",
                          start_method="spawn")
        for prefix, start_method in (("ddp", "subprocess"), ("ddp_spawn", "spawn")):  # Lightning's names
            for unused in (False, True):
                registry.register(f"{prefix}_find_unused_parameters_{str(unused).lower()}", cls,
                                  description=f"{prefix} with find_unused_parameters={unused}",
                                  start_method=start_method, find_unused_parameters=unused)

    def _wrap(self, router: StepRouter) -> torch.nn.Module:
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        self._ddp = DistributedDataParallel(router, device_ids=device_ids, **self._ddp_kwargs)
        state, hook = self._comm_hook
        if hook is not None:
            self._ddp.register_comm_hook(state, hook)
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


# Lightning's DDPStrategy arguments that mean nothing here, and what to do instead.
_LIGHTNING_ONLY = {
    "cluster_environment": "the cluster is detected from the environment (torchrun, SLURM, MASTER_ADDR/NODE_RANK)",
    "checkpoint_io": "the strategy writes checkpoints itself (atomic, verified; fsspec URLs as paths)",
    "precision_plugin": "pass Trainer(precision=...)",
    "model_averaging_period": "post-local SGD model averaging is not supported here",
}


def _check_ddp_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse at construction what DistributedDataParallel would refuse on every rank once the model is wrapped."""
    for name in kwargs.keys() & _LIGHTNING_ONLY.keys():
        raise ConfigError(f"DDPStrategy({name}=...) is Lightning's: {_LIGHTNING_ONLY[name]}. Drop it.")
    known = set(inspect.signature(DistributedDataParallel.__init__).parameters) - {"self", "module"}
    unknown = sorted(kwargs.keys() - known)
    if unknown:
        raise ConfigError(f"DDPStrategy got unknown keyword(s) {unknown}: neither DDPStrategy's arguments nor "
                          f"DistributedDataParallel's ({', '.join(sorted(known))}).")


def _device_type(accelerator: Any) -> str | None:
    """The device type Lightning's `accelerator=` names: a string ("cpu", "gpu", "cuda", "mps", "auto") or an
    accelerator object (`CUDAAccelerator()` is "cuda"); None when it names none."""
    if accelerator is None or accelerator == "auto":
        return None
    name = accelerator if type(accelerator) is str else type(accelerator).__name__.lower().replace("accelerator", "")
    kind = {"gpu": "cuda"}.get(name, name)
    if kind not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"DDPStrategy(accelerator={accelerator!r}): use 'cpu', 'gpu', 'cuda' or 'mps' (or leave it "
                          "out: the Trainer's accelerator= picks the devices).")
    return kind
