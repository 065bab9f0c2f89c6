"""Finished runs exit 0 on every rank, under every launcher (tests/scripts/exit_stress.py).

CI runs STRESS_N rounds (default 1) of each launch mode, two launches at a time, and one amplified round. Every
launch ends with the script's last collective at exit, whose Python callback a gloo worker thread runs after the
main thread has moved on; tests/scripts/slow_gloo_worker.c holds that worker back until interpreter finalization
has begun, so the exit race behind "terminate called without an active exception" happens every time. A raw torch
script (the control) then aborts on every rank; our launches, which end their distributed state in order, must not.
`STRESS_N=100 python tests/scripts/exit_stress.py` is the full mode (the command and the measured counts are in
docs/reliability.md).
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.scripts.exit_stress import PRODUCT_MODES, run_stress, summarize

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def _explain(outcomes) -> str:
    return "\n".join(f"=== {o.mode} run {o.index}: {o.problems}\n{o.tail}" for o in outcomes if o.problems)


def test_every_launcher_exits_zero_after_a_finished_fit():
    rounds = int(os.environ.get("STRESS_N", "1"))
    outcomes = run_stress(list(PRODUCT_MODES), rounds, parallel=2)
    table = summarize(outcomes, list(PRODUCT_MODES))
    assert all(row["abnormal"] == 0 for row in table.values()), f"{table}\n{_explain(outcomes)}"


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="the amplifier needs a C compiler")
def test_late_gloo_release_aborts_a_raw_script_but_not_our_ranks():
    # The control runs alone, so that no launch beside it stretches its path from the last collective to
    # finalization towards the amplifier's 200 ms bound (measured: 4 of 4 aborted beside 4 CPU burners).
    control = run_stress(["raw_spawn"], 1, parallel=1, amplify=True)
    control_table = summarize(control, ["raw_spawn"])
    assert control_table["raw_spawn"]["abort"] == 1, (
        f"the amplifier did not reproduce the race: {control_table}\n{_explain(control)}")
    modes = ["ddp", "ddp_spawn", "torchrun"]
    outcomes = run_stress(modes, 1, parallel=len(modes), amplify=True)  # they mostly sleep in the amplifier
    table = summarize(outcomes, modes)
    assert all(row["abnormal"] == 0 for row in table.values()), f"{table}\n{_explain(outcomes)}"
