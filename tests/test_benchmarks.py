"""Every benchmark runs end to end in quick mode and writes a well-formed result file; the driver runs them side by
side, records the absent ones and generates docs/benchmarks.md from the results.

Figures are never asserted (timings on a shared CI machine say nothing); only that each benchmark ran, exited
cleanly and wrote the keys docs/benchmarks.md is generated from. Each benchmark is a test of its own, with no limit
on the time it takes beyond the suite's own hang bound per benchmark (Benchmark.timeout_s: run_all.py ends a
benchmark past it and fails it), so a slow or busy machine makes the tests slower, never failed. Everything goes to
temp folders: the repo's benchmarks/results/ and docs/ are left alone.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
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
EXPECTED = [b for b in suite.BENCHMARKS if b.present and not b.needs_cuda and not b.missing_tools]
ABSENT = [b for b in suite.BENCHMARKS if b not in EXPECTED]
HANG_BOUND_S = max(b.timeout_s for b in suite.BENCHMARKS) + 120  # run_all.py's bound per benchmark, then its exit
SMALLEST = "precision"  # the quickest benchmark in quick mode: the one the driver test runs
pytestmark = pytest.mark.timeout(HANG_BOUND_S)


def _run_all(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "run_all.py"), *args], capture_output=True, text=True)


@pytest.fixture(scope="module", params=EXPECTED, ids=lambda b: b.name)
def quick_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
              ) -> tuple[Any, subprocess.CompletedProcess, Path]:
    """One benchmark in quick mode through run_all.py: (its entry, the driver's outcome, the results folder)."""
    bench = request.param
    results = tmp_path_factory.mktemp(bench.name) / "results"
    return bench, _run_all("--quick", "--only", bench.name, "--results-dir", str(results), "--no-docs"), results


@pytest.fixture(scope="module")
def driver_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """The quickest benchmark and every absent one, two at a time, as CI's quick run does with all of them."""
    results = tmp_path_factory.mktemp("driver") / "results"
    names = ",".join([SMALLEST, *(b.name for b in ABSENT)])
    return _run_all("--quick", "--jobs", "2", "--only", names, "--results-dir", str(results), "--no-docs"), results


def _result(results: Path, name: str) -> dict[str, Any]:
    return json.loads((results / f"{name}.json").read_text())


@pytest.mark.subprocess
def test_quick_benchmark_exits_cleanly(quick_run):
    bench, done, results = quick_run
    status = json.loads((results / "suite.json").read_text())["runs"][bench.name]["status"]
    assert (done.returncode, status) == (0, "ok"), done.stdout[-4000:] + done.stderr[-4000:]


@pytest.mark.subprocess
def test_result_file_has_the_expected_keys(quick_run):
    bench, _, results = quick_run
    result = _result(results, bench.name)
    assert (set(common.RESULT_KEYS) <= set(result), result["benchmark"], result["mode"]) == (True, bench.name, "quick")


@pytest.mark.subprocess
def test_machine_info_is_recorded(quick_run):
    bench, _, results = quick_run
    assert set(common.MACHINE_KEYS) <= set(_result(results, bench.name)["machine"])


@pytest.mark.subprocess
def test_every_figure_is_complete(quick_run):
    bench, _, results = quick_run
    figures = _result(results, bench.name)["figures"]
    names = {f["name"] for f in figures}
    bad = [f["name"] for f in figures
           if set(f) != set(common.FIGURE_KEYS) or not all(math.isfinite(f[k]) for k in ("min", "median", "max"))
           or (f["baseline"] is not None and (f["baseline"] not in names or f["ratio"] is None))]
    assert figures and not bad


@pytest.mark.subprocess
def test_docs_section_and_plot_are_generated_from_the_result(quick_run, tmp_path):
    bench, _, results = quick_run
    docs = tmp_path / "benchmarks.md"
    shutil.copy(BENCH.parent / "docs" / "benchmarks.md", docs)
    _load("report").generate(results, docs=docs, img_dir=tmp_path / "img")
    assert (tmp_path / "img" / f"bench_{bench.name}.png").is_file()
    assert f"<!-- generated:{bench.name} start -->\nMeasured" in docs.read_text()


@pytest.mark.subprocess
def test_quick_suite_exits_cleanly(driver_run):
    done, _ = driver_run
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


@pytest.mark.subprocess
def test_absent_benchmarks_are_recorded_as_not_run(driver_run):
    runs = json.loads((driver_run[1] / "suite.json").read_text())["runs"]
    assert runs[SMALLEST]["status"] == "ok"
    assert all(runs[b.name]["status"].startswith("not run") for b in ABSENT)


@pytest.mark.subprocess
def test_docs_are_generated_from_the_results(driver_run, tmp_path):
    docs = tmp_path / "benchmarks.md"
    shutil.copy(BENCH.parent / "docs" / "benchmarks.md", docs)
    done = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--report", "--results-dir",
                           str(driver_run[1]), "--docs", str(docs), "--img-dir", str(tmp_path / "img")],
                          capture_output=True, text=True, timeout=120)
    text = docs.read_text()
    assert (done.returncode, (tmp_path / "img" / f"bench_{SMALLEST}.png").is_file()) == (0, True), done.stderr[-4000:]
    assert f"<!-- generated:{SMALLEST} start -->\nMeasured" in text
    assert all(f"<!-- generated:{b.name} start -->" in text for b in suite.BENCHMARKS)


@pytest.mark.subprocess
def test_gpu_benchmark_smoke_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--smoke", "--no-lightning", "--out", str(out)],
                          capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONPATH": str(BENCH.parent)})
    assert done.returncode == 0 and json.loads(out.read_text())["mode"] == "smoke", done.stderr[-4000:]


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
