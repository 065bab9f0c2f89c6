"""Tensor and 2-D parallelism: Lightning's `ModelParallelStrategy` on torch's DTensor.

The ranks form a (data_parallel x tensor_parallel) device mesh. The user's `configure_model` parallelizes the
layers over `self.device_mesh["tensor_parallel"]` (`parallelize_module` with ColwiseParallel / RowwiseParallel) and
shards them over `self.device_mesh["data_parallel"]` (`fully_shard`), as in Lightning. This strategy builds the mesh,
feeds the data by data-parallel rank (the ranks of one tensor-parallel group see the same batch), puts what the user
left out of `fully_shard` into one root FSDP2 unit over the data-parallel ranks (so every gradient is averaged
over them, and FSDP2 has one root), materialises the meta-device build shard by shard, and checkpoints through
`DTensorParallelStrategy` (a DCP folder by default, or one full file). The loop does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from strategies.base import ReduceOp
from strategies.comm import distributed
from strategies.comm.collective_timeout import set_group_timeout, torch_default_timeout
from strategies.dtensor_parallel import DTensorParallelStrategy
from strategies.exceptions import ConfigError, MisconfigurationError
from strategies.model import dtensor
from strategies.model.step_router import StepRouter
from strategies.model.wrapped_optimizer import unwrap_optimizer
from strategies.precision import Precision

MESH_DIMS = ("data_parallel", "tensor_parallel")  # Lightning's names, which the user's configure_model indexes


def _size(name: str, value: Any) -> int | None:
    """A mesh size as given: None for "auto", else an int >= 1."""
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"ModelParallelStrategy({name}={value!r}) is not valid: give an int >= 1 or 'auto'.")
    return value


class ModelParallelStrategy(DTensorParallelStrategy):
    """Data parallel (FSDP2) x tensor parallel (DTensor) over a 2-D device mesh, applied by your `configure_model`.

    Args:
        data_parallel_size: ranks per data-parallel group: each group of ranks with the same tensor-parallel
            index holds one replica's shards and sees a different part of every batch. `"auto"`: the number of
            nodes, or the world size divided by `tensor_parallel_size` when that is given.
        tensor_parallel_size: ranks per tensor-parallel group: they split every parallelized layer and see the
            same batches. `"auto"`: the devices per node, or the world size divided by `data_parallel_size`.
        save_distributed_checkpoint: True (the default, as in Lightning): every rank writes its shards into a
            checkpoint folder (DCP with this project's manifest); False: rank 0 writes one full file; `"async"`:
            the folder is written in the background while training goes on.
        process_group_backend: `"nccl"` (CUDA default), `"gloo"` (CPU default) or `"mpi"`.
        timeout: how long every collective waits for a missing rank (timedelta or seconds); None (the default):
            the adaptive hang bound of docs/reliability.md (Lightning's default is a fixed 30 minutes).
        devices: this machine's devices, one process each; None takes the Trainer's.
        num_nodes: the number of machines.
        precision: the Precision object; 32-true, bf16-mixed and bf16-true are supported.
        start_method: as for DDPStrategy (`"subprocess"` re-runs the script per extra rank).
        min_timeout: with `timeout=None`, the least a collective in a training batch may wait (default 120 s).
        timeout_steps: with `timeout=None`, how many measured batch times a collective may wait (default 20).

    Raises:
        ConfigError: sizes that are not ints >= 1 or "auto", a product that is not the world size, or an
            unsupported precision (32-true, bf16-mixed and bf16-true are supported).

    Example:
        ```python
        class GPT(TrainModule):
            def configure_model(self):
                tp, dp = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
                for block in self.blocks:
                    parallelize_module(block, tp, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
                    fully_shard(block, mesh=dp)

        Trainer(accelerator="cpu", devices=4, strategy=ModelParallelStrategy(data_parallel_size=2)).fit(GPT())
        ```
    """

    def __init__(self, data_parallel_size: int | Literal["auto"] = "auto",
                 tensor_parallel_size: int | Literal["auto"] = "auto",
                 save_distributed_checkpoint: bool | str = True, process_group_backend: str | None = None,
                 timeout: timedelta | float | None = None, *, devices: list[torch.device] | None = None,
                 num_nodes: int = 1, precision: Precision | None = None, start_method: str = "subprocess",
                 min_timeout: timedelta | float | None = None, timeout_steps: int | None = None) -> None:
        self._sizes_given = (_size("data_parallel_size", data_parallel_size),
                             _size("tensor_parallel_size", tensor_parallel_size))
        super().__init__(devices, num_nodes, precision, sharded_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout, start_method=start_method,
                         min_timeout=min_timeout, timeout_steps=timeout_steps)
        self._device_mesh: Any = None
        dp, tp = self._sizes_given  # checked against the world size once the devices are known (adopt_flags)
        self.data_parallel_size, self.tensor_parallel_size = (
            self._mesh_shape(self.world_size) if devices is not None else (dp or 1, tp or 1))

    @classmethod
    def register(cls, registry: Any) -> None:
        registry.register("model_parallel", cls, description="FSDP2 x tensor parallel over a 2-D device mesh")

    def _checkpoint_flag(self) -> str:
        return "save_distributed_checkpoint"

    def adopt_flags(self, devices: list[torch.device], num_nodes: int) -> None:
        super().adopt_flags(devices, num_nodes)
        self.data_parallel_size, self.tensor_parallel_size = self._mesh_shape(self.world_size)

    def _mesh_shape(self, world_size: int) -> tuple[int, int]:
        """(data-parallel size, tensor-parallel size) for `world_size` ranks, or ConfigError."""
        dp, tp = self._sizes_given
        if dp is None and tp is None:  # Lightning's "auto": data parallel across nodes, tensor parallel within one
            dp, tp = self.num_nodes, world_size // self.num_nodes
        elif dp is None:
            dp = world_size // tp if tp else 0
        elif tp is None:
            tp = world_size // dp
        if not dp or not tp or dp * tp != world_size:
            given = f"data_parallel_size={self._shown(0)}, tensor_parallel_size={self._shown(1)}"
            raise ConfigError(f"ModelParallelStrategy({given}) does not fit {world_size} rank(s) "
                              f"({len(self.parallel_devices)} device(s) x {self.num_nodes} node(s)): the two sizes "
                              "must multiply to the world size.")
        return dp, tp

    def _shown(self, index: int) -> str:
        size = self._sizes_given[index]
        return "'auto'" if size is None else str(size)

    # --- topology -----------------------------------------------------------------------------------
    @property
    def device_mesh(self) -> Any:
        """The (data_parallel, tensor_parallel) `DeviceMesh`, for `configure_model` (`self.device_mesh` there)."""
        if self._device_mesh is None:
            raise RuntimeError("ModelParallelStrategy.device_mesh exists once the ranks have started: read it in "
                               "configure_model() (self.device_mesh) or later.")
        return self._device_mesh

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # the mesh is laid out row-major: rank = dp_rank * tp + tp_rank (init_device_mesh's order)
        return {"num_replicas": self.data_parallel_size, "rank": self.global_rank // self.tensor_parallel_size}

    def setup_environment(self) -> None:
        super().setup_environment()
        self.data_parallel_size, self.tensor_parallel_size = self._mesh_shape(self.world_size)
        if self._device_mesh is None:  # once per process group: a later run of the same script keeps it
            mesh = dtensor.torch_sharding().init_device_mesh(
                self.root_device.type, (self.data_parallel_size, self.tensor_parallel_size), mesh_dim_names=MESH_DIMS)
            self._bound_mesh_groups([mesh.get_group(name) for name in MESH_DIMS])
            self._device_mesh = mesh

    def _bound_mesh_groups(self, groups: list[Any]) -> None:
        """The mesh's groups wait for a missing rank as long as the world group does (the fixed `timeout`, or the
        hang bound), not torch's 30-minute default."""
        if self.timeout is not None:
            for group in groups:
                set_group_timeout(group, self.timeout)
            return
        own = torch_default_timeout(self.process_group_backend)
        self.collective_timeout.attach_more([(group, own) for group in groups])

    # --- building and wrapping ----------------------------------------------------------------------
    def _wrap(self, router: StepRouter) -> nn.Module:
        module = router.module
        previous = self._model
        if isinstance(previous, StepRouter) and previous.module is module:
            return previous  # validate/test after fit: the module is laid out already, its root unit included
        _refuse_wrapped(module)
        _refuse_other_roots(module)
        if self.world_size > 1 and not dtensor.has_dtensor_parameters(module):
            raise ConfigError(
                f"ModelParallelStrategy: configure_model() of {type(module).__name__} parallelized nothing (no "
                "parameter is a DTensor). Apply parallelize_module(layer, self.device_mesh['tensor_parallel'], plan) "
                "and/or fully_shard(layer, mesh=self.device_mesh['data_parallel']) there, or use strategy='ddp' or "
                "'zero3' for a model you do not split yourself.")
        if self.data_parallel_size > 1:
            # one root unit over the data-parallel ranks: the parameters configure_model left out of fully_shard are
            # sharded there, so every gradient is averaged over the replicas, and FSDP2 has one root to drive it
            dtensor.torch_sharding().fully_shard(router, mesh=self.device_mesh["data_parallel"])
        self._meta_init.materialize(router, self.root_device)
        return router

    def compile_module(self, compiler: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        raise MisconfigurationError(
            "fit(torch.compile(model)) is not supported with ModelParallelStrategy: compile the blocks yourself in "
            "configure_model(), after parallelize_module and fully_shard (e.g. `block.compile()` for each "
            "transformer block, as torchtitan does), and pass the module uncompiled.")

    # --- the step -----------------------------------------------------------------------------------
    def clip_gradients(self, optimizer: Optimizer, *, max_norm: float | None = None,
                       max_value: float | None = None, norm_type: float = 2.0) -> Tensor | None:
        """Clip by norm over gradients on several meshes (tensor-parallel, data-parallel, 2-D) and plain ones."""
        if max_norm is None and max_value is None:
            return None
        optimizer = unwrap_optimizer(optimizer)
        self.precision.unscale_gradients(optimizer)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if max_norm is not None:
            return dtensor.clip_grad_norm(grads, max_norm, norm_type)
        assert max_value is not None
        for grad in grads:
            grad.clamp_(-max_value, max_value)  # elementwise: each rank clamps its own shard
        return None

    # --- collectives --------------------------------------------------------------------------------
    def all_reduce(self, tensor: Tensor, op: ReduceOp = "mean") -> Tensor:
        """Over the data-parallel replicas (what `self.log(..., sync_dist=True)` reduces): the ranks of one
        tensor-parallel group hold the same batch, so a sum over every rank would count it `tensor_parallel_size`
        times."""
        group = self._device_mesh.get_group("data_parallel") if self._device_mesh is not None else None
        return distributed.all_reduce(tensor, op, group)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if self.world_size == 1:
            return bool(decision)
        flag = torch.tensor(int(bool(decision)), device=self.root_device)
        total = int(distributed.all_reduce(flag, "sum").item())  # every rank's vote, tensor-parallel peers too
        return total == self.world_size if all else total > 0

    def __repr__(self) -> str:
        return (f"ModelParallelStrategy(data_parallel_size={self.data_parallel_size}, "
                f"tensor_parallel_size={self.tensor_parallel_size}, num_nodes={self.num_nodes})")


def _refuse_other_roots(module: nn.Module) -> None:
    """Parameters sharded over "data_parallel" outside every FSDP2 unit of the module were put in the root unit of
    another strategy's run: a new root cannot take them over."""
    taken = [name for name, param in dtensor.outside_fsdp_units(module)
             if "data_parallel" in (getattr(getattr(param, "device_mesh", None), "mesh_dim_names", None) or ())]
    if taken:
        raise ConfigError(
            f"ModelParallelStrategy: {type(module).__name__} was set up by another ModelParallelStrategy (its "
            f"parameters {taken[:3]} sit in that run's root unit). Run validate/test/predict with the Trainer that "
            "fitted it, or load its checkpoint into a new module.")


def _refuse_wrapped(module: nn.Module) -> None:
    """Wrappers that would do their own gradient sync (or hide the layers) on top of the mesh: a clear error."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    wrappers = (FullyShardedDataParallel, nn.parallel.DistributedDataParallel, nn.DataParallel)
    for name, sub in module.named_modules():
        if isinstance(sub, wrappers):
            where = f"{type(module).__name__}.{name}" if name else type(module).__name__
            raise ConfigError(
                f"ModelParallelStrategy: {where} is already wrapped in {type(sub).__name__}. Pass the plain module; "
                "shard it in configure_model() with torch.distributed.fsdp.fully_shard (FSDP2) over "
                "self.device_mesh['data_parallel'].")
