"""On 2 CPU ranks, Lightning 2.x (the oracle) beside ours (tests/scripts/ddp_data_ranks.py): a dict of training loaders
holding a custom sampler, a DataLoader subclass with its own argument, and a plain shorter loader; validation on a
custom sampler. What each rank sees is Lightning's, except where docs/data.md names the difference: Lightning
re-shuffles every training loader under DDP (a SequentialSampler's and a custom sampler's order too), we shard
the loader's own order, so there the per-epoch samples across ranks are Lightning's, their split by rank ours."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.launch import REPO, assert_ok, clean_env, launch

SCRIPT = REPO / "tests" / "scripts" / "ddp_data_ranks.py"


def _run(framework: str, out: Path) -> list[list[Any]]:
    (res,) = launch([([sys.executable, str(SCRIPT), str(out)], clean_env(FRAMEWORK=framework))],
                    out / f"{framework}-logs", timeout=150)
    assert_ok([res])
    return [json.loads((out / f"{framework}-rank{rank}.json").read_text()) for rank in (0, 1)]


def _train(records: list[Any], key: str, epoch: int) -> list[Any]:
    return [i for kind, e, _, batch in records if kind == "train" and e == epoch for i in batch[key]]


@pytest.mark.distributed
@pytest.mark.timeout(360)
def test_two_ranks_see_lightnings_samples(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch", reason="Lightning (the [dev] extra) is not installed")
    ours, theirs = _run("ours", tmp_path), _run("lightning", tmp_path)
    for rank in (0, 1):
        # a DataLoader subclass that shuffles is re-created and sharded exactly as Lightning does
        for epoch in (0, 1):
            assert _train(ours[rank], "subclass", epoch) == _train(theirs[rank], "subclass", epoch)
        # validation on a custom sampler: each rank its strided share of the sampler's order, as Lightning
        assert [r for r in ours[rank] if r[0] == "val"] == [r for r in theirs[rank] if r[0] == "val"]
    for key in ("custom", "short"):
        for epoch in (0, 1):
            mine = [_train(ours[rank], key, epoch) for rank in (0, 1)]
            assert Counter(mine[0] + mine[1]) == Counter(_train(theirs[0], key, epoch) + _train(theirs[1], key, epoch))
    # ours keeps the loader's own order: rank r takes positions r, r+2, ... of it
    assert _train(ours[0], "short", 0) == [200, 202] * 3 and _train(ours[1], "short", 0) == [201, 203] * 3
