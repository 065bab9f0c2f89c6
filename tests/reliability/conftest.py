"""Fixtures shared by the fault-injection tests."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.faults import final_weights, run


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The uninterrupted run (tests/scripts/faults.py, 2 ranks) every resumed run must match bit for bit."""
    out = tmp_path_factory.mktemp("reference")
    res = run(out, "--ckpt-every", "1")
    assert res.returncode == 0, res.output[-4000:]
    return final_weights(out)
