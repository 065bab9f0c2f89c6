"""Activation checkpointing by module class, for every strategy: the instances of the given classes drop their
forward activations and recompute them in backward (torch's composable, non-reentrant `checkpoint`)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from strategies.exceptions import ConfigError


def checkpointed_classes(classes: Sequence[type[nn.Module]] | None) -> tuple[type[nn.Module], ...]:
    """The classes a strategy was given, checked: nn.Module subclasses only."""
    classes = tuple(classes or ())
    bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
    if bad:
        raise ConfigError(f"activation_checkpointing takes nn.Module subclasses, got {bad!r}.")
    return classes


def apply_activation_checkpointing(module: nn.Module, classes: tuple[type[nn.Module], ...]) -> None:
    """Make every instance of `classes` inside `module` recompute its forward in backward (torch's composable,
    non-reentrant `checkpoint`: the module keeps its class and its state-dict keys). An instance inside another
    checkpointed one is left alone: the outer recomputation covers it."""
    if not classes:
        return
    from torch.distributed._composable import checkpoint  # imported on first use

    done: list[nn.Module] = []
    for sub in module.modules():
        if isinstance(sub, classes) and not any(sub in outer.modules() for outer in done):
            if checkpoint.state(sub) is None:  # a second fit/validate with the same module: already applied
                checkpoint(sub)
            done.append(sub)
