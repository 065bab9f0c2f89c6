"""Finished runs exit 0 on every rank, under every launcher: a few rounds of tests/scripts/exit_stress.py.

CI runs STRESS_N rounds (default 1) of each launch mode, two launches at a time; `STRESS_N=100 python
tests/scripts/exit_stress.py` is the full mode (docs/reliability.md gives the command and the measured counts).
"""

from __future__ import annotations

import os

import pytest

from tests.scripts.exit_stress import PRODUCT_MODES, main

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def test_every_launcher_exits_zero_after_a_finished_fit(capsys):
    rounds = os.environ.get("STRESS_N", "1")
    code = main(["--n", rounds, "--parallel", "2", "--modes", ",".join(PRODUCT_MODES)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "abnormal" in printed
