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

import torch
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


def has_dtensor_parameters(module: nn.Module) -> bool:
    """Whether any parameter of `module` is a DTensor (it was sharded or parallelized)."""
    dtensor_type = torch_sharding().DTensor
    return any(isinstance(p, dtensor_type) for p in module.parameters())


def outside_fsdp_units(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) for the parameters of `module` that no FSDP2 unit inside it manages."""
    unit_type = torch_sharding().FSDPModule
    found: list[tuple[str, nn.Parameter]] = []

    def walk(prefix: str, sub: nn.Module) -> None:
        if isinstance(sub, unit_type):
            return
        found.extend((prefix + name, param) for name, param in sub.named_parameters(recurse=False))
        for name, child in sub.named_children():
            walk(f"{prefix}{name}.", child)

    walk("", module)
    return found


def _by_mesh(grads: list[Tensor]) -> list[list[Tensor]]:
    """Gradients grouped so that each group is plain tensors or DTensors on one mesh (one reduction each)."""
    dtensor_type = torch_sharding().DTensor
    groups: dict[Any, list[Tensor]] = {}
    for grad in grads:
        key = grad.device_mesh if isinstance(grad, dtensor_type) else None
        groups.setdefault(key, []).append(grad)
    return list(groups.values())


def clip_grad_norm(grads: list[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Collective. Scale `grads` in place so that their joint `norm_type` norm is at most `max_norm`, as
    `torch.nn.utils.clip_grad_norm_` does, for gradients that are plain tensors and DTensors on different meshes (a
    tensor-parallel layer, an FSDP2 unit over the data-parallel ranks only, a replicated one), which one torch call
    cannot take. Returns the total norm before clipping, a plain tensor on every rank."""
    norms = []
    for group in _by_mesh(grads):
        norms.append(full_tensor(torch.nn.utils.get_total_norm(group, norm_type)))
    if not norms:
        return torch.tensor(0.0)
    device = norms[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type)
    coefficient = min(max_norm / (float(total) + 1e-6), 1.0)  # torch's own rule (clip_grads_with_norm_)
    if coefficient < 1.0:
        for group in _by_mesh(grads):
            torch._foreach_mul_(group, coefficient)
    return total
