"""BasePredictionWriter with Lightning 2.6's contract: the same calls, `batch_indices` and predictions as Lightning's
for the same single-process run (Lightning as the oracle), and on 2 ranks per-rank files that together hold the
whole data set's predictions, each sample once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import BasePredictionWriter
from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule


def _data(length: int) -> TensorDataset:
    return TensorDataset(torch.arange(length * 2, dtype=torch.float32).view(length, 2))


class _Body:
    def _build(self) -> None:
        torch.manual_seed(0)
        self.layer = nn.Linear(2, 3)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self.layer(batch[0])


class Net(_Body, TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self._build()


def _writer_class(base: type) -> type:
    """A writer that records every call (built on ours or on Lightning's base class)."""

    class Recorder(base):  # type: ignore[misc, valid-type]
        def __init__(self, write_interval: str) -> None:
            super().__init__(write_interval)
            self.batches: list[tuple[Any, ...]] = []
            self.epochs: list[tuple[Any, Any]] = []

        def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any,
                               batch_idx: int, dataloader_idx: int) -> None:
            self.batches.append((prediction, list(batch_indices), batch_idx, dataloader_idx))

        def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
            self.epochs.append((predictions, [[list(b) for b in loader] for loader in batch_indices]))

    return Recorder


def _loaders(kind: str) -> Any:
    if kind == "one":
        return DataLoader(_data(7), batch_size=3)
    if kind == "two":
        return [DataLoader(_data(7), batch_size=3), DataLoader(_data(5), batch_size=2, drop_last=True)]
    return DataLoader(_data(9), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("interval", ["batch", "epoch", "batch_and_epoch"])
@pytest.mark.parametrize("loaders", ["one", "two", "shuffled"])
@pytest.mark.parametrize("return_predictions", [True, False])
def test_the_writer_gets_what_lightnings_gets(interval: str, loaders: str, return_predictions: bool):
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import BasePredictionWriter as LightningWriter

    class Theirs(_Body, pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build()

    ours = _writer_class(BasePredictionWriter)(interval)
    trainer = Trainer(callbacks=[ours], **QUIET)
    our_out = trainer.predict(Net(), _loaders(loaders), return_predictions=return_predictions)
    theirs = _writer_class(LightningWriter)(interval)
    their_trainer = pl.Trainer(callbacks=[theirs], logger=False, enable_progress_bar=False,
                               enable_model_summary=False, accelerator="cpu", devices=1)
    their_out = their_trainer.predict(Theirs(), _loaders(loaders), return_predictions=return_predictions)
    assert len(ours.batches) == len(theirs.batches) and len(ours.epochs) == len(theirs.epochs)
    assert [b[1:] for b in ours.batches] == [b[1:] for b in theirs.batches]  # batch_indices, batch_idx, loader
    assert _same([b[0] for b in ours.batches], [b[0] for b in theirs.batches])
    assert [e[1] for e in ours.epochs] == [e[1] for e in theirs.epochs]  # batch_indices: per loader, per batch
    assert _same([e[0] for e in ours.epochs], [e[0] for e in theirs.epochs])
    assert _same(our_out, their_out)
    assert _same(trainer.predict_loop.predictions, their_trainer.predict_loop.predictions)
    assert trainer.predict_loop.epoch_batch_indices == their_trainer.predict_loop.epoch_batch_indices == []


def test_write_interval_is_checked_as_lightning_checks_it():
    for interval in ("batch", "epoch", "batch_and_epoch"):
        assert BasePredictionWriter(interval).interval == interval
    with pytest.raises(MisconfigurationError) as ours:
        BasePredictionWriter("step")
    assert str(ours.value) == "`write_interval` should be one of ['batch', 'epoch', 'batch_and_epoch']."
    lightning = pytest.importorskip("lightning.pytorch.callbacks")
    with pytest.raises(Exception) as theirs:
        lightning.BasePredictionWriter("step")
    assert str(theirs.value) == str(ours.value)
    assert BasePredictionWriter().interval.on_batch and not BasePredictionWriter().interval.on_epoch


def test_a_writer_without_the_write_method_it_needs_fails_clearly():
    with pytest.raises(NotImplementedError, match="write_on_epoch_end"):
        Trainer(callbacks=[BasePredictionWriter("epoch")], **QUIET).predict(Net(), _loaders("one"))


def test_batch_indices_name_the_samples_of_the_batch_while_workers_prefetch():
    class Checks(BasePredictionWriter):
        def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any,
                               batch_idx: int, dataloader_idx: int) -> None:
            assert batch[0][:, 0].div(2).long().tolist() == list(batch_indices)  # sample i is (2i, 2i + 1)
            self.seen = [*getattr(self, "seen", []), *batch_indices]

    writer = Checks()
    loader = DataLoader(_data(23), batch_size=3, shuffle=True, num_workers=2, prefetch_factor=4,
                        generator=torch.Generator().manual_seed(0))
    Trainer(callbacks=[writer], **QUIET).predict(Net(), loader, return_predictions=False)
    assert sorted(writer.seen) == list(range(23)) and writer.seen != sorted(writer.seen)


class Subclassed(DataLoader):
    pass


def test_a_loader_that_cannot_name_its_samples_gives_empty_indices_and_a_warning():
    writer = _writer_class(BasePredictionWriter)("batch")
    with pytest.warns(UserWarning, match="Couldn't infer the batch indices"):
        Trainer(callbacks=[writer], **QUIET).predict(Net(), Subclassed(_data(4), batch_size=2))
    assert [b[1] for b in writer.batches] == [[], []]


# --- 2 ranks: per-rank files --------------------------------------------------------------------------------------
class FileWriter(BasePredictionWriter):
    def __init__(self, folder: Path) -> None:
        super().__init__("batch_and_epoch")
        self.folder = folder

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any,
                           batch_idx: int, dataloader_idx: int) -> None:
        torch.save({"indices": list(batch_indices), "prediction": prediction},
                   self.folder / f"rank{trainer.global_rank}_loader{dataloader_idx}_batch{batch_idx}.pt")

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        torch.save({"indices": batch_indices, "predictions": predictions},
                   self.folder / f"rank{trainer.global_rank}_epoch.pt")


def _writing_rank(rank: int, folder: Path) -> list[int]:
    trainer = Trainer(callbacks=[FileWriter(folder)], **{**QUIET, "devices": 2}, strategy="ddp")
    assert trainer.predict(Net(), _loaders("two"), return_predictions=False) is None
    (folder / "default").mkdir(exist_ok=True)
    trainer = Trainer(callbacks=[FileWriter(folder / "default")], **{**QUIET, "devices": 2}, strategy="ddp")
    returned = trainer.predict(Net(), _loaders("two"))  # Lightning's default under ddp, writer or not: returned
    return [sum(len(batch) for batch in loader) for loader in returned]


def _by_index(indices: list[list[int]], predictions: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    return {i: row for batch, out in zip(indices, predictions, strict=True) for i, row in zip(batch, out, strict=True)}


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_per_rank_files_of_two_ranks_hold_every_sample_once(tmp_path: Path):
    assert run_distributed(_writing_rank, tmp_path, timeout=100) == [[7, 5], [7, 5]]  # each rank: all samples
    writer = _writer_class(BasePredictionWriter)("epoch")
    Trainer(callbacks=[writer], **QUIET).predict(Net(), _loaders("two"))
    (single_predictions, single_indices), = writer.epochs
    for loader, (length, batch_size) in enumerate([(7, 3), (5, 2)]):
        expected = _by_index(single_indices[loader], single_predictions[loader])
        seen: dict[int, torch.Tensor] = {}
        for rank in range(2):
            shard = list(range(rank, length, 2))  # rank r predicts samples r, r+2, ...
            files = sorted(tmp_path.glob(f"rank{rank}_loader{loader}_batch*.pt"))
            saved = [torch.load(path, weights_only=True) for path in files]
            batches = [shard[k:k + batch_size] for k in range(0, len(shard), batch_size)]
            assert [s["indices"] for s in saved] == batches
            epoch = torch.load(tmp_path / f"rank{rank}_epoch.pt", weights_only=True)
            assert epoch["indices"][loader] == [s["indices"] for s in saved]
            for s in saved:
                for index, row in zip(s["indices"], s["prediction"], strict=True):
                    assert index not in seen
                    seen[index] = row
        assert sorted(seen) == sorted(expected) == list(range(length))  # drop_last=True is ignored, as in Lightning
        for index, row in seen.items():
            assert torch.equal(row, expected[index])


def test_the_documented_writer_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    text = (Path(__file__).resolve().parents[2] / "docs" / "callbacks.md").read_text()
    block = re.search(r"## BasePredictionWriter\n.*?```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/callbacks.md", "exec"), {})
    assert sorted(p.name for p in (tmp_path / "predictions").iterdir()) == ["rank0_batch0.pt", "rank0_batch1.pt"]
