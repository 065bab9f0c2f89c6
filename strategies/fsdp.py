"""FSDP2: parameters, gradients and optimizer state sharded across the ranks with torch's `fully_shard`.

The ranks and process group come from `ParallelStrategy`, the meta-device build, gradient-sync switch and checkpoint
layout (full states by default, or every rank's shards in a DCP folder with `sharded_checkpoint=True`) from
`DTensorParallelStrategy` (strategies/dtensor_parallel.py); this file owns the sharding units, their compilation,
host offload and DTensor-aware clipping. `strategy="zero2"` / `"zero3"` build it through `ZeroStrategy`
(strategies/zero.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from strategies.dtensor_parallel import DTENSOR_PRECISIONS, DTensorParallelStrategy
from strategies.model import compiled, dtensor
from strategies.model.step_router import StepRouter
from strategies.precision import Precision

FSDP_PRECISIONS = DTENSOR_PRECISIONS


class FSDPStrategy(DTensorParallelStrategy):
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
        super().__init__(devices, num_nodes, precision, sharded_checkpoint=sharded_checkpoint,
                         activation_checkpointing=activation_checkpointing,
                         process_group_backend=process_group_backend, timeout=timeout, start_method=start_method,
                         min_timeout=min_timeout, timeout_steps=timeout_steps)
        self.offload = offload
        self.reshard_after_forward = reshard_after_forward
        self.shard_modules = tuple(shard_modules)

    # --- wrapping ----------------------------------------------------------------------------------
    def _wrap(self, router: StepRouter) -> nn.Module:
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

    def clip_gradients(self, optimizer: Optimizer, *, max_norm: float | None = None,
                       max_value: float | None = None, norm_type: float = 2.0) -> torch.Tensor | None:
        norm = super().clip_gradients(optimizer, max_norm=max_norm, max_value=max_value, norm_type=norm_type)
        return dtensor.full_tensor(norm) if norm is not None else None

    def __repr__(self) -> str:
        return (f"FSDPStrategy(devices={len(self.parallel_devices)}, num_nodes={self.num_nodes}, "
                f"reshard_after_forward={self.reshard_after_forward}, offload={self.offload})")
