"""Fault injection FI-1 .. FI-14 of docs/reliability.md (and ../shared/RELIABILITY.md), on CPU with gloo, 2 ranks.

Every case runs the real thing in a subprocess (tests/scripts/faults.py under our own launcher, torchrun or
SLURM-style env vars) with a hard wall-clock limit, and asserts the exit codes, that no process survives (launch()
checks it), that the root cause is in the output, and the time bound from the fault to the last exit.
FI-10 (SIGKILL during a single-file save) lives in tests/strategies/test_kill_during_save.py; FI-11 (sharded save) in
tests/strategies/test_zero.py.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from strategies.checkpoint_io.safe_load import safe_load
from strategies.comm.distributed import find_free_port
from tests.helpers.faults import (
    BOUND_S,
    SCRIPT,
    STEPS,
    assert_equal_weights,
    assert_root_cause_first,
    final_weights,
    run,
    seconds_after_fault,
)
from tests.helpers.launch import Finished, clean_env, launch

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find survivors")]

FULL = os.environ.get("RELIABILITY_FULL") == "1"  # opt-in: the fault cases over every strategy (docs/reliability.md)
STRATEGIES = ["ddp", "ddp_spawn", "zero1", "zero2", "zero3", "model_parallel"] if FULL else ["ddp"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("rank", [1, 0], ids=["FI-1 rank 1", "FI-2 rank 0"])
def test_raise_on_one_rank_ends_every_rank(tmp_path: Path, rank: int, strategy: str):
    out = tmp_path / "out"
    res = run(out, "--fault", f"raise@{rank}:3", "--strategy", strategy, timeout=60)
    assert res.returncode != 0
    assert_root_cause_first(res.output, f"[rank {rank}] RuntimeError: INJECTED FAILURE on rank {rank} at step 3")
    assert seconds_after_fault(out, res) < BOUND_S, res.output[-4000:]


@pytest.mark.timeout(180)
def test_raise_on_one_rank_of_a_2x2_model_parallel_mesh_ends_every_rank(tmp_path: Path):
    """FI-1 on 4 ranks whose tensor-parallel layer and data-parallel root unit run collectives on the mesh's groups."""
    out = tmp_path / "out"
    res = run(out, "--fault", "raise@1:3", "--strategy", "model_parallel", "--devices", "4", "--data-parallel", "2",
              timeout=120)
    assert res.returncode != 0
    assert_root_cause_first(res.output, "[rank 1] RuntimeError: INJECTED FAILURE on rank 1 at step 3")
    assert seconds_after_fault(out, res) < BOUND_S, res.output[-4000:]


@pytest.mark.timeout(120)
def test_raise_under_torchrun(tmp_path: Path):
    out = tmp_path / "out"
    res = run(out, "--fault", "raise@1:3", launcher="torchrun", timeout=60)
    assert res.returncode != 0
    assert_root_cause_first(res.output, "[rank 1] RuntimeError: INJECTED FAILURE on rank 1 at step 3")
    assert seconds_after_fault(out, res) < BOUND_S, res.output[-4000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fi3_sigkill_one_rank(tmp_path: Path, strategy: str):
    out = tmp_path / "out"
    res = run(out, "--fault", "sigkill@1:2", "--strategy", strategy, timeout=60)
    assert res.returncode != 0
    assert "local rank 1 was killed by SIGKILL" in res.output or "DistributedDesyncError" in res.output, res.output
    assert seconds_after_fault(out, res) < BOUND_S, res.output[-4000:]


@pytest.mark.timeout(120)
def test_fi4_hung_rank_ends_at_the_process_group_timeout(tmp_path: Path):
    out = tmp_path / "out"
    res = run(out, "--fault", "hang@1:2", "--pg-timeout", "10", timeout=70)
    assert res.returncode != 0
    # rank 1 hangs inside training_step, after it started the step's first agreement round: rank 0 gets through
    # that round and times out in the gradient all-reduce, where it names the hung rank
    assert "rank 0 timed out in backward (the gradient all-reduce)" in res.output, res.output[-6000:]
    assert "rank 1 (pid" in res.output and "did not answer" in res.output, res.output[-6000:]
    assert seconds_after_fault(out, res) < 10 + BOUND_S, res.output[-4000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fault", "message"), [
    ("sync_dist_one_rank@0:2", "metric 'x' logged with sync_dist on ranks [0] but not [1]"),
    ("log_dict_keys@all:2", "metric 'metric_rank0' logged with sync_dist on ranks [0] but not [1]"),
], ids=["FI-5 sync_dist on rank 0 only", "FI-5 log_dict keys differ"])
def test_fi5_sync_dist_mismatch_is_named(tmp_path: Path, fault: str, message: str):
    out = tmp_path / "out"
    res = run(out, "--fault", fault, timeout=60)
    assert res.returncode != 0
    assert res.output.count(message) >= 2, f"not reported on both ranks:\n{res.output[-6000:]}"
    assert seconds_after_fault(out, res) < BOUND_S, res.output[-4000:]


@pytest.mark.timeout(120)
def test_fi5_extra_collective_fails_within_the_timeout(tmp_path: Path):
    """A user all_reduce on one rank only meets the other rank's step agreement: gloo sees the size mismatch and
    aborts. (TORCH_DISTRIBUTED_DEBUG=DETAIL would name the collectives, but it segfaults inside DDP's constructor
    on torch 2.14.1 with gloo on CPU, with or without a fault: see docs/reliability.md.)"""
    out = tmp_path / "out"
    res = run(out, "--fault", "extra_collective@0:2", "--pg-timeout", "10", timeout=70)
    assert res.returncode != 0
    assert "collective mismatch" in res.output, res.output[-6000:]
    assert seconds_after_fault(out, res) < 10 + BOUND_S, res.output[-4000:]


@pytest.mark.timeout(120)
def test_fi6_none_on_one_rank_skips_on_every_rank(tmp_path: Path):
    out = tmp_path / "out"
    res = run(out, "--fault", "return_none@1:2", timeout=60)
    assert res.returncode == 0, res.output[-6000:]
    records = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [r["global_step"] for r in records] == [STEPS - 1] * 2, "the skipped step was not skipped everywhere"
    assert_equal_weights(records[1]["state_dict"], records[0]["state_dict"])


@pytest.mark.timeout(120)
def test_fi6_none_the_step_code_does_not_show_fails_on_that_rank_and_ends_every_rank(tmp_path: Path):
    """The step's code has no path to None, so the ranks agree on it overlapped with backward: a None that comes
    anyway (from a function outside the module) is refused on its rank with the rule; the others lose that rank in
    the gradient all-reduce, read its reason from the step's round and raise the same error, within the bound."""
    out = tmp_path / "out"
    res = run(out, "--fault", "return_none_hidden@1:2", timeout=60)
    assert res.returncode != 0
    assert_root_cause_first(res.output, "MisconfigurationError: training_step returned None on rank 1 at global step 2")
    assert "`return None`" in res.output
    explained = "[rank 0] strategies.exceptions.MisconfigurationError: training_step returned None on rank 1"
    assert explained in res.output, "rank 0 did not find rank 1's reason in the step's round:\n" + res.output[-6000:]
    assert seconds_after_fault(out, res) < BOUND_S, res.output[-4000:]


@pytest.mark.timeout(120)
def test_fi7_nan_loss_stops_every_rank_and_keeps_the_last_checkpoint(tmp_path: Path):
    out = tmp_path / "out"
    res = run(out, "--fault", "nan_loss@1:3", "--terminate-on-nan", "--ckpt-every", "1", timeout=60)
    assert res.returncode != 0
    assert res.output.count("the training loss on rank 1 is") >= 2, res.output[-6000:]
    assert "at global step 3" in res.output
    last = torch.load(out / "ckpt" / "epoch=0-step=3.ckpt", weights_only=True)
    assert last["global_step"] == 3
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())
    assert seconds_after_fault(out, res) < BOUND_S


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", ["own", "torchrun"])
def test_fi8_sigterm_saves_exits_143_and_resumes_exactly(tmp_path: Path, launcher: str, reference):
    out = tmp_path / "out"
    res = run(out, "--fault", "sigterm@1:2", "--ckpt-every", "100", "--resume", launcher=launcher, timeout=60)
    stops = res.output.count("SIGTERM received: stopped after global step 3")
    assert stops == 2, f"both ranks must stop after the same step:\n{res.output[-6000:]}"
    if launcher == "own":
        assert res.returncode == 143, res.output[-6000:]
    else:
        assert "exitcode  : 143" in res.output or "exitcode: 143" in res.output, res.output[-6000:]
    assert (out / "ckpt" / "last.ckpt").is_file()
    assert seconds_after_fault(out, res) < 30
    again = run(out, "--ckpt-every", "100", "--resume", launcher=launcher, timeout=60)
    assert again.returncode == 0, again.output[-6000:]
    assert_equal_weights(final_weights(out), reference)


@pytest.mark.timeout(200)
def test_fi9_sigusr1_under_slurm_requeues_once_and_resumes(tmp_path: Path, reference):
    out = tmp_path / "out"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol_calls.txt"
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)

    def slurm_run(*args: str) -> list[Finished]:
        port = str(find_free_port())
        commands = []
        for task in range(2):
            env = clean_env(SLURM_NTASKS="2", SLURM_PROCID=str(task), SLURM_LOCALID=str(task), SLURM_NODEID="0",
                            SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="127.0.0.1", MASTER_PORT=port,
                            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
            commands.append(([sys.executable, str(SCRIPT), "--out", str(out), *args], env))
        return launch(commands, out, timeout=70)

    first = slurm_run("--fault", "sigusr1@0:2", "--ckpt-every", "100", "--resume")  # no checkpoint yet: fresh
    assert all(r.returncode == 128 + 10 for r in first), [r.output[-3000:] for r in first]
    assert calls.read_text().split("\n")[:-1] == ["requeue 4242"], "scontrol requeue must run once, from rank 0"
    assert (out / "ckpt" / "last.ckpt").is_file()
    second = slurm_run("--ckpt-every", "100", "--resume")
    assert all(r.returncode == 0 for r in second), [r.output[-3000:] for r in second]
    assert_equal_weights(final_weights(out), reference)


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("mode", "fault"), [
    ([], "sigkill_in_sharded_save"), ([], "sigkill_before_shard_write"),
    (["--async-save"], "sigkill_before_shard_write")], ids=["sync-after-shard", "sync-before-shard", "async"])
def test_fi11_sigkill_during_a_sharded_save_keeps_the_previous_folder(tmp_path: Path, mode: list[str], fault: str):
    """Async: the SIGKILL lands in rank 1's background writer while rank 0 trains on (and its own write of the same
    save fails); the previous folders stay, and the run resumes from the newest of them."""
    out = tmp_path / "out"
    res = run(out, "--strategy", "zero2", "--sharded", *mode, "--fault", f"{fault}@1:3", "--ckpt-every", "1",
              timeout=60)
    assert res.returncode != 0
    assert seconds_after_fault(out, res) < BOUND_S, res.output[-4000:]
    committed = sorted(p.name for p in (out / "ckpt").iterdir() if ".tmp-" not in p.name)
    assert committed == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt"], committed
    again = run(out, "--strategy", "zero2", "--sharded", *mode, "--ckpt-every", "1", "--resume", timeout=90)
    assert again.returncode == 0, again.output[-6000:]
    assert safe_load(out / "rank0.pt")["global_step"] == STEPS


@pytest.mark.timeout(120)
def test_fi12_disk_full_on_save_fails_every_rank_and_keeps_the_previous_checkpoint(tmp_path: Path):
    out = tmp_path / "out"
    res = run(out, "--fault", "save_enospc@0:3", "--ckpt-every", "1", timeout=60)
    assert res.returncode != 0
    message = "CheckpointSaveError: rank 0: could not save checkpoint to"
    assert res.output.count(message) >= 2, f"not raised on both ranks:\n{res.output[-6000:]}"
    assert "(ENOSPC: No space left on device)" in res.output and "epoch=0-step=3.ckpt" in res.output
    assert "The disk is full" in res.output
    assert not (out / "ckpt" / "epoch=0-step=3.ckpt").exists()
    previous = torch.load(out / "ckpt" / "epoch=0-step=2.ckpt", weights_only=True)
    assert previous["global_step"] == 2
    assert not [p for p in (out / "ckpt").iterdir() if ".tmp-" in p.name], "a temp file was left behind"


@pytest.mark.timeout(120)
def test_fi12_unwritable_checkpoint_dir_fails_every_rank(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt").write_text("a file where the checkpoint folder should be")  # works as root too (chmod does not)
    res = run(out, "--ckpt-every", "1", timeout=60)
    assert res.returncode != 0
    assert res.output.count("CheckpointSaveError: rank 0: cannot create checkpoint directory") >= 2, res.output[-6000:]


@pytest.mark.timeout(120)
def test_fi13_callback_raising_in_on_save_checkpoint_on_one_rank(tmp_path: Path):
    out = tmp_path / "out"
    res = run(out, "--fault", "save_hook_raise@1:2", "--ckpt-every", "1", timeout=60)
    assert res.returncode != 0
    assert_root_cause_first(res.output, "INJECTED FAILURE in on_save_checkpoint on rank 1")
    assert seconds_after_fault(out, res) < BOUND_S


@pytest.mark.timeout(200)
def test_fi14_torchrun_restart_resumes_to_the_same_weights(tmp_path: Path, reference):
    out = tmp_path / "out"
    res = run(out, "--fault", "raise_once@1:5", "--ckpt-every", "1", "--resume", launcher="torchrun",
              _torchrun_args="--max-restarts 1", timeout=150)
    assert res.returncode == 0, res.output[-6000:]
    assert "INJECTED FAILURE on rank 1 at step 5" in res.output
    assert_equal_weights(final_weights(out), reference)
