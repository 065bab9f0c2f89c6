"""The table rank 0 prints after `validate()`/`test()` with `verbose=True`, laid out as Lightning 2.x prints it when
rich is not installed: a rule, a header row ("Validate metric", "DataLoader 0", ...), a rule, one row per metric
(sorted by name, the `/dataloader_idx_N` suffix dropped), a rule; every column centred in the same width."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from typing import Any

from torch import Tensor

_MIN_WIDTH = 25


def _text(value: Any) -> str:
    if isinstance(value, Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    return f"{value}"


def _rule_character() -> str:
    try:
        "─".encode(sys.stdout.encoding or "utf-8")
    except UnicodeEncodeError:
        return "-"
    return "─"


def format_results(results: Sequence[dict[str, Any]], stage: str) -> str:
    """The table for `results` (one dict per dataloader), or "" when nothing was logged."""
    results = [{key.split("/dataloader_idx_")[0]: value for key, value in result.items()} for result in results]
    names = sorted({key for result in results for key in result})
    if not names:
        return ""
    headers = [f"DataLoader {index}" for index in range(len(results))]
    columns = shutil.get_terminal_size(fallback=(120, 30)).columns or 120
    width = int(min(max(len(max(names, key=len)), len(max(headers, key=len)), _MIN_WIDTH), columns / 2))
    per_table = max(1, int((columns - width) / width))
    rule = _rule_character() * columns
    lines: list[str] = []
    for start in range(0, len(headers), per_table):
        shown = range(start, min(start + per_table, len(headers)))
        row = f"{{:^{width}}}" * (len(shown) + 1)
        lines += [rule, row.format(f"{stage} metric".capitalize(), *(headers[i] for i in shown)).rstrip(), rule]
        for name in names:
            cells = [_text(results[i][name]) if name in results[i] else " " for i in shown]
            lines.extend(_wrapped(row, name, cells, columns // 2))
        lines.append(rule)
    return "\n".join(lines)


def _wrapped(row: str, name: str, cells: list[str], limit: int) -> list[str]:
    """A metric name longer than half the terminal is cut into lines of that length, each with the values (as
    Lightning prints it), the rest of the name on a last line of its own."""
    if len(name) <= limit:
        return [row.format(name, *cells).rstrip()]
    out = []
    while len(name) > limit:
        out.append(row.format(name[:limit], *cells).rstrip())
        name = name[limit:]
    out.append(row.format(name, *[" "] * len(cells)).rstrip())
    return out


def print_results(results: Sequence[dict[str, Any]], stage: str) -> None:
    table = format_results(results, stage)
    if table:
        print(table)
