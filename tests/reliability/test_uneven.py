"""BI-11, BI-13: uneven data across ranks is a clear DistributedDesyncError on every rank, never a hang or a gloo
abort: per-rank batch counts that differ, an IterableDataset that runs out (or is empty) on one rank, a sampler whose
__len__ overstates what it yields, and a per-step sync_dist in an evaluation whose shards are uneven."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from strategies.comm.agreement_board import AgreementBoard
from strategies.exceptions import DistributedDesyncError
from tests.helpers.boring import BoringModel, RandomDataset
from tests.helpers.dist import run_distributed
from trainer import Trainer

pytestmark = pytest.mark.distributed
transports = pytest.mark.parametrize("board", [True, False], ids=["board", "gloo"])  # the step agreement's carrier


class RankSizedSampler(Sampler[int]):
    """Rank 0 gets five batches of 4, rank 1 four: a custom sampler that forgot to even out the shards."""

    def __init__(self, rank: int) -> None:
        self.count = 20 if rank == 0 else 16

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.count))

    def __len__(self) -> int:
        return self.count


class RankSizedStream(IterableDataset):
    """An IterableDataset (no length) that yields 5 samples on rank 0 and 4 on rank 1."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self) -> Iterator[torch.Tensor]:
        data = RandomDataset(32, 64).data
        return iter(data[: 5 if self.rank == 0 else 4])


class EmptyStream(IterableDataset):
    """An IterableDataset that yields 4 samples on rank 0 and nothing at all on rank 1."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(RandomDataset(32, 64).data[: 0 if self.rank == 1 else 4])


class OverstatingSampler(Sampler[int]):
    """Says 20 indices (5 batches of 4) but yields 16 on the ranks in `short`."""

    def __init__(self, rank: int, short: tuple[int, ...]) -> None:
        self.count = 16 if rank in short else 20

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.count))

    def __len__(self) -> int:
        return 20


def _loader(rank: int, kind: str) -> DataLoader:
    if kind == "sampler":
        return DataLoader(RandomDataset(32, 64), batch_size=4, sampler=RankSizedSampler(rank))
    if kind == "empty":
        return DataLoader(EmptyStream(rank), batch_size=1)
    if kind in ("overstating", "overstating everywhere"):
        short = (1,) if kind == "overstating" else (0, 1)
        return DataLoader(RandomDataset(32, 64), batch_size=4, sampler=OverstatingSampler(rank, short))
    return DataLoader(RankSizedStream(rank), batch_size=1)


def _fit_and_report(rank: int, kind: str, board: bool = True) -> str:
    """`board=False`: the step agreement as a gloo round, as ranks on several machines have it (forked ranks: the
    patch is theirs alone)."""
    if not board:
        AgreementBoard.open = classmethod(lambda cls, *args: None)  # type: ignore[method-assign,assignment]
    loader = _loader(rank, kind)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      use_distributed_sampler=False, num_sanity_val_steps=0, limit_val_batches=0)
    try:
        trainer.fit(BoringModel(), train_dataloaders=loader)
    except DistributedDesyncError as err:
        return f"{err} | steps={trainer.global_step}"
    return f"no error | steps={trainer.global_step}"


@pytest.mark.timeout(90)
def test_sampler_with_uneven_batch_counts_fails_before_the_first_step():
    messages = run_distributed(_fit_and_report, "sampler", timeout=60)
    for message in messages:
        assert "rank 0: 5, rank 1: 4" in message, message
        assert message.endswith("steps=0"), message


@pytest.mark.timeout(90)
@transports
def test_iterable_dataset_of_unequal_lengths_fails_where_one_rank_runs_out(board):
    messages = run_distributed(_fit_and_report, "stream", board, timeout=60)
    for message in messages:
        assert "rank 1 ran out of training data at batch 3" in message and "rank 0 has more" in message, message
        assert message.endswith("steps=3"), message


@pytest.mark.timeout(90)
@transports
def test_iterable_dataset_empty_on_one_rank_fails_at_the_first_step(board):
    messages = run_distributed(_fit_and_report, "empty", board, timeout=60)
    for message in messages:
        assert message.startswith("rank 1 has no training batch 0 of epoch 0: its data ended after 0 batch(es)"), \
            message
        assert "but rank 0 has that batch" in message and message.endswith("steps=0"), message


@pytest.mark.timeout(90)
@transports
def test_sampler_whose_len_overstates_fails_where_it_runs_short(board):
    messages = run_distributed(_fit_and_report, "overstating", board, timeout=60)
    for message in messages:
        assert message.startswith("rank 1 has no training batch 4 of epoch 0: its data ended after 4 batch(es)"), \
            message
        assert "a sampler whose __len__ overstates" in message and message.endswith("steps=4"), message


@pytest.mark.timeout(90)
@transports
def test_samplers_that_overstate_alike_on_every_rank_end_the_epoch_together(board):
    """Every rank's data ends at the same batch: a shorter epoch, as a plain loop over the loader would have."""
    assert run_distributed(_fit_and_report, "overstating everywhere", board, timeout=60) == ["no error | steps=4"] * 2


class StepSyncedValidation(BoringModel):
    """Logs a per-step synced value and records what it became after each batch (eval step values are not in
    callback_metrics, so the record reads the running results)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_step_loss", self(batch).sum(), on_step=True, on_epoch=False, sync_dist=True)

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(float(self.trainer.fit_state.results.step_metrics("callback")["val_step_loss"]))


def _validate_uneven(rank: int, kind: str) -> Any:
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                      enable_model_summary=False)
    torch.manual_seed(0)
    model = StepSyncedValidation()
    # 7 samples, batch size 1, sharded without padding: rank 0 has samples 0, 2, 4, 6, rank 1 has 1, 3, 5
    data = DataLoader(RandomDataset(32, 7), batch_size=1) if kind == "sized" else \
        DataLoader(RankSizedStream(rank), batch_size=1)
    try:
        trainer.validate(model, data)
    except DistributedDesyncError as err:
        return str(err)
    return model.seen


@pytest.mark.timeout(90)
def test_per_step_sync_dist_in_uneven_validation_is_reduced_over_the_ranks_that_have_the_step():
    """Lightning pads the shards and runs; here every rank joins the step only rank 0 has, and the value there is
    rank 0's alone (a mean over the ranks that have the step: no padded duplicate)."""
    seen = run_distributed(_validate_uneven, "sized", timeout=60)
    torch.manual_seed(0)
    model, data = StepSyncedValidation(), RandomDataset(32, 7).data
    with torch.no_grad():
        losses = [float(model(data[i:i + 1]).sum()) for i in range(7)]
    expected = [(losses[0] + losses[1]) / 2, (losses[2] + losses[3]) / 2, (losses[4] + losses[5]) / 2, losses[6]]
    assert seen[0] == pytest.approx(expected, rel=1e-6) and seen[1] == pytest.approx(expected[:3], rel=1e-6), seen


@pytest.mark.timeout(90)
def test_per_step_sync_dist_in_validation_without_lengths_is_reduced_over_the_ranks_that_have_the_step():
    """Loaders without a length (5 samples on rank 0, 4 on rank 1): the rank that runs out joins the last step."""
    seen = run_distributed(_validate_uneven, "stream", timeout=60)
    torch.manual_seed(0)
    model, data = StepSyncedValidation(), RandomDataset(32, 64).data
    with torch.no_grad():
        losses = [float(model(data[i:i + 1]).sum()) for i in range(5)]
    # both ranks stream the same first 4 samples (a mean of equal values); the 5th step is rank 0's alone
    assert seen[0] == pytest.approx(losses, rel=1e-6) and seen[1] == pytest.approx(losses[:4], rel=1e-6), seen
