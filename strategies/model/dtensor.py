"""Helpers for models whose parameters are DTensors (FSDP2 today, tensor parallel later): torch's sharding API
imported on first use, full-tensor reads, and state dicts in the checkpoint's plain layout.

Checkpoints keep the plain module's keys and index optimizer states by parameter position (portable to a single
device); torch's distributed state-dict API keys them by the wrapped model's parameter names. The functions here
convert between the two, so every DTensor strategy writes the same layout.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from torch import Tensor, nn
from torch.optim import Optimizer

ROUTER_PREFIX = "module."  # the TrainModule sits at `module` inside the step router


@functools.cache
def torch_sharding() -> SimpleNamespace:
    """torch's sharding and distributed-state-dict API, imported on first use: importing it costs about a
    second (DTensor, DCP), which `import trainer` must not pay (import time is a benchmark)."""
    from torch.distributed.checkpoint import state_dict as dcp_state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    return SimpleNamespace(
        StateDictOptions=dcp_state.StateDictOptions, get_model_state_dict=dcp_state.get_model_state_dict,
        get_optimizer_state_dict=dcp_state.get_optimizer_state_dict,
        set_model_state_dict=dcp_state.set_model_state_dict,
        set_optimizer_state_dict=dcp_state.set_optimizer_state_dict, init_device_mesh=init_device_mesh,
        FSDPModule=FSDPModule, fully_shard=fully_shard, DTensor=DTensor, distribute_tensor=distribute_tensor,
        FULL=dcp_state.StateDictOptions(full_state_dict=True, cpu_offload=True),
    )


def full_tensor(value: Any) -> Any:
    """A DTensor gathered whole (a collective: call it on every rank); anything else unchanged."""
    return value.full_tensor() if isinstance(value, torch_sharding().DTensor) else value


def _strip(state: dict[str, Any]) -> dict[str, Any]:
    return {k.removeprefix(ROUTER_PREFIX): v for k, v in state.items()}


def _prefix(state: dict[str, Any]) -> dict[str, Any]:
    return {ROUTER_PREFIX + k: v for k, v in state.items()}


def model_state(model: nn.Module, full: bool) -> dict[str, Any]:
    """Collective. The model's state with the plain module's keys: full tensors on rank 0 only (`full=True`,
    offloaded to CPU; empty on the other ranks), or this rank's shards as DTensors (`full=False`, for DCP)."""
    t = torch_sharding()
    return _strip(t.get_model_state_dict(model, options=t.FULL) if full else t.get_model_state_dict(model))


def load_model_state(model: nn.Module, state: dict[str, Tensor], full: bool, strict: bool = True) -> None:
    """Load a state with the plain module's keys: full tensors (`full=True`) or DTensor shards."""
    t = torch_sharding()
    t.set_model_state_dict(model, _prefix(state), options=t.StateDictOptions(full_state_dict=full, strict=strict))


def optimizer_state(model: nn.Module, optimizer: Optimizer, full: bool) -> dict[str, Any]:
    """Collective. The optimizer's state: full and indexed by parameter position on rank 0 (`full=True`; empty
    on the other ranks), or this rank's shards keyed by parameter name (`full=False`, for DCP)."""
    t = torch_sharding()
    if not full:
        return t.get_optimizer_state_dict(model, optimizer)
    by_name = t.get_optimizer_state_dict(model, optimizer, options=t.FULL)
    return _names_to_indices(model, optimizer, by_name) if by_name else {}  # with cpu_offload: rank 0 only


def load_optimizer_state(model: nn.Module, optimizer: Optimizer, state: dict[str, Any], full: bool) -> None:
    """Load a full state indexed by parameter position (`full=True`) or a sharded one keyed by name."""
    t = torch_sharding()
    if not full:
        t.set_optimizer_state_dict(model, optimizer, state)
        return
    t.set_optimizer_state_dict(model, optimizer, _indices_to_names(model, optimizer, state),
                               options=t.StateDictOptions(full_state_dict=True))


def _param_names(model: nn.Module, optimizer: Optimizer) -> list[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _names_to_indices(model: nn.Module, optimizer: Optimizer, by_name: dict[str, Any]) -> dict[str, Any]:
    """torch's full optimizer state is keyed by parameter name; checkpoints use indices (portable)."""
    index = {n: i for i, n in enumerate(_param_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]]
    return {"state": {index[n]: s for n, s in by_name["state"].items()}, "param_groups": groups}


def _indices_to_names(model: nn.Module, optimizer: Optimizer, by_index: dict[str, Any]) -> dict[str, Any]:
    names = _param_names(model, optimizer)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in by_index["param_groups"]]
    return {"state": {names[int(i)]: s for i, s in by_index["state"].items()}, "param_groups": groups}


def local_slice(tensor: Tensor, full: Tensor | None = None) -> Tensor:
    """This rank's part of `tensor` (a DTensor's local shard; a plain tensor itself), or, given `full` (a plain
    tensor of `tensor`'s global shape), the part of `full` that this rank would hold. No communication."""
    t = torch_sharding()
    if not isinstance(tensor, t.DTensor):
        return tensor if full is None else full
    if full is None:
        return tensor.to_local()
    return t.distribute_tensor(full, tensor.device_mesh, tensor.placements, src_data_rank=None).to_local()
