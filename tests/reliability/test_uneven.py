"""BI-11: uneven data across ranks is a clear DistributedDesyncError on every rank, never a hang."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from strategies.exceptions import DistributedDesyncError
from tests.helpers.boring import BoringModel, RandomDataset
from tests.helpers.dist import run_distributed
from trainer import Trainer

pytestmark = pytest.mark.distributed


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


def _fit_and_report(rank: int, kind: str) -> str:
    if kind == "sampler":
        loader = DataLoader(RandomDataset(32, 64), batch_size=4, sampler=RankSizedSampler(rank))
    else:
        loader = DataLoader(RankSizedStream(rank), batch_size=1)
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
def test_iterable_dataset_of_unequal_lengths_fails_where_one_rank_runs_out():
    messages = run_distributed(_fit_and_report, "stream", timeout=60)
    for message in messages:
        assert "rank 1 ran out of training data at batch 3" in message and "rank 0 has more" in message, message
        assert message.endswith("steps=3"), message
