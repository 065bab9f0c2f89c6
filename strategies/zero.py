"""ZeRO by argument, on torch's own sharding. `ZeroStrategy(stage=...)` picks the mechanism once, at construction:
stage 1 is DDP with torch's ZeroRedundancyOptimizer (optimizer state sharded); stages 2 and 3 are FSDP2
(strategies/fsdp.py), keeping or freeing the gathered parameters after forward. Nothing branches on the stage
afterwards: each stage is a subclass of the strategy whose mechanism it uses.

By default checkpoints hold full (consolidated) states in the standard layout, so a ZeRO checkpoint
loads on a single device, and a single-device or DDP checkpoint loads into any ZeRO stage. With
`sharded_checkpoint=True` (stages 2/3) every rank writes its shards into a checkpoint folder
(strategies/checkpoint_io/sharded/folder.py), which loads into stage 2/3 at any world size.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from strategies.ddp import DDPStrategy
from strategies.exceptions import ConfigError
from strategies.fsdp import FSDPStrategy
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision

_PROCESS_OPTIONS = frozenset({"process_group_backend", "timeout", "min_timeout", "timeout_steps", "start_method"})


def zero_optimizer_kwargs(optimizer: Optimizer) -> dict[str, Any]:
    """The optimizer's defaults that its constructor accepts (raw defaults break e.g. AdamW)."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}


class ZeroStrategy(ParallelStrategy):
    """`ZeroStrategy(stage=1|2|3)`: data parallel with sharded optimizer state (1), gradients (2), parameters (3).

    `shard_modules`: module classes to shard as units for stages 2 and 3 (e.g. your transformer
    block); by default every submodule that owns parameters is a unit, then the root.
    `strategy="zero1"`, `"zero2"` and `"zero3"` build this class; see docs/zero.md. The instance is a
    `DDPStrategy` for stage 1 and an `FSDPStrategy` for stages 2 and 3 (as `pathlib.Path()` gives a
    `PosixPath`, the class picks the subclass for the stage).

    Args:
        stage: 1 shards the optimizer state (DDP + ZeroRedundancyOptimizer); 2 also the gradients and 3 also
            the parameters (FSDP2 `fully_shard`, keeping resp. freeing the gathered parameters after forward).
        devices: this machine's devices; None takes the Trainer's.
        num_nodes: the number of machines.
        precision: the Precision object; stages 2 and 3 support 32-true, bf16-mixed and bf16-true.
        shard_modules: for stages 2 and 3, the module classes that become FSDP2 units.
        sharded_checkpoint: for stages 2 and 3, every rank writes its own shards into a checkpoint folder
            instead of rank 0 writing one full file; `"async"` writes them in the background during fit.
        offload: for stages 2 and 3, parameter shards, gradients and optimizer state live in host memory and the
            optimizer steps there (FSDP2's `CPUOffloadPolicy`); `strategy="zero2_offload"` / `"zero3_offload"`.
        activation_checkpointing: module classes (e.g. your transformer block) whose forward is recomputed in
            backward instead of keeping its activations; every stage.
        **ddp_kwargs: `process_group_backend`, `timeout`, `min_timeout`, `timeout_steps`, `start_method` as for
            DDPStrategy; for stage 1 also DistributedDataParallel's options.

    Attributes:
        stage: the ZeRO stage, 1, 2 or 3.

    Raises:
        ConfigError: an invalid stage, an unsupported precision, DDP options for stages 2 and 3, or
            `shard_modules` / `sharded_checkpoint=True` / `offload=True` with stage 1.

    Example:
        ```python
        trainer = Trainer(accelerator="cpu", devices=2, strategy=ZeroStrategy(stage=3, shard_modules=(Block,)))
        ```
    """

    stage: int

    def __new__(cls, stage: int = 1, *args: Any, **kwargs: Any) -> ZeroStrategy:
        if cls is ZeroStrategy:
            if stage not in _STAGES:
                raise ConfigError(f"ZeroStrategy(stage={stage!r}) is not valid: use 1, 2 or 3.")
            cls = _STAGES[stage]
        return super().__new__(cls)

    def __init__(self, stage: int = 1, devices: list[torch.device] | None = None, num_nodes: int = 1,
                 precision: Precision | None = None, shard_modules: tuple[type[nn.Module], ...] = (),
                 sharded_checkpoint: bool | str = False, offload: bool = False,
                 activation_checkpointing: Sequence[type[nn.Module]] | None = None, **ddp_kwargs: Any) -> None:
        self.stage = stage
        ddp_kwargs["activation_checkpointing"] = activation_checkpointing
        self._init_mechanism(stage, devices, num_nodes, precision, tuple(shard_modules), sharded_checkpoint,
                             offload, ddp_kwargs)

    @abstractmethod
    def _init_mechanism(self, stage: int, devices: list[torch.device] | None, num_nodes: int,
                        precision: Precision | None, shard_modules: tuple[type[nn.Module], ...],
                        sharded_checkpoint: bool | str, offload: bool, ddp_kwargs: dict[str, Any]) -> None:
        """Initialise the strategy whose mechanism this stage uses, refusing options it would ignore."""

    @classmethod
    def register(cls, registry: Any) -> None:
        for stage in (1, 2, 3):
            registry.register(f"zero{stage}", ZeroStrategy, description=f"ZeRO stage {stage}", stage=stage)
        for stage in (2, 3):
            registry.register(f"zero{stage}_offload", ZeroStrategy, stage=stage, offload=True,
                              description=f"ZeRO stage {stage}, parameters, gradients and optimizer state on the host")

    def __repr__(self) -> str:
        offload = ", offload=True" if getattr(self, "offload", False) else ""
        return (f"ZeroStrategy(stage={self.stage}, devices={len(self.parallel_devices)}, "
                f"num_nodes={self.num_nodes}{offload})")


class Zero1Strategy(ZeroStrategy, DDPStrategy):
    """ZeRO-1: DDP, with every optimizer rebuilt as torch's `ZeroRedundancyOptimizer` (each rank keeps the state of,
    and updates, its partition of the parameters, then broadcasts them)."""

    def _init_mechanism(self, stage: int, devices: list[torch.device] | None, num_nodes: int,
                        precision: Precision | None, shard_modules: tuple[type[nn.Module], ...],
                        sharded_checkpoint: bool | str, offload: bool, ddp_kwargs: dict[str, Any]) -> None:
        if offload:
            raise ConfigError("ZeroStrategy(offload=True) offloads FSDP2's shards: it needs stage 2 or 3.")
        if sharded_checkpoint:
            raise ConfigError("ZeroStrategy(sharded_checkpoint=True) needs stage 2 or 3 (FSDP2 sharded states).")
        if shard_modules:
            raise ConfigError("ZeroStrategy(shard_modules=...) chooses FSDP2 units: it needs stage 2 or 3.")
        DDPStrategy.__init__(self, devices, num_nodes, precision, **ddp_kwargs)

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # imported on first use (import time)

        return [ZeroRedundancyOptimizer([dict(g) for g in opt.param_groups], optimizer_class=type(opt),
                                        **zero_optimizer_kwargs(opt)) for opt in optimizers]

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        # `optimizer` is one setup_optimizers built; collective, and only rank 0 gets the full state
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            raise TypeError(f"ZeRO-1 saves the optimizers its setup_optimizers built, not {type(optimizer).__name__}")
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if self.is_global_zero else {}


class ZeroFSDPStrategy(ZeroStrategy, FSDPStrategy):
    """ZeRO-2 and ZeRO-3: FSDP2, keeping (2) or freeing (3) each unit's gathered parameters after its forward."""

    def _init_mechanism(self, stage: int, devices: list[torch.device] | None, num_nodes: int,
                        precision: Precision | None, shard_modules: tuple[type[nn.Module], ...],
                        sharded_checkpoint: bool | str, offload: bool, ddp_kwargs: dict[str, Any]) -> None:
        unused = sorted(set(ddp_kwargs) - _PROCESS_OPTIONS - {"activation_checkpointing"})
        if unused:
            raise ConfigError(f"ZeroStrategy(stage={stage}) does not use DDP options {unused}; remove them.")
        FSDPStrategy.__init__(self, devices, num_nodes, precision, reshard_after_forward=stage == 3,
                              shard_modules=shard_modules, sharded_checkpoint=sharded_checkpoint, offload=offload,
                              **ddp_kwargs)

    def _label(self) -> str:
        return f"zero{self.stage}"


_STAGES: dict[int, type[ZeroStrategy]] = {1: Zero1Strategy, 2: ZeroFSDPStrategy, 3: ZeroFSDPStrategy}
