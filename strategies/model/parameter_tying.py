"""Parameters shared between layers (tied weights, e.g. an embedding and the output layer): which names share one
tensor, and how to tie them again after something (a device move, a copy) made separate tensors of them."""

from __future__ import annotations

from torch import nn


def find_shared_parameters(module: nn.Module) -> list[list[str]]:
    """The groups of parameter names that are one tensor, in registration order (groups of one left out)."""
    groups: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def set_shared_parameters(module: nn.Module, shared: list[list[str]]) -> nn.Module:
    """Tie each group of `find_shared_parameters`' result again: every name takes the first name's parameter."""
    for names in shared:
        first = module.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(owner), attribute, first)
    return module
