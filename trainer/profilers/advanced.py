"""AdvancedProfiler: Python's cProfile per action (Lightning's `AdvancedProfiler`): for every action, the functions
it spent its time in, by cumulative time."""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path

from trainer.profilers.base import Profiler


class AdvancedProfiler(Profiler):
    """One `cProfile.Profile` per action; the report lists each action's top functions by cumulative time.

    Args:
        line_count_restriction: how many lines of each action's stats to keep (an int, or a fraction of them).
        dump_stats: also write each action's raw stats as `<stage>-<filename>-<rank>-<action>.prof` for snakeviz or
            `pstats`.

    Example:
        ```python
        trainer = Trainer(profiler=AdvancedProfiler(filename="cprofile", line_count_restriction=20))
        ```
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 line_count_restriction: float = 1.0, dump_stats: bool = False) -> None:
        super().__init__(dirpath, filename)
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self.profiled_actions: dict[str, cProfile.Profile] = {}

    def start(self, action_name: str) -> None:
        profiler = self.profiled_actions.setdefault(action_name, cProfile.Profile())
        profiler.enable()

    def stop(self, action_name: str) -> None:
        profiler = self.profiled_actions.get(action_name)
        if profiler is None:
            raise ValueError(f"AdvancedProfiler: {action_name!r} was stopped without being started.")
        profiler.disable()

    def summary(self) -> str:
        if not self.profiled_actions:
            return ""
        sections = [self.header()]
        for action, profiler in self.profiled_actions.items():
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.strip_dirs().sort_stats("cumulative").print_stats(self.line_count_restriction)
            if self.dump_stats and (path := self.report_path(".prof", action)) is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                stats.dump_stats(str(path))
            rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
            sections += [f"Profile stats for: {action}{rank}", text.getvalue()]
        return "\n".join(sections)

    def teardown(self, stage: str | None) -> None:
        self.profiled_actions.clear()  # a cProfile.Profile does not pickle (ddp_spawn sends the Trainer along)
