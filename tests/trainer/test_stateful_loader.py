"""A training loader with its own `state_dict()`/`load_state_dict()` (torchdata's StatefulDataLoader, or a user's
class) resumes mid-epoch through that state: the resumed run reads no batch twice and ends bit-exact with the
uninterrupted one, from checkpoints taken after a step and inside one (rolled back to the state before its fetch)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from callbacks import ModelCheckpoint
from tests.helpers.boring import QUIET
from trainer import Trainer, TrainModule, seed_everything
from trainer.data.loader_rebuild import ShardedSampler, index_sampler
from trainer.data.sampling import prepare_loader


def _data() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.arange(20), torch.randn(20, 4, generator=gen))


class Cursor:
    """A user's own resumable iterable: batches of 4 ids in a fixed shuffled order, position in `state_dict`."""

    def __init__(self) -> None:
        self.order = torch.randperm(20, generator=torch.Generator().manual_seed(1)).tolist()
        self.start, self.reads = 0, 0

    def __iter__(self) -> Any:
        start, self.start = self.start, 0
        for i in range(start, 20, 4):
            self.position = i + 4
            self.reads += 1
            ids = torch.tensor(self.order[i:i + 4])
            yield ids, _data().tensors[1][ids]

    def __len__(self) -> int:
        return 5

    def state_dict(self) -> dict[str, Any]:
        return {"position": getattr(self, "position", 0)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = state["position"]


class Net(TrainModule):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.layer = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(4, 1))
        self.seen: list[list[int]] = []
        self.loader: Any = None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen.append(batch[0].tolist())
        return self.layer(batch[1]).pow(2).mean()

    def train_dataloader(self) -> Any:
        if self.kind == "torchdata":
            from torchdata.stateful_dataloader import StatefulDataLoader

            self.loader = StatefulDataLoader(_data(), batch_size=4, shuffle=True)
        else:
            self.loader = Cursor()
        return self.loader

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(root: Path, kind: str, ckpt: Path | None = None, save: bool = False) -> Net:
    seed_everything(3)
    model = Net(kind)
    callbacks = [ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1, filename="{step}")] if save \
        else []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*may not be bit-exact.*")
        Trainer(**{**QUIET, "enable_checkpointing": save}, max_epochs=3, callbacks=callbacks,
                default_root_dir=root).fit(model, ckpt_path=ckpt)
    return model


@pytest.mark.parametrize("kind", ["torchdata", "cursor"])
def test_mid_epoch_resume_through_the_loaders_own_state(tmp_path: Path, kind: str) -> None:
    if kind == "torchdata":
        pytest.importorskip("torchdata.stateful_dataloader")
    reference = _fit(tmp_path / "ref", kind, save=True)
    for step in (7, 10):  # mid-epoch, and an epoch end
        resumed = _fit(tmp_path / f"r{step}", kind, ckpt=tmp_path / "ref" / f"step={step}.ckpt")
        assert resumed.seen == reference.seen[step:]
        assert torch.equal(resumed.layer[1].weight, reference.layer[1].weight)
        if kind == "cursor":  # nothing was read again to get back to the position
            assert resumed.loader.reads == len(reference.seen) - step


def test_a_stateful_loader_is_sharded_but_keeps_its_own_resume() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(_data(), batch_size=4, shuffle=True)
    rebuilt = prepare_loader(loader, {"num_replicas": 2, "rank": 1}, training=True)
    assert type(rebuilt) is stateful.StatefulDataLoader
    # its own batch sampler class around a DistributedSampler; no ResumableSampler: its own state resumes it
    assert type(rebuilt.batch_sampler) is type(loader.batch_sampler)
    # torchdata's RandomSampler is its own class (not torch's): sharded in its own order, as any custom sampler
    assert isinstance(index_sampler(rebuilt), ShardedSampler) and index_sampler(rebuilt).sampler is loader.sampler
