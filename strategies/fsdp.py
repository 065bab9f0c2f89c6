"""FSDP2: parameters, gradients and optimizer state sharded across the ranks with torch's `fully_shard`.

The ranks and process group come from `ParallelStrategy`; this file owns the sharding units, FSDP2's gradient-sync
switch, DTensor-aware clipping and the checkpoint layout (full states in the standard layout by default, or every
rank's shards in a DCP folder with `sharded_checkpoint=True`, strategies/checkpoint_io/sharded/folder.py).
`strategy="zero2"` / `"zero3"` build it through `ZeroStrategy` (strategies/zero.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from strategies.base import NULL_CONTEXT, _StepRouter
from strategies.checkpoint_io.sharded.async_save import AsyncSaver
from strategies.checkpoint_io.sharded.folder import load_into, load_sharded, save_sharded
from strategies.checkpoint_io.sharded.manifest import ShardedRef, is_folder_checkpoint
from strategies.exceptions import ConfigError
from strategies.model import compiled, dtensor
from strategies.model.meta_init import MetaInit
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision

FSDP_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")  # 16-mixed's GradScaler is untested with FSDP2: refused


class FSDPStrategy(ParallelStrategy):
    """Fully sharded data parallel (FSDP2) over `len(devices) x num_nodes` processes.

    Each submodule that owns parameters becomes an FSDP2 unit, then the whole model; with `shard_modules` the
    units are the instances of those classes instead. The precision object supplies FSDP2's mixed-precision policy.

    Args:
        devices: this machine's devices, one process each; None takes the Trainer's.
        num_nodes: the number of machines.
        precision: the Precision object; 32-true, bf16-mixed and bf16-true are supported.
        reshard_after_forward: free each unit's gathered parameters after its forward (ZeRO-3) or keep them
            until backward (ZeRO-2).
        shard_modules: the module classes that become FSDP2 units.
        sharded_checkpoint: every rank writes its own shards into a checkpoint folder instead of rank 0 writing
            one full file; `"async"` also writes them in the background while training goes on (saves during a
            run; docs/checkpointing.md).
        offload: keep the parameter shards, their gradients and the optimizer state in host memory, and step the
            optimizer there (FSDP2's `CPUOffloadPolicy`); each unit's parameters are copied to the device for its
            forward and backward.
        activation_checkpointing: module classes whose forward is recomputed in backward (see Strategy).
        **parallel_kwargs: `process_group_backend`, `timeout`, `min_timeout`, `timeout_steps`, `start_method`
            as for DDPStrategy.

    Raises:
        ConfigError: an unsupported precision, or the errors of DDPStrategy's process options.
    """

    def __init__(self, devices: list[torch.device] | None = None, num_nodes: int = 1,
                 precision: Precision | None = None, *, reshard_after_forward: bool = True,
                 shard_modules: tuple[type[nn.Module], ...] = (), sharded_checkpoint: bool | str = False,
                 offload: bool = False, activation_checkpointing: Sequence[type[nn.Module]] | None = None,
                 process_group_backend: str | None = None, timeout: timedelta | float | None = None,
                 start_method: str = "subprocess", min_timeout: timedelta | float | None = None,
                 timeout_steps: int | None = None) -> None:
        super().__init__(devices, num_nodes, precision, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method, min_timeout=min_timeout,
                         timeout_steps=timeout_steps, activation_checkpointing=activation_checkpointing)
        self.offload = offload
        self.reshard_after_forward = reshard_after_forward
        self.shard_modules = tuple(shard_modules)
        if sharded_checkpoint not in (True, False, "async"):
            raise ConfigError(f"sharded_checkpoint={sharded_checkpoint!r} is not valid: use False, True or 'async'.")
        self.sharded_checkpoint = sharded_checkpoint
        self._saver = AsyncSaver() if sharded_checkpoint == "async" else None
        self._in_run = False  # async saves only inside a run: its end waits for them
        self._meta_init = MetaInit()
        name = self.precision.name
        if name not in self.supported_precisions():
            raise ConfigError(f"precision={name!r} is not supported by {self._label()}; it supports: "
                              f"{', '.join(self.supported_precisions())}.")

    def _label(self) -> str:
        """How errors name this strategy."""
        return type(self).__name__

    @property
    def evaluation_shards_even(self) -> bool:
        """FSDP2's forward gathers each unit's parameters: every rank joins every evaluation forward."""
        return True

    def supported_precisions(self) -> tuple[str, ...]:
        return FSDP_PRECISIONS

    # --- building and wrapping ----------------------------------------------------------------------
    def tensor_init_context(self, empty_init: bool | None = None) -> AbstractContextManager:
        """Layers built in `trainer.init_module()` or `configure_model()` go on the meta device (unless
        `empty_init=False`) and are materialised shard by shard after `fully_shard` (strategies/model/meta_init.py):
        the full model never exists on any rank, and the same seed gives the same weights at any world size."""
        if empty_init is False:
            return super().tensor_init_context(empty_init)
        stack = ExitStack()
        stack.enter_context(self._meta_init.capture(self.root_device, initialise=empty_init is None))
        stack.enter_context(self.precision.module_init_context())
        return stack

    def _to_device(self, module: nn.Module) -> nn.Module:
        # tensors still on 'meta' get storage after sharding, each rank only its shards
        return module._apply(lambda t: t if t.is_meta else t.to(self.root_device))

    def _wrap(self, router: _StepRouter) -> nn.Module:
        t = dtensor.torch_sharding()
        policy = self.precision.fsdp_policy()
        # An explicit mesh on this rank's device type: FSDP2's default mesh follows the default accelerator, so
        # CPU ranks on a machine that has CUDA would try cuda:<local_rank> (seen on an H100 host).
        mesh = t.init_device_mesh(self.root_device.type, (self.world_size,))
        shard = {"mesh": mesh, "reshard_after_forward": self.reshard_after_forward, "mp_policy": policy,
                 "offload_policy": self._offload_policy()}
        for module in self._units(router.module):
            t.fully_shard(module, **shard)
        t.fully_shard(router, **shard)
        self._meta_init.materialize(router, self.root_device,
                                    torch.device("cpu") if self.offload else None)  # offloaded shards: on the host
        return router

    def compile_module(self, compiler: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        # FSDP2's hooks are excluded from dynamo, so a compiled frame breaks its graph at every call of a sharded
        # unit: compile each unit's forward on its own, between its hooks (torchtitan compiles per block), and the
        # module's own forward around them. A built-in torch.nn layer sharded as its own unit stays eager (dynamo
        # skips torch.nn's frames): name your block class in `shard_modules` to compile whole blocks.
        super().compile_module(compiler)
        for unit in self._units(self.module):
            compiled.compile_forward(unit, compiler)

    def _offload_policy(self) -> Any:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        if not self.offload:
            return OffloadPolicy()  # torch's default: no offload
        return CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda")  # pinning needs CUDA

    def _units(self, root: nn.Module) -> Iterator[nn.Module]:
        """The submodules sharded as units before the root: instances of `shard_modules`, or else every
        submodule that owns parameters itself."""
        for module in root.modules():
            if module is root:
                continue
            if self.shard_modules:
                if isinstance(module, self.shard_modules):
                    yield module
            elif any(True for _ in module.parameters(recurse=False)):
                yield module

    def no_backward_sync(self, enabled: bool) -> AbstractContextManager:
        return self._no_gradient_sync() if enabled else NULL_CONTEXT

    @contextmanager
    def _no_gradient_sync(self) -> Iterator[None]:
        model = self.model
        assert isinstance(model, dtensor.torch_sharding().FSDPModule)  # fully_shard made the router one
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_gradients(self, optimizer: Optimizer, *, max_norm: float | None = None,
                       max_value: float | None = None, norm_type: float = 2.0) -> torch.Tensor | None:
        norm = super().clip_gradients(optimizer, max_norm=max_norm, max_value=max_value, norm_type=norm_type)
        return dtensor.full_tensor(norm) if norm is not None else None

    def accumulated_gradients(self) -> dict[str, torch.Tensor] | None:
        return None  # FSDP2 keeps an unsynced window's gradients in its own unsharded buffers

    # --- checkpoints --------------------------------------------------------------------------
    def evaluation_context(self, inference_mode: bool) -> AbstractContextManager:
        # FSDP2 gathers and frees parameters in hooks around forward; Lightning evaluates sharded models in
        # no_grad too
        return torch.no_grad()

    def module_state_dict(self) -> dict[str, Any]:
        # full: collective, and with cpu_offload only rank 0 gets the tensors; sharded: each rank's own DTensors
        return dtensor.model_state(self.model, full=not self.sharded_checkpoint)

    def load_module_state_dict(self, state_dict: Any, strict: bool = True) -> None:
        if isinstance(state_dict, ShardedRef):
            target = dtensor.model_state(self.model, full=False)
            load_into(state_dict.folder, "model", target)
            dtensor.load_model_state(self.model, target, full=False, strict=strict)
            return
        dtensor.load_model_state(self.model, state_dict, full=True, strict=strict)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        return dtensor.optimizer_state(self.model, optimizer, full=not self.sharded_checkpoint)

    def load_optimizer_state_dict(self, optimizer: Optimizer, state_dict: Any) -> None:
        if isinstance(state_dict, ShardedRef):
            target = dtensor.optimizer_state(self.model, optimizer, full=False)
            load_into(state_dict.folder, state_dict.key, target)
            dtensor.load_optimizer_state(self.model, optimizer, target, full=False)
            return
        dtensor.load_optimizer_state(self.model, optimizer, state_dict, full=True)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        if self.sharded_checkpoint:
            saver = self._saver if self._in_run else None  # outside a run (after fit): synchronous
            save_sharded(self, checkpoint, path, saver, self.timeout)
        else:
            super().save_checkpoint(checkpoint, path)

    def remove_checkpoint(self, path: str | Path) -> None:
        if self._saver is None or not self._saver.defer(lambda: super(FSDPStrategy, self).remove_checkpoint(path)):
            super().remove_checkpoint(path)

    def wait_for_saves(self) -> None:
        if self._saver is not None:
            self.raise_if_any_failed(self._saver.join())

    def setup_environment(self) -> None:
        super().setup_environment()
        self._in_run = True

    def teardown(self) -> None:
        """Failure path included: no rank leaves with a write in flight (local wait, no collective)."""
        self._in_run = False
        if self._saver is not None:
            error = self._saver.join()
            self._saver.forget_group()
            if error is not None:
                warnings.warn(f"the last asynchronous sharded save failed: {error}", stacklevel=2)
        super().teardown()

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        if is_folder_checkpoint(path):
            return load_sharded(self, path)
        return super().load_checkpoint(path)

    def __repr__(self) -> str:
        return (f"FSDPStrategy(devices={len(self.parallel_devices)}, num_nodes={self.num_nodes}, "
                f"reshard_after_forward={self.reshard_after_forward}, offload={self.offload})")
