"""PyTorchProfiler: `torch.profiler` around the run, each action a `record_function` range (Lightning's
`PyTorchProfiler`). The trace of every rank is written as a Chrome trace, `<stage>-<filename>-<rank>.pt.trace.json`
in `dirpath` (the run's log folder by default), which chrome://tracing, Perfetto and TensorBoard's profiler plugin
(torch-tb-profiler, pointed at that folder) open; the report is torch's operator table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.profilers.base import Profiler


class PyTorchProfiler(Profiler):
    """Args as Lightning's: `group_by_input_shapes` (record shapes and group the table by them), `export_to_chrome`,
    `row_limit` and `sort_by_key` for the table, `record_module_names` (kept for compatibility: torch records
    module names in the trace with `with_modules=True`), and `**profiler_kwargs` for `torch.profiler.profile`
    (`activities`, `profile_memory`, `with_stack`, ...).

    Example:
        ```python
        trainer = Trainer(profiler=PyTorchProfiler(filename="trace", profile_memory=True))
        ```
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 group_by_input_shapes: bool = False, emit_nvtx: bool = False, export_to_chrome: bool = True,
                 row_limit: int = 20, sort_by_key: str | None = None, record_module_names: bool = True,
                 **profiler_kwargs: Any) -> None:
        super().__init__(dirpath, filename)
        if emit_nvtx:
            raise ValueError("PyTorchProfiler(emit_nvtx=True) is not supported; use torch.autograd.profiler.emit_nvtx"
                             " around trainer.fit() with nsys.")
        self.group_by_input_shapes = group_by_input_shapes
        self.export_to_chrome = export_to_chrome
        self.row_limit = row_limit
        self.sort_by_key = sort_by_key
        self.record_module_names = record_module_names
        self.profiler_kwargs = {"record_shapes": group_by_input_shapes, "with_modules": record_module_names,
                                **profiler_kwargs}
        self._profiler: Any = None
        self._ranges: dict[str, Any] = {}
        self.trace_path: Path | None = None  # where the last trace was written

    def start(self, action_name: str) -> None:
        if self._profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            kwargs = {"activities": activities, **self.profiler_kwargs}
            self._profiler = torch.profiler.profile(**kwargs)
            self._profiler.__enter__()
        span = torch.profiler.record_function(action_name)
        span.__enter__()
        self._ranges[action_name] = span

    def stop(self, action_name: str) -> None:
        span = self._ranges.pop(action_name, None)
        if span is None:
            raise ValueError(f"PyTorchProfiler: {action_name!r} was stopped without being started.")
        span.__exit__(None, None, None)

    def summary(self) -> str:
        if self._profiler is None:
            return ""
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        if self.export_to_chrome:
            path = self.report_path(".pt.trace.json") or (
                Path(self.dirpath) / f"{self._stage or 'run'}-profile-{self.local_rank}.pt.trace.json"
                if self.dirpath else None)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                profiler.export_chrome_trace(str(path))
                self.trace_path = path
        averages = profiler.key_averages(group_by_input_shape=self.group_by_input_shapes)
        sort_by = self.sort_by_key or ("cuda_time_total" if torch.cuda.is_available() else "cpu_time_total")
        return "\n".join([self.header(), averages.table(sort_by=sort_by, row_limit=self.row_limit)])

    def teardown(self, stage: str | None) -> None:
        for span in reversed(list(self._ranges.values())):
            span.__exit__(None, None, None)
        self._ranges.clear()
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None
