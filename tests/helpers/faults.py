"""Running tests/scripts/faults.py (one injected fault, 2 ranks) under a launcher, and reading what it left behind.

Shared by the fault-injection tests (tests/reliability/test_faults.py, test_processes.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from strategies.checkpoint_io.safe_load import safe_load
from tests.helpers.launch import REPO, TORCHRUN, Finished, clean_env, launch

SCRIPT = REPO / "tests" / "scripts" / "faults.py"
BOUND_S = 15.0  # fault -> every rank exited (RELIABILITY.md target figures)
STEPS = 8  # 64 samples, batch 8, 2 ranks -> 4 steps per epoch, 2 epochs
NOISE = ("Connection closed", "Connection reset", "DistributedDesyncError")


def command(out: Path, *args: str, launcher: str = "own", **env: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run the fault script once on 2 ranks under `launcher` (own, spawn,
    torchrun); torchrun's own options go in `_torchrun_args`."""
    script = [str(SCRIPT), "--out", str(out), *args]
    if launcher == "torchrun":
        cmd = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", *env.pop("_torchrun_args", "").split(), *script]
        environment = clean_env(**env)
        # torchrun sets MASTER_ADDR for its workers; one inherited from outside made the workers of a restart
        # (--max-restarts) dial the failed attempt's gloo address on torch 2.14.1 (see docs/reliability.md).
        environment.pop("MASTER_ADDR")
        return cmd, environment
    if launcher == "spawn":
        script += ["--strategy", "ddp_spawn"]
    # No MASTER_PORT: the launcher picks a free port as it starts the ranks, as in a user's run. A port picked here
    # stayed unbound for the seconds the script took to import torch, and beside another CI run on the same machine
    # an outgoing connection once took it first (EADDRINUSE at rank 0's init_process_group).
    return [sys.executable, *script], clean_env(**env)


def run(out: Path, *args: str, launcher: str = "own", timeout: float = 75, grace_s: float = 3.0,
        **env: str) -> Finished:
    """Run the fault script once (2 ranks) and return the single launch result."""
    (res,) = launch([command(out, *args, launcher=launcher, **env)], out, timeout=timeout, grace_s=grace_s)
    return res


def fired_at(out: Path) -> float:
    return float((out / "fired_at.txt").read_text())


def seconds_after_fault(out: Path, res: Finished) -> float:
    return res.ended_at - fired_at(out)


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return safe_load(out / "rank0.pt")["state_dict"]  # may hold DTensors (zero2/3): the product's loader copes


def assert_equal_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), f"{key} differs from the uninterrupted run"


def assert_root_cause_first(output: str, cause: str, noise: tuple[str, ...] = NOISE) -> None:
    """`cause` is in the output, before any of the `noise` markers (secondary errors of the other ranks)."""
    assert cause in output, output[-6000:]
    found = [output.find(m) for m in noise]
    first_noise = min((i for i in found if i >= 0), default=len(output))
    assert output.find(cause) < first_noise, f"the root cause is not shown first:\n{output[-6000:]}"
