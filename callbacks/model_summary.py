"""ModelSummary: the table of a module's layers Lightning 2.x prints at fit start.

`summary_of` collects the data once (names, types, parameter counts, train/eval mode, FLOPs and, with an
`example_input_array`, each layer's input and output sizes); `format_summary` lays it out as Lightning's text table,
and `RichModelSummary` (callbacks/rich_model_summary.py) renders the same data with rich.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_info
from strategies.model.device_move import move_to_device

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

_UNITS = (" ", "K", "M", "B", "T")
_UNKNOWN = "?"


class SummaryData:
    """What a summary shows: the table as `(header, cells)` columns, and the totals under it.

    A plain class, not a dataclass: building a dataclass at import costs about 0.4 ms, paid by every fit with the
    default summary before its first step (docs/benchmarks.md, time to first step)."""

    __slots__ = ("columns", "total_parameters", "trainable_parameters", "model_size", "total_training_modes",
                 "total_flops")

    def __init__(self, columns: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                 model_size: float, total_training_modes: dict[str, int], total_flops: int) -> None:
        self.columns = columns
        self.total_parameters = total_parameters
        self.trainable_parameters = trainable_parameters
        self.model_size = model_size  # MB, from each parameter's dtype
        self.total_training_modes = total_training_modes
        self.total_flops = total_flops


def human_count(number: float) -> str:
    """Lightning's short counts: `66  `, `1.2 K`, `2.0 M`, `400 T` (thousands grouped, one decimal below 100)."""
    digits = int(math.floor(math.log10(number)) + 1) if number > 0 else 1
    groups = min(math.ceil(digits / 3), len(_UNITS))
    scaled = number * 10 ** (-3 * (groups - 1))
    if groups == 1 or scaled >= 100:
        return f"{int(scaled):,d} {_UNITS[groups - 1]}"
    return f"{scaled:,.1f} {_UNITS[groups - 1]}"


def _numel(module: nn.Module) -> int:
    """Parameters of `module`; a lazy module's uninitialized parameters count 0 (their size is not known yet)."""
    return sum(0 if isinstance(p, nn.parameter.UninitializedParameter) else p.numel() for p in module.parameters())


def _totals(module: nn.Module) -> tuple[int, int, float]:
    """All parameters, the trainable ones, and their size in MB (from each one's dtype), in one pass over them;
    uninitialized parameters count 0, as in `_numel`."""
    total = trainable = size = 0
    for p in module.parameters():
        if isinstance(p, nn.parameter.UninitializedParameter):
            continue
        count = p.numel()
        total += count
        trainable += count if p.requires_grad else 0
        size += count * p.element_size()
    return total, trainable, size / 1e6


def _shape(value: Any) -> Any:
    if hasattr(value, "shape"):
        return list(value.shape)
    if isinstance(value, (list, tuple)):
        return [_shape(item) for item in value]
    return _UNKNOWN


def _layers(module: nn.Module, max_depth: int) -> list[tuple[str, nn.Module]]:
    """The rows: the children for depth 1, every submodule for -1, those nested less than `max_depth` deep else."""
    if max_depth == 0:
        return []
    if max_depth == 1:
        return list(module.named_children())
    layers = list(module.named_modules())[1:]
    return layers if max_depth == -1 else [(n, m) for n, m in layers if n.count(".") < max_depth]


def _example_forward(module: nn.Module, layers: list[tuple[str, nn.Module]], example: Any, flops: Any,
                     precision: Any) -> dict[str, tuple[Any, Any]]:
    """Each layer's input and output shapes at its first call in one forward of `example` (eval mode, no grad,
    the module's batch-transfer hooks and the run's precision applied, as to a batch)."""
    sizes: dict[str, tuple[Any, Any]] = {}

    def record(name: str) -> Any:
        def hook(_module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            inputs = (*args, *kwargs.values())
            sizes.setdefault(name, (_shape(inputs[0] if len(inputs) == 1 else inputs), _shape(out)))
        return hook

    handles = [m.register_forward_hook(record(n), with_kwargs=True) for n, m in layers
               if not isinstance(m, torch.jit.ScriptModule)]
    modes = {m: m.training for m in module.modules()}
    device = next(module.parameters(), torch.empty(0)).device
    hooks: list[Any] = [getattr(module, name, None) for name in
             ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")]
    if all(callable(hook) for hook in hooks):  # a TrainModule: its batch-transfer hooks, as for a batch
        before, transfer, after = hooks
        example = after(transfer(before(example, 0), device, 0), 0)
    else:
        example = move_to_device(example, device)
    if precision is not None:  # e.g. float inputs become float64 under "64-true" (Lightning's summary fails there)
        example = precision.convert_input(example)
    module.eval()
    try:
        with torch.no_grad(), precision.forward_context() if precision is not None else nullcontext(), flops:
            if isinstance(example, (list, tuple)):
                module(*example)
            elif isinstance(example, dict):
                module(**example)
            else:
                module(example)
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes.items():
            m.training = training
    return sizes


def summary_of(module: nn.Module, max_depth: int = 1, example_input: Any = None, precision: Any = None) -> SummaryData:
    """The summary data of `module` with rows up to `max_depth` (-1: all, 0: none); with an `example_input` (the
    module's `example_input_array`), one forward adds the "In sizes"/"Out sizes" columns and counts FLOPs (under
    `precision`, the strategy's Precision object, when given)."""
    if not isinstance(max_depth, int) or max_depth < -1:
        raise ValueError(f"ModelSummary(max_depth={max_depth!r}): use -1 (every layer), 0 (none) or a positive depth.")
    layers = _layers(module, max_depth)
    sizes: dict[str, tuple[Any, Any]] = {}
    flop_counts: dict[str, int] = {}
    total_flops = 0
    if example_input is not None:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False, depth=max_depth + 1)
        sizes = _example_forward(module, layers, example_input, counter, precision)
        per_module = counter.get_flop_counts()
        flop_counts = {n: sum(per_module.get(f"{type(module).__name__}.{n}", {}).values()) for n, _ in layers}
        total_flops = counter.get_total_flops()
    layer_counts = [_numel(m) for _, m in layers]
    columns: list[tuple[str, list[str]]] = [
        (" ", [str(i) for i in range(len(layers))]),
        ("Name", [n for n, _ in layers]),
        ("Type", [type(m).__name__ for _, m in layers]),
        ("Params", [human_count(count) for count in layer_counts]),
        ("Mode", ["train" if m.training else "eval" for _, m in layers]),
        ("FLOPs", [human_count(flop_counts.get(n, 0)) for n, _ in layers]),
    ]
    if example_input is not None:
        columns.append(("In sizes", [str(sizes.get(n, (_UNKNOWN,))[0] or _UNKNOWN) for n, _ in layers]))
        columns.append(("Out sizes", [str(sizes.get(n, (_UNKNOWN, _UNKNOWN))[1] or _UNKNOWN) for n, _ in layers]))
    total, trainable, size = _totals(module)
    leftover = total - sum(layer_counts)
    if leftover > 0:  # parameters of the root itself, or of layers deeper than max_depth under no row
        for (_header, cells), extra in zip(columns, (" ", "other params", "n/a", human_count(leftover), "n/a", "n/a",
                                                    "n/a", "n/a"), strict=False):
            cells.append(extra)
    modes = [m.training for m in module.modules()][1:]
    return SummaryData(columns, total, trainable, size, {"train": modes.count(True), "eval": modes.count(False)},
                       total_flops)


def format_summary(data: SummaryData) -> str:
    """Lightning's text layout: the columns left-aligned and joined by ` | `, a rule, then one total per line."""
    widths = [max([len(header), *(len(cell) for cell in cells)]) for header, cells in data.columns]
    rule = "-" * (sum(widths) + 3 * (len(widths) + 1))
    rows = [[header for header, _ in data.columns], *zip(*(cells for _, cells in data.columns), strict=True)]
    lines = [" | ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)) for row in rows]
    totals = [
        (human_count(data.trainable_parameters), "Trainable params"),
        (human_count(data.total_parameters - data.trainable_parameters), "Non-trainable params"),
        (human_count(data.total_parameters), "Total params"),
        (f"{data.model_size:,.3f}", "Total estimated model params size (MB)"),
        (str(data.total_training_modes["train"]), "Modules in train mode"),
        (str(data.total_training_modes["eval"]), "Modules in eval mode"),
        (human_count(data.total_flops), "Total Flops"),
    ]
    return "\n".join([lines[0], rule, *lines[1:], rule, *(f"{value:<10}{label}" for value, label in totals)])


def summarize(module: nn.Module, max_depth: int = 1, example_input: Any = None) -> str:
    """The summary table of `module` as text (what `ModelSummary` prints)."""
    return format_summary(summary_of(module, max_depth, example_input))


class ModelSummary(Callback):
    """Prints the summary of the module's layers once, on rank 0, when fit starts (Lightning's table and totals).

    With the module's `example_input_array` set and one process, the table has each layer's input and output sizes
    and FLOPs (one forward in eval mode without gradients); with several processes they are left out, as a forward
    on rank 0 alone could wait for the other ranks under ZeRO-3.

    Args:
        max_depth: deepest layers shown (1: the module's children; -1: all; 0: no summary).
        **summarize_kwargs: options of the rendering (`header_style` for `RichModelSummary`); a subclass that
            overrides `summarize` receives them all.

    Example:
        ```python
        trainer = Trainer(callbacks=[ModelSummary(max_depth=2)])
        ```
    """

    _options: tuple[str, ...] = ()

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        # the class whose `summarize` runs knows its options; a user's override of `summarize` takes any
        renderer = next(cls for cls in type(self).__mro__ if "summarize" in cls.__dict__)
        unknown = sorted(set(summarize_kwargs) - set(self._options))
        if unknown and "_options" in renderer.__dict__:
            raise TypeError(f"{type(self).__name__} got unexpected options {unknown}; "
                            "override `summarize` in a subclass to use options of your own.")
        self._max_depth = max_depth
        self._summarize_kwargs = summarize_kwargs

    @property
    def max_depth(self) -> int:
        return self._max_depth

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._max_depth or not trainer.is_global_zero:
            return
        example = pl_module.example_input_array if trainer.world_size == 1 else None
        data = summary_of(pl_module, self._max_depth, example, trainer.strategy.precision)
        self.summarize(data.columns, data.total_parameters, data.trainable_parameters, data.model_size,
                       data.total_training_modes, total_flops=data.total_flops, **self._summarize_kwargs)

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        """Print the summary (Lightning's hook: override it to render the same data another way)."""
        data = SummaryData(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                           total_flops)
        rank_zero_info("\n" + format_summary(data))
