"""RichModelSummary: ModelSummary's data drawn as a rich table (rich is imported only when the callback is made)."""

from __future__ import annotations

from typing import Any

from callbacks.model_summary import ModelSummary, human_count


def _require_rich(name: str) -> None:
    try:
        import rich  # noqa: F401
    except ImportError as err:
        raise ModuleNotFoundError(f"`{name}` needs the `rich` package: `pip install rich` "
                                  "(or this project's `rich` extra).", name="rich") from err


class RichModelSummary(ModelSummary):
    """`ModelSummary` rendered with rich: the same rows and totals, as a table on the console, on rank 0.

    Args:
        max_depth: deepest layers shown (1: the module's children; -1: all; 0: no summary).
        **summarize_kwargs: `header_style` (a rich style for the header row, default "bold magenta").

    Example:
        ```python
        trainer = Trainer(callbacks=[RichModelSummary(max_depth=2)])
        ```
    """

    _options = ("header_style",)

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        _require_rich("RichModelSummary")
        super().__init__(max_depth, **summarize_kwargs)

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        """Print the table and the totals with rich's console (the columns of Lightning's RichModelSummary)."""
        from rich import get_console
        from rich.table import Table

        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for header, _cells in summary_data:
            if header == " ":
                table.add_column(" ", style="dim")
            elif header in ("Params", "FLOPs"):
                table.add_column(header, justify="right")
            elif header in ("In sizes", "Out sizes"):
                table.add_column(header, justify="right", style="white")
            else:
                table.add_column(header, justify="left", no_wrap=header == "Name")
        for row in zip(*(cells for _, cells in summary_data), strict=True):
            table.add_row(*row)
        console = get_console()
        console.print(table)

        totals = Table.grid(expand=True)
        totals.add_column()
        for label, value in (
            ("Trainable params", human_count(trainable_parameters)),
            ("Non-trainable params", human_count(total_parameters - trainable_parameters)),
            ("Total params", human_count(total_parameters)),
            ("Total estimated model params size (MB)", f"{model_size:,.3f}"),
            ("Modules in train mode", str(total_training_modes["train"])),
            ("Modules in eval mode", str(total_training_modes["eval"])),
            ("Total FLOPs", human_count(total_flops)),
        ):
            totals.add_row(f"[bold]{label}[/]: {value:<10}")
        console.print(totals)
