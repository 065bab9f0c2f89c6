"""The benchmark suite runs end to end in quick mode and writes well-formed result files.

Figures are never asserted (timings on a shared CI machine say nothing); only that every benchmark ran, exited
cleanly and wrote the keys docs/benchmarks.md is generated from. The quick suite runs once, two benchmarks at a time,
in the background; each benchmark's tests wait for run_all.py to report that benchmark. No limit is put on the
suite's time: run_all.py ends a benchmark that passes its own bound (Benchmark.timeout_s) and reports it failed, so a
busy machine makes these tests slower, not failed, and a hung benchmark fails its own tests by name. Everything goes
to temp folders: the repo's benchmarks/results/ and docs/ are left alone.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the benchmark modules import each other by bare name
    try:
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


suite = _load("suite")
common = _load("common")
EXPECTED = [b for b in suite.BENCHMARKS if b.present and b.in_suite and not b.needs_cuda and not b.missing_tools]
# A test waits for one benchmark at most run_all.py's bound for it (then run_all reports it failed), plus start-up.
pytestmark = pytest.mark.timeout(max(b.timeout_s for b in suite.BENCHMARKS) + 120)


class QuickRun:
    """`run_all.py --quick --jobs 2` running in the background, its output in a file."""

    def __init__(self, folder: Path) -> None:
        self.results, self.log = folder / "results", folder / "run_all.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(BENCH / "run_all.py"), "--quick", "--jobs", "2", "--results-dir",
                 str(self.results), "--no-docs"], stdout=out, stderr=subprocess.STDOUT, text=True)

    def status(self, name: str) -> str:
        """What run_all.py reported for benchmark `name` ("ok", "failed (...)"), once it has."""
        line = re.compile(rf"^=== {re.escape(name)}: (ok|failed.*) in \d+ s$", re.M)
        while True:
            ended = self.process.poll() is not None
            found = line.search(self.log.read_text())
            if found or ended:
                return found.group(1) if found else f"not reported (run_all.py exited {self.process.returncode})"
            time.sleep(0.5)

    def returncode(self) -> int:
        return self.process.wait()

    def output(self) -> str:
        return self.log.read_text()[-6000:]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickRun]:
    run = QuickRun(tmp_path_factory.mktemp("bench"))
    yield run
    if run.process.poll() is None:  # only when a test failed before the suite ended
        run.process.kill()
        run.process.wait()


@pytest.fixture(scope="module", params=EXPECTED, ids=lambda b: b.name)
def bench(request: pytest.FixtureRequest, quick_run: QuickRun) -> Any:
    """A benchmark of the quick run, once run_all.py has reported it ran fine."""
    status = quick_run.status(request.param.name)
    assert status == "ok", f"{request.param.name}: {status}\n{quick_run.output()}"
    return request.param


def _result(run: QuickRun, name: str) -> dict[str, Any]:
    return json.loads((run.results / f"{name}.json").read_text())


@pytest.mark.subprocess
def test_result_file_has_the_expected_keys(quick_run, bench):
    result = _result(quick_run, bench.name)
    assert (set(common.RESULT_KEYS) <= set(result), result["benchmark"], result["mode"]) == (True, bench.name, "quick")


@pytest.mark.subprocess
def test_machine_info_is_recorded(quick_run, bench):
    assert set(common.MACHINE_KEYS) <= set(_result(quick_run, bench.name)["machine"])


@pytest.mark.subprocess
def test_every_figure_is_complete(quick_run, bench):
    figures = _result(quick_run, bench.name)["figures"]
    names = {f["name"] for f in figures}
    bad = [f["name"] for f in figures
           if set(f) != set(common.FIGURE_KEYS) or not all(math.isfinite(f[k]) for k in ("min", "median", "max"))
           or (f["baseline"] is not None and (f["baseline"] not in names or f["ratio"] is None))]
    assert figures and not bad


@pytest.mark.subprocess
def test_quick_suite_exits_cleanly(quick_run):
    assert quick_run.returncode() == 0, quick_run.output()


@pytest.mark.subprocess
def test_absent_benchmarks_are_recorded_as_not_run(quick_run):
    assert quick_run.returncode() is not None
    runs = json.loads((quick_run.results / "suite.json").read_text())["runs"]
    absent = [b.name for b in suite.BENCHMARKS if not b.present or b.needs_cuda or b.missing_tools]
    assert all(runs[name]["status"].startswith("not run") for name in absent)


@pytest.mark.subprocess
def test_docs_are_generated_from_the_results(quick_run, tmp_path):
    assert quick_run.returncode() is not None
    docs = tmp_path / "benchmarks.md"
    shutil.copy(BENCH.parent / "docs" / "benchmarks.md", docs)
    done = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--report", "--results-dir",
                           str(quick_run.results), "--docs", str(docs), "--img-dir", str(tmp_path / "img")],
                          capture_output=True, text=True)
    text = docs.read_text()
    missing = [b.name for b in EXPECTED if not (tmp_path / "img" / f"bench_{b.name}.png").is_file()
               or f"<!-- generated:{b.name} start -->\nMeasured" not in text]
    assert (done.returncode, missing) == (0, []), done.stderr[-4000:]


@pytest.mark.subprocess
def test_gpu_benchmark_smoke_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--smoke", "--no-lightning", "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(BENCH.parent)})
    assert done.returncode == 0 and json.loads(out.read_text())["mode"] == "smoke", done.stderr[-4000:]


@pytest.mark.subprocess
def test_gpu_diagnosis_smoke_runs_on_cpu(tmp_path):
    out = tmp_path / "diagnose.json"
    done = subprocess.run([sys.executable, str(BENCH / "gpu_diagnose.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(BENCH.parent)})
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert {"ops", "syncs", "python"} <= set(result["bf16-mixed"]), result.keys()


@pytest.mark.subprocess
def test_jobs_above_one_needs_quick_mode(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--jobs", "2", "--results-dir", str(tmp_path),
                           "--no-docs"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--quick" in done.stderr and not list(tmp_path.iterdir())


def test_a_new_section_goes_where_the_suite_puts_it():
    """A benchmark that has no section yet gets one before the next benchmark's, not at the end of the page."""
    report = _load("report")
    page = "# Benchmarks\n\n## B\n\n<!-- generated:b start -->\nold\n<!-- generated:b end -->\n\n## D\n\n" \
           "<!-- generated:d start -->\nd\n<!-- generated:d end -->\n"
    page = report.replace_block(page, "a", "new a", "A", later=["b", "d"])
    page = report.replace_block(page, "c", "new c", "C", later=["d"])
    page = report.replace_block(page, "e", "new e", "E", later=[])
    page = report.replace_block(page, "b", "new b", "B", later=["c", "d"])
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings == ["## A", "## B", "## C", "## D", "## E"]
    assert "<!-- generated:b start -->\nnew b\n<!-- generated:b end -->" in page and "old" not in page


def test_ddp_instructions_sums_rank_zeros_threads_per_step():
    ddp_instructions = _load("ddp_instructions")
    main = "desc: Trigger: Client Request: ours\nsummary: 600\ntotals: 600\n"
    gloo = "desc: Trigger: Program termination\ntotals: 30\n"
    counts = ddp_instructions.per_step([gloo, main, gloo, "desc: Trigger: Program termination\ntotals: 0\n"], 3)
    assert counts == {"main": 200.0, "all": 220.0}
    with pytest.raises(RuntimeError, match="found 0"):
        ddp_instructions.per_step([gloo], 3)
    figures = ddp_instructions.figures_for({"raw": {"main": 100.0, "all": 110.0}, "ours": counts})
    assert [f["name"] for f in figures] == ["raw_all", "ours_all", "raw_main", "ours_main"]
    assert figures[1]["ratio"] == 2.0 and figures[3]["ratio"] == 2.0 and figures[1]["delta"] == 110.0


def test_instruction_rows_are_paired_with_their_raw_counterpart(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # it imports overhead.py's pairing when called
    instructions = _load("instructions")
    assert instructions._chosen("ours_ema,ours_log", quick=False) == ("raw_ema", "raw", "ours_ema", "ours_log")
    counts = {"raw": 100.0, "raw_ema": 200.0, "ours": 102.0, "ours_ema": 212.0, "lightning_ema": 300.0}
    by_name = {f["name"]: f for f in instructions.figures_for(counts)}
    assert [(name, f["baseline"], f["ratio"], f["target_met"]) for name, f in by_name.items()] == [
        ("raw", None, None, None), ("raw_ema", None, None, None), ("ours", "raw", 1.02, True),
        ("ours_ema", "raw_ema", 1.06, False), ("lightning_ema", "raw_ema", 1.5, None)]
