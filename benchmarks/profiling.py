"""cProfile summaries for the docs: where a fit's time goes, per step, in the framework's own files.

cProfile adds a fixed cost to every Python call, so the per-step figures it gives are inflated, more so
for Python-heavy code than for torch's C++ work; they rank the hot spots, they are not step times.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FRAMEWORK_DIRS = ("trainer", "strategies", "callbacks")


def _where(file: str, line: int, func: str) -> str:
    if file == "~":  # a builtin, e.g. "<method 'backward' of 'torch._C.TensorBase' objects>"
        return func
    path = Path(file)
    try:
        shown = str(path.resolve().relative_to(REPO))
    except ValueError:
        parts = path.parts
        shown = "/".join(parts[parts.index("site-packages") + 1:]) if "site-packages" in parts else path.name
    return f"{shown}:{line}({func})"


def _is_framework(file: str) -> bool:
    try:
        rel = Path(file).resolve().relative_to(REPO)
    except ValueError:
        return False
    return rel.parts[0] in FRAMEWORK_DIRS


def profile_top(fn: Callable[[], Any], steps: int, limit: int = 12) -> dict[str, Any]:
    """Run `fn` under cProfile; the `limit` functions with the most own time, overall and in the framework.

    Times are divided by `steps`, so each entry reads as microseconds per training step.
    """
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    raw = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # {(file, line, func): (cc, nc, tt, ct, callers)}
    entries = []
    for (file, line, func), (_, ncalls, tottime, cumtime, _callers) in raw.items():
        entries.append({"function": _where(file, line, func), "framework": _is_framework(file),
                        "calls_per_step": round(ncalls / steps, 4), "own_us_per_step": round(tottime / steps * 1e6, 2),
                        "cumulative_us_per_step": round(cumtime / steps * 1e6, 2)})
    entries.sort(key=lambda e: e["own_us_per_step"], reverse=True)
    total = sum(e["own_us_per_step"] for e in entries)
    framework = [e for e in entries if e["framework"]]
    return {
        "steps": steps,
        "total_us_per_step": round(total, 1),
        "framework_own_us_per_step": round(sum(e["own_us_per_step"] for e in framework), 1),
        "top_overall": entries[:limit],
        "top_framework": framework[:limit],
    }
