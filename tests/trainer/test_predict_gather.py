"""predict() on several ranks returns, on every rank, what one process returns over the same data: each rank's
shard (rank r predicts samples r, r+N, ...) is cut into samples, put back into the data set's order and
re-batched; per-batch objects come back per batch, ordered by their first sample (trainer/loops/predictions.py)."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule
from trainer.loops.predictions import restore_order

Pair = namedtuple("Pair", ["out", "index"])


class Rows(Dataset):
    """Sample i is the vector (i, 2i, -i): integer inputs, so the integer-weight layer below computes every row
    exactly whatever the batch it sits in (the comparison with one process can be exact)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, 2 * index, -index], dtype=torch.float32)


class Exact(TrainModule):
    def __init__(self, kind: str = "tensor") -> None:
        super().__init__()
        self.kind = kind
        self.layer = nn.Linear(3, 2)
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 2.0]]))
            self.layer.bias.fill_(0.5)

    def predict_step(self, batch: torch.Tensor, batch_idx: int, dataloader_idx: int = 0) -> Any:
        out = self.layer(batch)
        if self.kind == "dict":
            return {"out": out, "first": batch[:, 0].long(), "loader": torch.full((len(batch),), dataloader_idx)}
        if self.kind == "namedtuple":
            return Pair(out, batch[:, 0].long())
        if self.kind == "per_batch":  # one number per batch: cannot be cut into samples
            return float(batch[:, 0].sum())
        return out


def _loaders(lengths: tuple[int, ...], batch_sizes: tuple[int, ...]) -> list[DataLoader]:
    return [DataLoader(Rows(n), batch_size=b) for n, b in zip(lengths, batch_sizes, strict=True)]


# (loader lengths, batch sizes, what predict_step returns). Even and odd lengths, one and two loaders; in these the
# two ranks have as many batches each (zero3 needs that: its forward gathers parameters, a collective)
CASES = [((8,), (3,), "tensor"), ((7,), (2,), "tensor"), ((7, 6), (2, 3), "tensor"), ((8, 3), (3, 2), "dict"),
         ((7,), (2,), "namedtuple")]
# here rank 0 has one batch more than rank 1
UNEVEN = [((7,), (3,), "tensor"), ((7, 5), (3, 2), "dict")]


def _predict_all(devices: int, strategy: str = "auto", cases: list[Any] = CASES + UNEVEN) -> list[Any]:
    trainer = Trainer(**{**QUIET, "devices": devices}, strategy=strategy)
    out = []
    for lengths, batch_sizes, kind in cases:
        loaders = _loaders(lengths, batch_sizes)
        out.append(trainer.predict(Exact(kind), loaders if len(loaders) > 1 else loaders[0]))
    return out


def _assert_same(ours: Any, single: Any) -> None:
    assert type(ours) is type(single)
    if isinstance(single, torch.Tensor):
        assert torch.equal(ours, single)
    elif isinstance(single, dict):
        assert list(ours) == list(single)
        for key in single:
            _assert_same(ours[key], single[key])
    elif isinstance(single, (list, tuple)):
        assert len(ours) == len(single)
        for a, b in zip(ours, single, strict=True):
            _assert_same(a, b)
    else:
        assert ours == single


def _rank(rank: int, strategy: str) -> list[Any]:
    return _predict_all(2, strategy, CASES if strategy == "zero3" else CASES + UNEVEN)


@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3"])
def test_two_ranks_return_exactly_what_one_process_returns(strategy: str):
    ranks = run_distributed(_rank, strategy, timeout=150)
    single = _predict_all(1)[:len(ranks[0])]
    assert len(single[2]) == 2 and len(single[2][0]) == 4 and len(single[2][1]) == 2  # two loaders: a list each
    for rank in ranks:
        _assert_same(rank, single)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_ddp_spawn_returns_the_gathered_predictions_to_the_launching_process():
    # Lightning returns None by default under ddp_spawn and refuses return_predictions=True
    spawned = Trainer(**{**QUIET, "devices": 2}, strategy="ddp_spawn").predict(Exact("dict"), _loaders((7, 5), (3, 2)))
    _assert_same(spawned, Trainer(**QUIET).predict(Exact("dict"), _loaders((7, 5), (3, 2))))


def _per_batch_and_refusals(rank: int) -> dict[str, Any]:
    trainer = Trainer(**{**QUIET, "devices": 2}, strategy="ddp")
    calls = []
    gather = trainer.strategy.all_gather_object
    trainer.strategy.all_gather_object = lambda obj: calls.append(1) or gather(obj)  # type: ignore[method-assign]
    out: dict[str, Any] = {"none": trainer.predict(Exact(), DataLoader(Rows(7), batch_size=2),
                                                   return_predictions=False), "gathers": len(calls)}
    out["per_batch"] = trainer.predict(Exact("per_batch"), DataLoader(Rows(7), batch_size=2))
    try:
        trainer.predict(Exact(), DataLoader(Stream(), batch_size=2))
    except MisconfigurationError as err:
        out["iterable"] = str(err)
    out["iterable_unreturned"] = trainer.predict(Exact(), DataLoader(Stream(), batch_size=2), return_predictions=False)
    return out


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        return iter(Rows(4)[i] for i in range(4))


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_per_batch_objects_come_back_in_the_order_of_their_first_sample_and_unknown_orders_are_refused():
    for out in run_distributed(_per_batch_and_refusals, timeout=100):
        assert out["none"] is None and out["gathers"] == 0  # return_predictions=False gathers nothing
        # rank 0 predicted [0, 2], [4, 6]; rank 1 [1, 3], [5]: the batches ordered by their first sample
        assert out["per_batch"] == [2.0, 4.0, 10.0, 5.0]
        assert "loader 0 (DataLoader) does not say which samples" in out["iterable"]
        assert "return_predictions=False" in out["iterable"] and out["iterable_unreturned"] is None


# --- the re-ordering on its own (no processes) ---------------------------------------------------------------------
def _shard(rank: int, world: int, length: int, batch: int, fn: Any = lambda i: torch.tensor([[float(i)]])) -> Any:
    indices = list(range(rank, length, world))
    batches = [indices[k:k + batch] for k in range(0, len(indices), batch)]
    return [torch.cat([fn(i) for i in b]) for b in batches], batches, batch


def test_one_rank_is_returned_as_it_is():
    predictions = [object(), object()]
    assert restore_order([(predictions, None, None)]) is predictions


def test_three_ranks_are_re_batched_by_the_loaders_batch_size():
    out = restore_order([_shard(r, 3, 10, 2) for r in range(3)])
    assert [t.flatten().tolist() for t in out] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_a_sample_predicted_on_several_ranks_is_kept_once():
    everything = _shard(0, 1, 5, 2)  # use_distributed_sampler=False: both ranks predicted the whole set
    out = restore_order([everything, everything])
    assert [t.flatten().tolist() for t in out] == [[0, 1], [2, 3], [4]]


def test_shapes_that_differ_between_batches_keep_their_batches():
    def batch(indices: list[int]) -> torch.Tensor:  # as wide as its first sample + 1 (padded to the batch, say)
        return torch.zeros(len(indices), indices[0] + 1)

    ranks = [([batch([0, 2]), batch([4])], [[0, 2], [4]], 2), ([batch([1, 3]), batch([5])], [[1, 3], [5]], 2)]
    assert [t.shape[1] for t in restore_order(ranks)] == [1, 2, 5, 6]  # per batch, by first sample


def test_overlapping_per_batch_objects_are_refused():
    with pytest.raises(MisconfigurationError, match="several ranks in different batches"):
        restore_order([([1.0], [[0, 1]], 2), ([2.0], [[1, 2]], 2)])
