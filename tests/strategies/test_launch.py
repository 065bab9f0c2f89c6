"""Launch tests that run the real thing in subprocesses (CPU, gloo, 2 ranks): our own launcher, torchrun, SLURM-style
env vars, two "nodes" on 127.0.0.1 (torchrun and plain env vars), ddp_spawn, and a rank that fails.

Each launch has a hard wall-clock limit: the processes start in their own session, and on timeout (or any other way
out of the test) the whole process group is terminated, then killed, along with every pid the script recorded
(torchrun starts its workers in sessions of their own). Each test then checks that no process it started survives.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import torch

from strategies.comm.distributed import _ephemeral_ports, find_free_port
from tests.helpers.launch import REPO, TORCHRUN, _alive, _survivors, launch
from tests.helpers.launch import assert_ok as _assert_ok
from tests.helpers.launch import clean_env as _env

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find survivors")]

SCRIPT = REPO / "tests" / "scripts" / "train_ranks.py"
DIGITS = REPO / "examples" / "digits.py"
# BoringModel: 64 samples, batch 8, 2 ranks -> 4 steps per epoch, 2 epochs.
STEPS = 8


def _script(*args: str) -> list[str]:
    return [sys.executable, str(SCRIPT), *args]


def _reference(initial: dict[str, torch.Tensor], world_size: int = 2) -> dict[str, torch.Tensor]:
    """What DDP must produce for BoringModel: rank r trains on samples r, r+W, ... (DistributedSampler without
    shuffling), batch 8, loss = output.sum(), gradients averaged over ranks, SGD lr 0.1, 2 epochs."""
    from tests.helpers.boring import RandomDataset

    data = RandomDataset(32, 64).data
    weight, bias = initial["layer.weight"].clone(), initial["layer.bias"].clone()
    shards = [data[r::world_size] for r in range(world_size)]
    for _epoch in range(2):
        for start in range(0, len(shards[0]), 8):
            # d(sum(x W^T + b))/dW = one row of (sum of x over the batch) per output; d/db = batch size.
            grad_w = torch.stack([s[start:start + 8].sum(0) for s in shards]).mean(0).expand_as(weight)
            grad_b = torch.full_like(bias, 8.0)
            weight, bias = weight - 0.1 * grad_w, bias - 0.1 * grad_b
    return {"layer.weight": weight, "layer.bias": bias}


def _check_ranks(out: Path, node_ranks: tuple[int, ...], local_ranks: tuple[int, ...]) -> list[dict]:
    """Every rank finished with the expected world, place and step count, identical weights, and the weights
    that 2-rank data parallelism must give."""
    world_size = len(node_ranks)
    files = sorted(p.name for p in out.glob("rank*.pt"))
    assert files == [f"rank{r}.pt" for r in range(world_size)], files
    records = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
    for rank, rec in enumerate(records):
        assert (rec["global_rank"], rec["world_size"], rec["global_step"]) == (rank, world_size, STEPS), rec
        assert (rec["node_rank"], rec["local_rank"]) == (node_ranks[rank], local_ranks[rank]), rec
    assert len({rec["pid"] for rec in records}) == world_size, "two ranks ran in one process"
    first = records[0]["state_dict"]
    for rec in records[1:]:
        assert first.keys() == rec["state_dict"].keys()
        for key in first:
            assert torch.equal(first[key], rec["state_dict"][key]), f"rank {rec['global_rank']} differs on {key}"
    expected = _reference(records[0]["initial"], world_size)
    assert not torch.equal(first["layer.weight"], records[0]["initial"]["layer.weight"]), "nothing was trained"
    for key, value in expected.items():
        torch.testing.assert_close(first[key], value, rtol=1e-5, atol=1e-6)
    return records


def _script_pids(out: Path) -> list[int]:
    return [int(line) for line in (out / "pids.txt").read_text().split()]


@pytest.mark.timeout(30)
def test_free_ports_are_picked_outside_the_range_outgoing_connections_take():
    """A launcher picks MASTER_PORT before the ranks bind it; a port of the kernel's ephemeral range could be handed
    to an outgoing connection in between (EADDRINUSE under load), so the picks come from below that range."""
    ports = {find_free_port() for _ in range(20)}
    ephemeral = _ephemeral_ports()
    assert [p for p in ports if p in ephemeral or p < 1024] == [] and len(ports) > 1


def test_harness_reports_orphans_and_timeouts_and_kills_them(tmp_path: Path):
    """The checks below are not vacuous: a process left behind, or a launch past its limit, fails the test."""
    out = tmp_path / "orphan"
    with pytest.raises(AssertionError, match="still alive"):
        launch([(["sh", "-c", f"sleep 60 & echo $! >> {out}/pids.txt"], _env())], out, timeout=10, grace_s=0.5)
    (orphan,) = _script_pids(out)
    assert not _alive(orphan), "the harness did not kill the orphan"
    out = tmp_path / "hang"
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish within 1 s"):
        launch([(["sh", "-c", f"echo $$ >> {out}/pids.txt; sleep 60"], _env())], out, timeout=1)
    assert time.monotonic() - start < 10
    (hung,) = _script_pids(out)
    assert not _alive(hung), "the harness did not kill the timed-out process"


@pytest.mark.timeout(120)
def test_own_launcher_runs_the_script_in_two_processes(tmp_path: Path):
    out = tmp_path / "out"
    env = _env(MASTER_PORT=str(find_free_port()))
    (res,) = launch([(_script("--devices", "2", "--strategy", "ddp", "--out", str(out)), env)], out)
    _assert_ok([res])
    records = _check_ranks(out, node_ranks=(0, 0), local_ranks=(0, 1))
    pids = _script_pids(out)
    assert len(pids) == 2, f"the script ran in {len(pids)} processes, not 2: {pids}"
    assert sorted(pids) == sorted(rec["pid"] for rec in records)
    # Rank 0 stays in the process the user started; only rank 1 is a re-run of the script.
    fits = sorted(out.glob("fit*.pt"))
    assert len(fits) == 2


@pytest.mark.timeout(120)
def test_digits_example_on_two_cpu_ranks(tmp_path: Path):
    out = tmp_path / "digits"
    cmd = [sys.executable, str(DIGITS), "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp",
           "--max-epochs", "1", "--no-progress-bar", "--root", str(out)]
    (res,) = launch([(cmd, _env(MASTER_PORT=str(find_free_port())))], out)
    _assert_ok([res])
    lines = re.findall(r"final validation accuracy: ([0-9.]+)", res.output)
    assert len(lines) == 1, f"expected one accuracy line (rank 0 only):\n{res.output[-4000:]}"
    assert 0.5 < float(lines[0]) <= 1.0, res.output[-4000:]
    (checkpoint,) = re.findall(r"checkpoint: +(\S+)", res.output)
    assert Path(checkpoint).is_file() and Path(checkpoint).is_relative_to(out), checkpoint


@pytest.mark.timeout(120)
def test_torchrun_standalone_launches_nothing_twice(tmp_path: Path):
    out = tmp_path / "out"
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", str(SCRIPT), "--devices", "2", "--out", str(out)]
    (res,) = launch([(cmd, _env())], out)
    _assert_ok([res])
    records = _check_ranks(out, node_ranks=(0, 0), local_ranks=(0, 1))
    pids = _script_pids(out)
    assert len(pids) == 2, f"the script ran in {len(pids)} processes under torchrun, not 2: {pids}"
    assert sorted(pids) == sorted(rec["pid"] for rec in records)


@pytest.mark.timeout(120)
def test_slurm_env_two_tasks_join_one_world(tmp_path: Path):
    out = tmp_path / "out"
    port = str(find_free_port())
    commands = []
    for task in range(2):
        env = _env(SLURM_NTASKS="2", SLURM_PROCID=str(task), SLURM_LOCALID=str(task), SLURM_NODEID="0",
                   SLURM_JOB_ID="123", SLURM_JOB_NODELIST="127.0.0.1", MASTER_PORT=port)
        commands.append((_script("--devices", "2", "--out", str(out)), env))
    results = launch(commands, out)
    _assert_ok(results)
    _check_ranks(out, node_ranks=(0, 0), local_ranks=(0, 1))
    assert len(_script_pids(out)) == 2, "a SLURM task launched extra processes"


@pytest.mark.timeout(120)
def test_torchrun_two_nodes_on_localhost(tmp_path: Path):
    out = tmp_path / "out"
    port = str(find_free_port())
    commands = []
    for node in range(2):
        cmd = [*TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
               "--master_addr", "127.0.0.1", "--master_port", port,
               str(SCRIPT), "--devices", "1", "--num-nodes", "2", "--out", str(out)]
        commands.append((cmd, _env()))
    results = launch(commands, out)
    _assert_ok(results)
    _check_ranks(out, node_ranks=(0, 1), local_ranks=(0, 0))
    assert len(_script_pids(out)) == 2


@pytest.mark.timeout(120)
def test_two_nodes_from_env_vars_without_a_launcher(tmp_path: Path):
    out = tmp_path / "out"
    port = str(find_free_port())
    commands = [(_script("--devices", "1", "--num-nodes", "2", "--out", str(out)),
                 _env(MASTER_PORT=port, NODE_RANK=str(node))) for node in range(2)]
    results = launch(commands, out)
    _assert_ok(results)
    _check_ranks(out, node_ranks=(0, 1), local_ranks=(0, 0))
    assert len(_script_pids(out)) == 2, "a node launched extra processes"


@pytest.mark.timeout(120)
def test_ddp_spawn_two_ranks(tmp_path: Path):
    out = tmp_path / "out"
    cmd = _script("--devices", "2", "--strategy", "ddp_spawn", "--out", str(out))
    (res,) = launch([(cmd, _env(MASTER_PORT=str(find_free_port())))], out)
    _assert_ok([res])
    records = _check_ranks(out, node_ranks=(0, 0), local_ranks=(0, 1))
    pids = _script_pids(out)
    assert len(pids) == 1, f"ddp_spawn re-ran the script: {pids}"
    assert pids[0] not in {rec["pid"] for rec in records}, "spawn ranks must run in child processes"
    # The launching process adopts rank 0's outcome.
    (fit,) = out.glob("fit*.pt")
    main = torch.load(fit, weights_only=True)
    assert main["pid"] == pids[0] and main["global_step"] == STEPS
    for key, value in records[0]["state_dict"].items():
        assert torch.equal(main["state_dict"][key], value), key


@pytest.mark.timeout(90)
def test_own_launcher_failing_rank_stops_every_rank(tmp_path: Path):
    out = tmp_path / "out"
    env = _env(MASTER_PORT=str(find_free_port()), TRAIN_RANKS_FAIL="1:3")
    (res,) = launch([(_script("--devices", "2", "--strategy", "ddp", "--out", str(out)), env)], out, timeout=45)
    assert res.returncode != 0, res.output[-6000:]
    assert "INJECTED FAILURE on rank 1 at step 3" in res.output, res.output[-6000:]
    # RELIABILITY.md FI-1: every rank has exited within 15 s of the raise (start-up time is not the launcher's).
    after_raise = res.ended_at - float((out / "injected_at.txt").read_text())
    assert after_raise < 15, f"the run took {after_raise:.1f} s to end after the raise:\n{res.output[-6000:]}"
    pids = _script_pids(out)
    assert len(pids) == 2, pids
    assert not list(out.glob("rank*.pt")), "a rank finished fit although rank 1 failed"
    # launch() already checked that no process survived the launcher; say so explicitly for this test's purpose.
    assert not _survivors(pids, grace_s=0)
