"""ModelSummary: print a table of the module's top-level layers and parameter counts at fit start."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from callbacks.base import Callback
from strategies.base import move_to_device
from strategies.distributed import rank_zero_info

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer


def _count(module: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def _shape(value: Any) -> str:
    if isinstance(value, Tensor):
        return str(list(value.shape))
    if isinstance(value, (list, tuple)) and value:
        return ", ".join(_shape(v) for v in value) if len(value) > 1 else _shape(value[0])
    return "?"


def _layer_sizes(module: nn.Module, children: list[tuple[str, nn.Module]], example: Any) -> dict[str, tuple[str, str]]:
    """In and out sizes of each listed child, from one forward of `example` in eval mode without gradients
    (Lightning's summary columns when `example_input_array` is set)."""
    sizes: dict[str, tuple[str, str]] = {}
    hooks = [child.register_forward_hook(
        lambda _m, args, out, name=name: sizes.setdefault(name, (_shape(args), _shape(out))))
        for name, child in children]
    was_training = module.training
    module.eval()
    try:
        example = move_to_device(example, next(module.parameters(), torch.empty(0)).device)
        with torch.no_grad():
            if isinstance(example, tuple):
                module(*example)
            elif isinstance(example, dict):
                module(**example)
            else:
                module(example)
    finally:
        for hook in hooks:
            hook.remove()
        module.train(was_training)
    return sizes


def summarize(module: nn.Module, max_depth: int = 1, example_input: Any = None) -> str:
    """A text table: name, type and parameter count of each child up to `max_depth`, then totals; with an
    `example_input` (the module's `example_input_array`), also each child's input and output sizes."""
    children = [(n, m) for n, m in module.named_modules() if n and n.count(".") < max_depth]
    sizes = _layer_sizes(module, children, example_input) if example_input is not None else None
    rows = [("", "Name", "Type", "Params", *(("In sizes", "Out sizes") if sizes is not None else ()))]
    for idx, (name, child) in enumerate(children):
        shapes = sizes.get(name, ("?", "?")) if sizes is not None else ()
        rows.append((str(idx), name, type(child).__name__, f"{_count(child):,}", *shapes))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    total, trainable = _count(module), _count(module, trainable_only=True)
    size_mb = sum(p.numel() * p.element_size() for p in module.parameters()) / 1e6
    lines += ["-" * len(lines[0]), f"{trainable:,} trainable params", f"{total - trainable:,} non-trainable params",
              f"{total:,} total params", f"{size_mb:.3f} MB total parameter size"]
    return "\n".join(lines)


class ModelSummary(Callback):
    """Prints `summarize(module, max_depth)` once on rank 0 when fit starts; with the module's
    `example_input_array` set and one process, the table has each layer's input and output sizes (a forward in
    eval mode; with several processes it is left out, as a forward on rank 0 alone could wait for the others)."""

    def __init__(self, max_depth: int = 1) -> None:
        self.max_depth = max_depth

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.max_depth > 0 and trainer.is_global_zero:
            example = getattr(pl_module, "example_input_array", None) if trainer.world_size == 1 else None
            rank_zero_info(summarize(pl_module, self.max_depth, example))
