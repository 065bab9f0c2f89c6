"""SimpleProfiler: wall time per action (calls, mean, total, share of the run), Lightning's `SimpleProfiler`."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path

from trainer.profilers.base import Profiler


class SimpleProfiler(Profiler):
    """Durations per action. `extended=True` adds the number of calls and each action's share of the run.

    Example:
        ```python
        trainer = Trainer(profiler=SimpleProfiler(filename="perf"))  # <log_dir>/fit-perf.txt
        ```
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 extended: bool = True) -> None:
        super().__init__(dirpath, filename)
        self.extended = extended
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"SimpleProfiler: {action_name!r} was started twice without a stop in between.")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        now = time.perf_counter()
        if action_name not in self.current_actions:
            raise ValueError(f"SimpleProfiler: {action_name!r} was stopped without being started.")
        self.recorded_durations[action_name].append(now - self.current_actions.pop(action_name))

    def summary(self) -> str:
        if not self.recorded_durations:
            return ""
        elapsed = time.perf_counter() - self.start_time
        rows = []
        for action, durations in self.recorded_durations.items():
            total = math.fsum(durations)
            rows.append((action, total / len(durations), len(durations), total, 100.0 * total / elapsed))
        rows.sort(key=lambda row: row[3], reverse=True)
        width = max(len("Action"), *(len(row[0]) for row in rows))
        head: tuple[str, ...]
        body: list[tuple[str, ...]]
        if self.extended:
            head = ("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            body = [(a, f"{m:.5g}", str(n), f"{t:.5g}", f"{p:.3g}") for a, m, n, t, p in rows]
            total_row = ("Total", "-", str(sum(r[2] for r in rows)), f"{elapsed:.5g}", "100")
            body = [total_row, *body]
        else:
            head = ("Action", "Mean duration (s)", "Total time (s)")
            body = [(a, f"{m:.5g}", f"{t:.5g}") for a, m, _, t, _ in rows]
        line = "| " + " | ".join([f"{{:<{width}}}", *["{:<17}"] * (len(head) - 1)]) + " |"
        rule = "-" * len(line.format(*head))
        return "\n".join([self.header(), rule, line.format(*head), rule, *(line.format(*r) for r in body), rule])

    def teardown(self, stage: str | None) -> None:
        self.current_actions.clear()
