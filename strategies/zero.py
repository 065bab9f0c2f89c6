"""ZeRO by argument, on torch's own sharding: "zero1" shards optimizer state (DDP +
ZeroRedundancyOptimizer); "zero2" also gradients and "zero3" also parameters (FSDP2 `fully_shard`,
keeping or freeing the unsharded parameters after forward).

By default checkpoints hold full (consolidated) states in the standard layout, so a ZeRO checkpoint
loads on a single device, and a single-device or DDP checkpoint loads into any ZeRO stage. With
`sharded_checkpoint=True` (stages 2/3) every rank writes its shards into a checkpoint folder
(strategies/sharded_checkpoint.py), which loads into stage 2/3 at any world size.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from strategies.base import NULL_CONTEXT, _StepRouter
from strategies.ddp import DDPStrategy
from strategies.exceptions import ConfigError
from strategies.precision import Precision
from strategies.sharded_checkpoint import ShardedRef, is_folder_checkpoint, load_into, load_sharded, save_sharded


@functools.cache
def _dist() -> SimpleNamespace:
    """torch's sharding and distributed-checkpoint API, imported on first use: importing it costs about a
    second (DTensor, DCP), which `import trainer` must not pay (import time is a benchmark)."""
    from torch.distributed.checkpoint import state_dict as dcp_state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import DTensor

    return SimpleNamespace(
        StateDictOptions=dcp_state.StateDictOptions, get_model_state_dict=dcp_state.get_model_state_dict,
        get_optimizer_state_dict=dcp_state.get_optimizer_state_dict,
        set_model_state_dict=dcp_state.set_model_state_dict,
        set_optimizer_state_dict=dcp_state.set_optimizer_state_dict, init_device_mesh=init_device_mesh,
        FSDPModule=FSDPModule, MixedPrecisionPolicy=MixedPrecisionPolicy, fully_shard=fully_shard,
        ZeroRedundancyOptimizer=ZeroRedundancyOptimizer, DTensor=DTensor,
        FULL=dcp_state.StateDictOptions(full_state_dict=True, cpu_offload=True),
    )
_ROUTER_PREFIX = "module."  # the TrainModule sits at `module` inside the step router


def zero_optimizer_kwargs(optimizer: Optimizer) -> dict[str, Any]:
    """The optimizer's defaults that its constructor accepts (raw defaults break e.g. AdamW)."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}


class ZeroStrategy(DDPStrategy):
    """`ZeroStrategy(stage=1|2|3)`: data parallel with sharded optimizer state (1), gradients (2), parameters (3).

    `shard_modules`: module classes to shard as units for stages 2 and 3 (e.g. your transformer
    block); by default every submodule that owns parameters is a unit, then the root.
    `strategy="zero1"`, `"zero2"` and `"zero3"` build this class; see docs/zero.md.

    Args:
        stage: 1 shards the optimizer state (DDP + ZeroRedundancyOptimizer); 2 also the gradients and 3 also
            the parameters (FSDP2 `fully_shard`, keeping resp. freeing the gathered parameters after forward).
        devices: this machine's devices; None takes the Trainer's.
        num_nodes: the number of machines.
        precision: the Precision object; stages 2 and 3 support 32-true, bf16-mixed and bf16-true.
        shard_modules: for stages 2 and 3, the module classes that become FSDP2 units.
        sharded_checkpoint: for stages 2 and 3, every rank writes its own shards into a checkpoint folder
            instead of rank 0 writing one full file.
        **ddp_kwargs: `process_group_backend`, `timeout`, `min_timeout`, `timeout_steps`, `start_method` as for
            DDPStrategy; for stage 1 also DistributedDataParallel's options.

    Attributes:
        stage: the ZeRO stage, 1, 2 or 3.

    Raises:
        ConfigError: an invalid stage, an unsupported precision, DDP options for stages 2 and 3, or
            `sharded_checkpoint=True` with stage 1.

    Example:
        ```python
        trainer = Trainer(accelerator="cpu", devices=2, strategy=ZeroStrategy(stage=3, shard_modules=(Block,)))
        ```
    """

    def __init__(self, stage: int = 1, devices: list[torch.device] | None = None, num_nodes: int = 1,
                 precision: Precision | None = None, shard_modules: tuple[type[nn.Module], ...] = (),
                 sharded_checkpoint: bool = False, **ddp_kwargs: Any) -> None:
        if stage not in (1, 2, 3):
            raise ConfigError(f"ZeroStrategy(stage={stage!r}) is not valid: use 1, 2 or 3.")
        if sharded_checkpoint and stage == 1:
            raise ConfigError("ZeroStrategy(sharded_checkpoint=True) needs stage 2 or 3 (FSDP2 sharded states).")
        self.sharded_checkpoint = sharded_checkpoint
        unused = sorted(set(ddp_kwargs) - {"process_group_backend", "timeout", "min_timeout", "timeout_steps",
                                           "start_method"})
        if stage in (2, 3) and unused:
            raise ConfigError(f"ZeroStrategy(stage={stage}) does not use DDP options {unused}; remove them.")
        super().__init__(devices=devices, num_nodes=num_nodes, precision=precision, **ddp_kwargs)
        self.stage = stage
        self.shard_modules = tuple(shard_modules)
        name = self.precision.name
        if name not in self.supported_precisions():
            raise ConfigError(
                f"precision={name!r} is not supported by zero{stage}; it supports: "
                f"{', '.join(self.supported_precisions())}."
            )

    @classmethod
    def register(cls, registry: Any) -> None:
        for stage in (1, 2, 3):
            registry.register(f"zero{stage}", cls, description=f"ZeRO stage {stage}", stage=stage)

    def supported_precisions(self) -> tuple[str, ...]:
        if self.stage == 1:
            return super().supported_precisions()
        return ("32-true", "bf16-mixed", "bf16-true")  # 16-mixed's GradScaler is untested with FSDP2: refused

    # --- wrapping -----------------------------------------------------------------------------
    def _wrap(self, router: _StepRouter) -> nn.Module:
        if self.stage == 1:
            return super()._wrap(router)
        reshard = self.stage == 3
        policy = self._mixed_precision_policy()
        # An explicit mesh on this rank's device type: FSDP2's default mesh follows the default accelerator, so
        # CPU ranks on a machine that has CUDA would try cuda:<local_rank> (seen on an H100 host).
        mesh = _dist().init_device_mesh(self.root_device.type, (self.world_size,))
        for module in router.module.modules():
            if module is router.module:
                continue
            owns = any(True for _ in module.parameters(recurse=False))
            if (self.shard_modules and isinstance(module, self.shard_modules)) or (not self.shard_modules and owns):
                _dist().fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        _dist().fully_shard(router, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        return router

    def _mixed_precision_policy(self) -> Any:
        """bf16-mixed: FSDP2 gathers parameters in bf16 and reduces gradients in fp32 (autocast still runs)."""
        if self.precision.name.endswith("-mixed") and self.precision.param_dtype is not None:
            return _dist().MixedPrecisionPolicy(param_dtype=self.precision.param_dtype, reduce_dtype=torch.float32)
        return _dist().MixedPrecisionPolicy()

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        if self.stage != 1:
            return optimizers  # built after fully_shard, so they already hold the sharded parameters
        return [_dist().ZeroRedundancyOptimizer([dict(g) for g in opt.param_groups], optimizer_class=type(opt),
                                        **zero_optimizer_kwargs(opt)) for opt in optimizers]

    def no_backward_sync(self, enabled: bool) -> AbstractContextManager:
        if self.stage == 1:
            return super().no_backward_sync(enabled)
        return self._fsdp_no_sync() if enabled else NULL_CONTEXT

    @contextmanager
    def _fsdp_no_sync(self) -> Iterator[None]:
        model = self._model
        assert isinstance(model, _dist().FSDPModule)
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_gradients(self, optimizer: Optimizer, *, max_norm: float | None = None,
                       max_value: float | None = None, norm_type: float = 2.0) -> torch.Tensor | None:
        norm = super().clip_gradients(optimizer, max_norm=max_norm, max_value=max_value, norm_type=norm_type)
        return norm.full_tensor() if isinstance(norm, _dist().DTensor) else norm

    # --- checkpoints (full states, standard layout) ------------------------------------------------
    def accumulated_gradients(self) -> dict[str, torch.Tensor] | None:
        if self.stage == 1:
            return super().accumulated_gradients()
        return None  # FSDP2 keeps an unsynced window's gradients in its own unsharded buffers
    def module_state_dict(self) -> dict[str, Any]:
        if self.stage == 1:
            return super().module_state_dict()
        if self.sharded_checkpoint:  # each rank keeps its own shards (DTensors); written by DCP
            return {k.removeprefix(_ROUTER_PREFIX): v for k, v in _dist().get_model_state_dict(self.model).items()}
        # collective; with cpu_offload only rank 0 gets the tensors
        full = _dist().get_model_state_dict(self.model, options=_dist().FULL)
        return {k.removeprefix(_ROUTER_PREFIX): v for k, v in full.items()}

    def load_module_state_dict(self, state_dict: Any, strict: bool = True) -> None:
        if isinstance(state_dict, ShardedRef):
            target = {k.removeprefix(_ROUTER_PREFIX): v for k, v in _dist().get_model_state_dict(self.model).items()}
            load_into(state_dict.folder, "model", target)
            _dist().set_model_state_dict(self.model, {_ROUTER_PREFIX + k: v for k, v in target.items()},
                                 options=_dist().StateDictOptions(strict=strict))
            return None
        if self.stage == 1:
            return super().load_module_state_dict(state_dict, strict)
        prefixed = {_ROUTER_PREFIX + k: v for k, v in state_dict.items()}
        _dist().set_model_state_dict(self.model, prefixed,
                                     options=_dist().StateDictOptions(full_state_dict=True, strict=strict))
        return None

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        if isinstance(optimizer, _dist().ZeroRedundancyOptimizer):
            optimizer.consolidate_state_dict(to=0)  # collective; only rank 0 gets the full state
            return optimizer.state_dict() if self.is_global_zero else {}
        if self.stage == 1:
            return super().optimizer_state_dict(optimizer)
        if self.sharded_checkpoint:
            return _dist().get_optimizer_state_dict(self.model, optimizer)
        by_name = _dist().get_optimizer_state_dict(self.model, optimizer, options=_dist().FULL)  # collective
        return self._names_to_indices(optimizer, by_name) if by_name else {}  # with cpu_offload: rank 0 only

    def load_optimizer_state_dict(self, optimizer: Optimizer, state_dict: Any) -> None:
        if isinstance(state_dict, ShardedRef):
            target = _dist().get_optimizer_state_dict(self.model, optimizer)
            load_into(state_dict.folder, state_dict.key, target)
            _dist().set_optimizer_state_dict(self.model, optimizer, target)
            return
        if self.stage in (2, 3):
            by_name = self._indices_to_names(optimizer, state_dict)
            _dist().set_optimizer_state_dict(self.model, optimizer, by_name,
                                             options=_dist().StateDictOptions(full_state_dict=True))
            return
        optimizer.load_state_dict(state_dict)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        if self.sharded_checkpoint:
            save_sharded(self, checkpoint, path)
        else:
            super().save_checkpoint(checkpoint, path)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        if self.stage != 1 and is_folder_checkpoint(path):
            return load_sharded(self, path)
        return super().load_checkpoint(path)

    def _param_names(self, optimizer: Optimizer) -> list[str]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def _names_to_indices(self, optimizer: Optimizer, by_name: dict[str, Any]) -> dict[str, Any]:
        """torch's full optimizer state is keyed by parameter name; checkpoints use indices (portable)."""
        index = {n: i for i, n in enumerate(self._param_names(optimizer))}
        groups = [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]]
        return {"state": {index[n]: s for n, s in by_name["state"].items()}, "param_groups": groups}

    def _indices_to_names(self, optimizer: Optimizer, by_index: dict[str, Any]) -> dict[str, Any]:
        names = self._param_names(optimizer)
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in by_index["param_groups"]]
        return {"state": {names[int(i)]: s for i, s in by_index["state"].items()}, "param_groups": groups}

    def __repr__(self) -> str:
        return f"ZeroStrategy(stage={self.stage}, devices={len(self.parallel_devices)}, num_nodes={self.num_nodes})"
