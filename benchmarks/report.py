"""Regenerate docs/benchmarks.md and its plots (docs/img/bench_<name>.png) from the result files.

Only the parts between `<!-- generated:NAME start -->` and `<!-- generated:NAME end -->` are rewritten, so the
page's hand-written prose stays; `NAME` is `summary` or a benchmark's name. A benchmark whose markers are
missing gets a new section at the end of the page. A benchmark without a result shows as "not run".

    python benchmarks/report.py [--results-dir DIR] [--docs PATH] [--img-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from suite import BENCHMARKS, PUBLISHED, RESULTS, Benchmark
from tables import figures_table, fmt

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks.md"
IMG = REPO / "docs" / "img"
ROLE_COLOURS = {"baseline": "#8c8c8c", "ours": "#1f77b4", "lightning": "#8e44ad", "reference": "#c7c7c7"}


def marker(name: str, edge: str) -> str:
    return f"<!-- generated:{name} {edge} -->"


def anchor(title: str) -> str:
    """The id a Markdown renderer (GitHub, mkdocs) gives the heading `## title`."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def load_results(results_dir: Path) -> dict[str, dict[str, Any]]:
    """name -> result, from `results_dir`, else from benchmarks/published/ (results made elsewhere, e.g. GPU)."""
    found = {}
    for bench in BENCHMARKS:
        for folder in (results_dir, PUBLISHED):
            path = folder / f"{bench.name}.json"
            if path.is_file():
                found[bench.name] = json.loads(path.read_text())
                break
    return found


# --- text --------------------------------------------------------------------------------------------------
def provenance(result: dict[str, Any]) -> str:
    """One line: when, in which mode, on what, with which code."""
    m = result["machine"]
    parts = [f"Measured {result['date'].replace('T', ' ')[:16]}", f"{result['mode']} mode"]
    parts.append(m["gpu"] if m.get("gpu") else f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores")
    parts += [f"Python {m.get('python')}", f"torch {m.get('torch')}"]
    if m.get("lightning"):
        parts.append(f"Lightning {m['lightning']}")
    parts.append(f"commit `{m.get('git_commit')}`")
    if m.get("load_average"):
        parts.append(f"load average {m['load_average'][0]:.1f} at the end")
    parts.append(f"{result['elapsed_s']:.0f} s")
    return " · ".join(parts) + "."


def verdicts(result: dict[str, Any] | None) -> tuple[int, int]:
    """(targets missed, targets set) in a result."""
    if result is None:
        return 0, 0
    judged = [f["target_met"] for f in result["figures"] if f["target"] is not None]
    return judged.count(False), len(judged)


def vs_baseline_short(f: dict[str, Any]) -> str:
    """The paired difference where there is one (import time, time to first step) and the target is not a ratio,
    else the paired ratio."""
    if f["delta"] is not None and not (f.get("target_on") == "ratio" and f["ratio"] is not None):
        return f"{'+' if f['delta'] >= 0 else '−'}{fmt(abs(f['delta']), f['unit'])}"
    return f"{f['ratio']:.3f}x" if f["ratio"] is not None else "–"


def summary_block(results: dict[str, dict[str, Any]], suite: dict[str, Any]) -> str:
    lines = ["| benchmark | target | headline (ours) | verdict | measured |", "|---|---|---|---|---|"]
    for bench in BENCHMARKS:
        result = results.get(bench.name)
        link = f"[{bench.title}](#{anchor(bench.title)})"
        if result is None:
            status = suite.get("runs", {}).get(bench.name, {}).get("status", "not run")
            lines.append(f"| {link} | {bench.targets or '–'} | – | {status} | – |")
            continue
        shown = [f for f in result["figures"] if f["target"] is not None] or \
                [f for f in result["figures"] if f["role"] == "ours" and f["baseline"]][:2]
        headline = "; ".join(f"{f['label']}: {fmt(f['median'], f['unit'])} ({vs_baseline_short(f)})" for f in shown)
        missed, total = verdicts(result)
        verdict = "–" if total == 0 else "met" if missed == 0 else f"**missed** ({missed} of {total} targets)"
        lines.append(f"| {link} | {bench.targets or '–'} | {headline} | {verdict} "
                     f"| {result['date'][:10]}, {result['mode']} |")
    if suite.get("seconds"):
        ran = [n for n in suite["benchmarks"] if not suite["runs"][n]["status"].startswith("not run")]
        lines += ["", f"The last `run_all.py` run ({suite['mode']} mode, {suite['date'][:16].replace('T', ' ')}; "
                      f"{len(ran)} benchmark{'s' * (len(ran) != 1)}: {', '.join(ran)}) took "
                      f"{suite['seconds'] / 60:.1f} minutes."]
    return "\n".join(lines)


def overhead_extra(result: dict[str, Any]) -> list[str]:
    """CPU-time ratios; and where the time goes, under cProfile, when an overhead target is missed."""
    lines = []
    cpu = [f"{r['label']} {r['cpu_step_ratio']:.3f}x" for r in result.get("results", [])
           if not r["name"].startswith("raw")]
    if cpu:
        lines += ["Per-thread CPU time per step against the raw loop's (medians over rounds; other processes on "
                  "the machine inflate wall time but hardly CPU time): " + ", ".join(cpu) + ".", ""]
    profile = result.get("profile")
    if not profile or verdicts(result)[0] == 0:
        return lines
    ours, raw = profile["ours"], profile["raw"]
    lines += [f"A target is missed in this run, so here is where the time goes: one more epoch of ours (no logging) "
             f"and of the raw loop under cProfile, {ours['steps']} steps. Under the profiler a step costs "
             f"{ours['total_us_per_step']:.0f} µs (ours) vs {raw['total_us_per_step']:.0f} µs (raw); the "
             f"framework's own functions account for {ours['framework_own_us_per_step']:.0f} µs of it. cProfile "
             "inflates Python calls, so these rank the hot spots rather than time them. Framework functions by "
             "own time:", "", "| function | calls/step | own µs/step | cumulative µs/step |", "|---|---:|---:|---:|"]
    for e in ours["top_framework"]:
        lines.append(f"| `{e['function']}` | {e['calls_per_step']:.3g} | {e['own_us_per_step']:.1f} "
                     f"| {e['cumulative_us_per_step']:.1f} |")
    return lines


def import_extra(result: dict[str, Any]) -> list[str]:
    tree = result.get("import_tree")
    if not tree or not tree.get("modules"):
        return []
    lines = [f"What `import trainer` adds beyond torch (one `python -X importtime` run; {tree['total_s']:.2f} s "
             f"there), the framework's modules and what they import, above {tree['share']:.0%} of it:", ""]
    for m in tree["modules"]:
        lines.append(f"{'  ' * m['depth']}- `{m['module']}`: {m['cumulative_s']:.3f} s")
    return lines


def scale_extra(result: dict[str, Any]) -> list[str]:
    """Every figure of the scale study per world size, and its slope extrapolated to 64 and 512 ranks."""
    summary, trend = result.get("summary"), result.get("trend", {})
    if not summary:
        return []
    lines = ["Per rank (the largest rank's where ranks differ; CPU time: the median rank's). CPU µs: the main "
             "thread's per steady step, ours and the raw script's (8 ranks share 2 cores: the noise is milliseconds, "
             "so read the lines column, which is exact). Sent: MiB per step, ours / raw / formula. Launch: seconds "
             "to the first step, ours / raw.", "",
             "| strategy | ranks | model state MiB (formula) | CPU µs ours / raw | our lines per step | sent MiB "
             "(ours / raw / formula) | launch s (ours / raw) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for case, rows in summary.items():
        for r in rows:
            launch = f"{r['launch_s_ours']:.1f} / {r['launch_s_raw']:.1f}" if "launch_s_ours" in r else "–"
            lines.append(f"| {case} | {r['world']} | {r['model_state_mib']:.2f} ({r['formula_mib']:.2f}) | "
                         f"{r['cpu_us_ours']:,.0f} / {r['cpu_us_raw']:,.0f} | {r['our_lines_per_step']:.0f} | "
                         f"{r['sent_mib_ours']:.2f} / {r['sent_mib_raw']:.2f} / {r['sent_mib_formula']:.2f} | "
                         f"{launch} |")
    words = {"cpu_us_beyond_raw": "CPU µs per step beyond raw", "our_lines_per_step": "our lines per step",
             "sent_mib_beyond_raw": "MiB sent per step beyond raw", "launch_s_beyond_raw": "launch s beyond raw"}
    lines += ["", "The line through the world sizes above 1 (least squares), extrapolated, for what is exact (CPU time "
              "and launch are shown above, not extrapolated: on 2 cores their noise is far above what our code adds):",
              "",
              "| strategy | figure | per added rank | at 64 ranks | at 512 ranks |", "|---|---|---:|---:|---:|"]
    for case, figures in trend.items():
        for key, t in figures.items():
            lines.append(f"| {case} | {words.get(key, key)} | {t['per_rank']:+.3g} | {fmt(t['at_64'])} | "
                         f"{fmt(t['at_512'])} |")
    lines += ["", "![The scale study against the world size](img/scale_world.png)"]
    return lines


EXTRAS = {"overhead": overhead_extra, "import_time": import_extra, "scale": scale_extra}


def section_block(bench: Benchmark, result: dict[str, Any] | None, status: str | None, img: str | None) -> str:
    if result is None:
        why = status or "no result file yet"
        run = "`python benchmarks/run_all.py --only " + bench.name + "`"
        return f"Not run: {why}." + ("" if not bench.present else f" Run {run}.") + (
            f" Target: {bench.targets}." if bench.targets else "")
    lines = [provenance(result), ""]
    if bench.targets:
        lines += [f"Target: {bench.targets}.", ""]
    lines.append(figures_table(result["figures"]))
    if img:
        lines += ["", f"![{bench.title}]({img})"]
    extra = EXTRAS.get(bench.name, lambda r: [])(result)
    if extra:
        lines += [""] + extra
    if bench.details:
        lines += ["", f"More: [{bench.details.split('#')[0]}]({bench.details})."]
    return "\n".join(lines)


def replace_block(text: str, name: str, body: str, title: str, later: Sequence[str] = ()) -> str:
    """Put `body` between the markers of `name`; a page without them gets a new section holding them, placed
    before the section of the first of `later` (the benchmarks after it in suite order) that the page has,
    else at the end, so that the page keeps the suite's order."""
    start, end = marker(name, "start"), marker(name, "end")
    block = f"{start}\n{body}\n{end}"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    section = f"## {title}\n\n{block}\n"
    for other in later:
        at = text.find(marker(other, "start"))
        heading = text.rfind("\n## ", 0, at) if at >= 0 else -1
        if heading >= 0:
            return f"{text[:heading + 1]}{section}\n{text[heading + 1:]}"
    return text.rstrip("\n") + f"\n\n{section}"


# --- plots -------------------------------------------------------------------------------------------------
def limit_of(f: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> float | None:
    """Where a figure's target lies in its own unit (for the red tick), or None."""
    if f["target"] is None:
        return None
    if f["target_on"] == "value":
        return float(f["target"])
    base = by_name.get(f["baseline"] or "")
    if base is None:
        return None
    return base["median"] * f["target"] if f["target_on"] == "ratio" else base["median"] + f["target"]


def plot(title: str, result: dict[str, Any], path: Path) -> None:
    """Horizontal bars (median, whiskers min–max) per figure, one panel per unit; targets as red ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = result["figures"]
    by_name = {f["name"]: f for f in figs}
    units = list(dict.fromkeys(f["unit"] for f in figs))
    counts = [sum(f["unit"] == u for f in figs) for u in units]
    fig, axes = plt.subplots(len(units), 1, figsize=(8, 0.9 + 0.28 * len(figs) + 0.55 * len(units)),
                             gridspec_kw={"height_ratios": counts}, squeeze=False)
    for ax, unit in zip(axes[:, 0], units, strict=True):
        group = [f for f in figs if f["unit"] == unit]
        ys = list(range(len(group)))[::-1]
        med = [f["median"] for f in group]
        err = [[m - f["min"] for m, f in zip(med, group, strict=True)],
               [f["max"] - m for m, f in zip(med, group, strict=True)]]
        ax.barh(ys, med, xerr=err, color=[ROLE_COLOURS.get(f["role"], "#c7c7c7") for f in group], capsize=2,
                error_kw={"elinewidth": 0.8})
        ax.set_yticks(ys, [f["label"] if len(f["label"]) <= 48 else f["label"][:47] + "…" for f in group], fontsize=7)
        for y, f in zip(ys, group, strict=True):
            ax.annotate(fmt(f["median"]), (f["max"], y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=6)
            limit = limit_of(f, by_name)
            if limit is not None:
                ax.plot([limit], [y], marker="|", markersize=11, markeredgewidth=2, color="#d62728")
        ax.set_xlabel(unit, fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.margins(x=0.12)
    ticks = "; red tick = target" if any(f["target"] is not None for f in figs) else ""
    axes[0, 0].set_title(f"{title} ({result['mode']}, {result['date'][:10]}){ticks}", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


# --- entry point -------------------------------------------------------------------------------------------
def generate(results_dir: Path = RESULTS, docs: Path | None = None, img_dir: Path | None = None) -> list[Path]:
    """Rewrite the generated blocks of `docs` and the plots in `img_dir`; the paths written."""
    docs, img_dir = docs or DOCS, img_dir or IMG
    results = load_results(results_dir)
    suite_file = results_dir / "suite.json"
    suite = json.loads(suite_file.read_text()) if suite_file.is_file() else {}
    text = docs.read_text() if docs.is_file() else "# Benchmarks\n"
    text = replace_block(text, "summary", summary_block(results, suite), "Summary")
    written = []
    for bench in BENCHMARKS:
        result = results.get(bench.name)
        img = None
        if result is not None and result["figures"]:
            png = img_dir / f"bench_{bench.name}.png"
            plot(bench.title, result, png)
            written.append(png)
            img = os.path.relpath(png, docs.parent)
        status = suite.get("runs", {}).get(bench.name, {}).get("status")
        later = [b.name for b in BENCHMARKS[BENCHMARKS.index(bench) + 1:]]
        text = replace_block(text, bench.name, section_block(bench, result, status, img), bench.title, later)
    docs.write_text(text)
    return [docs, *written]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--img-dir", type=Path, default=IMG)
    args = parser.parse_args(argv)
    for path in generate(args.results_dir, args.docs, args.img_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
