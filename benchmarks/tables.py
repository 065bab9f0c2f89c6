"""Markdown tables of a result file's figures: what the scripts print and docs/benchmarks.md shows.

Pure formatting (no torch, no matplotlib), so every script and the docs generator share one layout.
"""

from __future__ import annotations

from typing import Any


def fmt(x: float | None, unit: str = "") -> str:
    """A figure's number at a precision that suits its size (three significant digits, thousands grouped)."""
    if x is None:
        return "–"
    size = abs(x)
    text = f"{x:,.0f}" if size >= 100 else f"{x:.1f}" if size >= 10 else f"{x:.2f}" if size >= 1 else f"{x:.3f}"
    return f"{text} {unit}".strip()


def spread(f: dict[str, Any]) -> str:
    """'min–max' over the rounds (or just the value when there was one)."""
    if f["n"] < 2 or f["min"] == f["max"]:
        return f"n = {f['n']}" if f["n"] > 1 else "1 run"
    return f"{fmt(f['min'])}–{fmt(f['max'])}"


def vs_baseline(f: dict[str, Any]) -> str:
    """'1.048x (1.004–1.204)' and/or '+0.105 s': the paired ratio with its range, the paired difference."""
    if f["baseline"] is None:
        return "baseline" if f["role"] == "baseline" else ""
    parts = []
    if f["ratio"] is not None:
        ratio = f"{f['ratio']:.3f}x"
        if f["ratio_min"] is not None and f["ratio_min"] != f["ratio_max"]:
            ratio += f" ({f['ratio_min']:.3f}–{f['ratio_max']:.3f})"
        parts.append(ratio)
    if f["delta"] is not None:
        parts.append(f"{'+' if f['delta'] >= 0 else '−'}{fmt(abs(f['delta']), f['unit'])}")
    return ", ".join(parts)


def target_cell(f: dict[str, Any]) -> str:
    """'≤ 1.03x: met', '≤ 0.15 s over baseline: **missed**', or the figure's note."""
    note = f.get("note") or ""
    if f["target"] is None:
        return note
    op = "≤" if f["better"] == "lower" or f["target_on"] == "delta" else "≥"
    limit = {"ratio": f"{f['target']:.2f}x", "delta": f"+{fmt(f['target'], f['unit'])}",
             "value": fmt(f["target"], f["unit"])}[f["target_on"]]
    verdict = "met" if f["target_met"] else "**missed**" if f["target_met"] is False else "not measured"
    return f"{op} {limit}: {verdict}" + (f"; {note}" if note else "")


def figures_table(figures: list[dict[str, Any]]) -> str:
    """One row per figure: median (with unit), min–max over rounds, against its baseline, target and verdict."""
    labels = {f["name"]: f["label"] for f in figures}
    baselines = {f["baseline"] for f in figures if f["baseline"] is not None}
    with_base = len(baselines) > 1  # several baselines in one table: say which one each row is against
    head = ["figure", "median", "min–max"] + (["baseline"] if with_base else []) + ["vs baseline", "target"]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|" + ("---|" if with_base else "") + "---:|---|"]
    for f in figures:
        label = f"**{f['label']}**" if f["role"] == "ours" else f["label"]
        cells = [label, fmt(f["median"], f["unit"]), spread(f)]
        if with_base:
            cells.append(labels.get(f["baseline"], "") if f["baseline"] else "")
        cells += [vs_baseline(f), target_cell(f)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
