"""ModelSummary: print a table of the module's top-level layers and parameter counts at fit start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from callbacks.base import Callback
from strategies.distributed import rank_zero_info

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer


def _count(module: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def summarize(module: nn.Module, max_depth: int = 1) -> str:
    """A text table: name, type and parameter count of each child up to `max_depth`, then totals."""
    rows = [("", "Name", "Type", "Params")]
    for idx, (name, child) in enumerate(
        (n, m) for n, m in module.named_modules() if n and n.count(".") < max_depth
    ):
        rows.append((str(idx), name, type(child).__name__, f"{_count(child):,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    total, trainable = _count(module), _count(module, trainable_only=True)
    size_mb = sum(p.numel() * p.element_size() for p in module.parameters()) / 1e6
    lines += ["-" * len(lines[0]), f"{trainable:,} trainable params", f"{total - trainable:,} non-trainable params",
              f"{total:,} total params", f"{size_mb:.3f} MB total parameter size"]
    return "\n".join(lines)


class ModelSummary(Callback):
    """Prints `summarize(module, max_depth)` once on rank 0 when fit starts."""

    def __init__(self, max_depth: int = 1) -> None:
        self.max_depth = max_depth

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.max_depth > 0 and trainer.is_global_zero:
            rank_zero_info(summarize(pl_module, self.max_depth))
