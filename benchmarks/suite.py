"""The benchmark suite: every benchmark `make bench` runs, in order, with its arguments and its targets.

Adding a benchmark is one entry here. Its script lives in benchmarks/, accepts `--out PATH` (plus the
arguments below), and writes its result with `common.write_result(out, <name>, figures, ...)`. An entry
whose script is not there yet (or, with `needs_cuda`, on a machine without CUDA) is shown as "not run".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from shutil import which

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"  # git-ignored: every run writes here
PUBLISHED = HERE / "published"  # committed: results that cannot be re-made on the CPU machines (GPU)


@dataclass(frozen=True)
class Benchmark:
    """One entry of the suite."""

    name: str  # the result file's `benchmark` key and its file name (<name>.json)
    script: str  # file name in benchmarks/
    title: str
    targets: str  # what is aimed at, in words ("" when nothing is)
    full_args: tuple[str, ...] = ()  # `make bench` (sized to keep the whole suite within 15 minutes on 2 cores)
    quick_args: tuple[str, ...] = ("--quick",)  # `--quick` (the whole suite within 3 minutes; CI runs it)
    needs_cuda: bool = False
    needs_tools: tuple[str, ...] = ()  # programs it runs (valgrind, cc): without them it is "not run"
    timeout_s: int = 900  # per run; a hung benchmark fails instead of stalling the suite
    details: str = ""  # where the feature's own docs say more, relative to docs/
    in_suite: bool = True  # False: too long for `make bench`; runs when named (`--only`), reported like the others

    @property
    def path(self) -> Path:
        return HERE / self.script

    @property
    def present(self) -> bool:
        return self.path.is_file()

    @property
    def missing_tools(self) -> list[str]:
        return [tool for tool in self.needs_tools if which(tool) is None]

    def args(self, quick: bool) -> tuple[str, ...]:
        return self.quick_args if quick else self.full_args


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("import_time", "import_time.py", "Import time",
              "`import trainer` ≤ 0.15 s over `import torch`",
              full_args=("--rounds", "11"), quick_args=("--quick", "--rounds", "1")),
    Benchmark("first_step", "first_step.py", "Time to first step", "ours (default flags) ≤ the raw loop + 5 ms",
              full_args=("--rounds", "3"), quick_args=("--quick", "--no-bare")),
    Benchmark("launch", "launch.py", "Launch to first step, 2 ranks",
              "ours ≤ the raw `mp.spawn` DDP script + 1.0 s", full_args=("--rounds", "5")),
    Benchmark("overhead", "overhead.py", "Per-step overhead against a raw PyTorch loop",
              "reported, not targeted (the per-step targets are on the instruction counts below)",
              quick_args=("--quick", "--rounds", "1", "--samples", "3200")),
    # Under the suite's 900 s per benchmark, the child's own bound: on a hang it kills valgrind before run_all
    # kills the script. The ruler's eleven variants over 100 counted steps take about 5 minutes on an idle machine.
    Benchmark("instructions", "instructions.py", "Instructions per step against a raw PyTorch loop (callgrind)",
              "≤ 1.03x raw without logging, ≤ 1.04x with `self.log` every step, ≤ 1.06x with log + progress bar, "
              "EMA every step ≤ 1.05x the raw EMA loop",
              full_args=("--child-timeout", "840", "--steps", "100"),
              quick_args=("--quick", "--child-timeout", "840"),
              needs_tools=("valgrind", "cc")),
    Benchmark("agreement", "agreement.py", "Per-step agreement across ranks", "cost ≤ 1 % of the step time",
              details="reliability.md"),
    Benchmark("checkpoint", "checkpoint.py", "Checkpoint save and load",
              "save ≤ 1.10x a durable `torch.save` + fsync; CRC-checked load ≤ 1.10x `torch.load`",
              full_args=("--s3-rounds", "3"), quick_args=("--quick", "--rounds", "2"),
              details="checkpointing.md#benchmark"),
    Benchmark("precision", "precision.py", "Step time per precision (CPU)", "",
              full_args=("--rounds", "2", "--steps", "12"), quick_args=("--quick", "--steps", "2", "--width", "512"),
              details="precision.md#benchmark"),
    Benchmark("ddp", "ddp.py", "DDP on 2 CPU ranks against a raw DDP script", "≤ 1.03x the raw DDP script",
              full_args=("--rounds", "3"), quick_args=("--quick", "--rounds", "1", "--no-lightning"),
              details="distributed.md#benchmark"),
    Benchmark("zero_memory", "zero_memory.py", "ZeRO memory per rank", "model state per rank as the formula says",
              full_args=("--rounds", "1"), details="zero.md#benchmark"),
    Benchmark("scale", "scale.py", "Cost as the world grows (1-8 CPU ranks)",
              "zero3's model state per rank within 10 % of the formula at every world size; nothing of ours grows "
              "faster than O(world) per step", full_args=(), quick_args=("--quick",), in_suite=False),
    Benchmark("gpu", "gpu.py", "GPU throughput (ResNet-18, small GPT, host-bound MLP)",
              "host-bound MLP ≤ 1.02x the raw loop's step time", quick_args=("--quick",), needs_cuda=True),
)


def by_name(names: list[str]) -> list[Benchmark]:
    """The entries named, in suite order; unknown names are an error that lists the known ones."""
    known = {b.name: b for b in BENCHMARKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [b for b in BENCHMARKS if b.name in names]
