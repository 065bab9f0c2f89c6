"""seed_everything(workers=True): the Trainer's loaders seed their worker processes from the seed, the worker id
and the rank, by Lightning's rule, unless the user gave a worker_init_fn."""

from __future__ import annotations

import functools
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, seed_everything
from trainer.seed import seed_worker

ITEMS = 4  # batch_size=1, two workers: worker 0 loads items 0 and 2, worker 1 items 1 and 3


class WorkerDraws(Dataset):
    """Each item: the id of the worker that loaded it, then one draw from torch, python and numpy there."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> torch.Tensor:
        info = get_worker_info()
        worker = float(info.id) if info is not None else -1.0
        return torch.tensor([worker, torch.rand(()).item(), random.random(), float(np.random.rand())],
                            dtype=torch.float64)


class RecordDraws(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.draws: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.draws.append(batch[0])
        return self(torch.ones(1, 32)).sum()


def _fit(workers: bool, worker_init_fn: Any = None) -> tuple[torch.Tensor, Trainer]:
    seed_everything(7, workers=workers)
    model = RecordDraws()
    trainer = Trainer(max_epochs=1, **QUIET)
    trainer.fit(model, DataLoader(WorkerDraws(), batch_size=1, num_workers=2, worker_init_fn=worker_init_fn))
    return torch.stack(model.draws), trainer


def _draws(loader: DataLoader) -> torch.Tensor:
    torch.manual_seed(7)  # the loader draws its base seed from the global torch RNG
    return torch.cat(list(loader))


def test_workers_draw_different_numbers_reproducibly():
    first, trainer = _fit(workers=True)
    again, _ = _fit(workers=True)
    assert first[:, 0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert torch.equal(first, again)
    # torch, python and numpy: worker 0's first draw differs from worker 1's
    assert all(first[0, k] != first[1, k] for k in (1, 2, 3))
    init = trainer.train_dataloader.worker_init_fn
    assert init.func is seed_worker and init.keywords == {"rank": 0}


def test_workers_are_seeded_only_when_asked():
    _, trainer = _fit(workers=False)
    assert trainer.train_dataloader.worker_init_fn is None


def test_a_user_worker_init_fn_is_kept():
    def mine(worker_id: int) -> None:
        random.seed(1000 + worker_id)

    draws, trainer = _fit(workers=True, worker_init_fn=mine)
    assert trainer.train_dataloader.worker_init_fn is mine
    assert draws[0, 2] == random.Random(1000).random()


def test_the_rank_separates_workers_of_different_ranks():
    def load(rank: int) -> torch.Tensor:
        return _draws(DataLoader(WorkerDraws(), batch_size=1, num_workers=2,
                                 worker_init_fn=functools.partial(seed_worker, rank=rank)))

    rank0, rank1 = load(0), load(1)
    assert torch.equal(rank0[:, 0], rank1[:, 0])
    assert (rank0[:, 1:] != rank1[:, 1:]).all()


@pytest.mark.parametrize("rank", [0, 3])
def test_the_numbers_are_lightnings(rank: int):
    """The same rule as Lightning 2.x's `pl_worker_init_function`: a ported script draws the same numbers."""
    seed = pytest.importorskip("lightning.fabric.utilities.seed", reason="Lightning (the [dev] extra) is not installed")

    def load(init: Any) -> torch.Tensor:
        return _draws(DataLoader(WorkerDraws(), batch_size=1, num_workers=2, worker_init_fn=init))

    ours = load(functools.partial(seed_worker, rank=rank))
    assert torch.equal(ours, load(functools.partial(seed.pl_worker_init_function, rank=rank)))
