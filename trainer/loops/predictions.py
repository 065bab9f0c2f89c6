"""What `trainer.predict()` keeps and returns: the predictions, the dataset indices of every batch (what a
`BasePredictionWriter` reads from `trainer.predict_loop`), and every rank's predictions put back into the
dataset's order.

Why gather: Lightning returns each rank's own shard from `predict()` under ddp, in the shard's order, so a script
that ran on one device gets other results on two. Here every rank gets the predictions of all ranks, as a
single-process run over the same data returns them (docs/distributed.md#predictions). Batches are per rank
(rank r predicts samples r, r+N, ...), so a prediction batched along dim 0 is cut into samples, the samples are
sorted by dataset index and put back into batches of the loader's `batch_size`. Anything else (a per-batch
object, outputs whose shapes differ between batches) keeps its per-rank batches, in the order of their first
sample. One `all_gather_object` through the strategy carries it all; on one process it returns what it was given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import MisconfigurationError
from strategies.model.device_move import move_to_device
from trainer.data.sampling import IndexRecorder

if TYPE_CHECKING:
    from strategies.base import Strategy

_CPU = torch.device("cpu")


class PredictLoop:
    """The predict run's bookkeeping, read as `trainer.predict_loop` (Lightning's names).

    Attributes:
        return_predictions: whether `predict()` returns the predictions (default True).
        current_batch_indices: the dataset indices of the batch being predicted on this rank ([] when the loader
            cannot say: a DataLoader subclass, a custom batch sampler, an iterable dataset).
        epoch_batch_indices: per loader, the indices of every batch predicted so far on this rank (cleared at
            `on_predict_end`, as in Lightning).
    """

    def __init__(self) -> None:
        self.return_predictions = True
        self.current_batch_indices: list[int] = []
        self.epoch_batch_indices: list[list[list[int]]] = []
        self._recorders: list[IndexRecorder | None] = []
        self._indices: list[list[list[int]]] = []
        self._predictions: list[list[Any]] = []
        self._keep = True

    @property
    def predictions(self) -> list[Any]:
        """This rank's predictions so far: a list of batch outputs, or one such list per loader when several."""
        if not self._predictions:
            return self._predictions
        return self._predictions[0] if len(self._predictions) == 1 else self._predictions

    @property
    def num_dataloaders(self) -> int:
        """The number of predict loaders of the run."""
        return len(self._recorders)

    def start(self, loaders: Sequence[Iterable], return_predictions: bool, callbacks: Iterable[Any],
              world_size: int) -> None:
        """Before the first batch: which loaders can name their batches' samples, and what to keep."""
        from callbacks.prediction_writer import BasePredictionWriter

        writers = [cb for cb in callbacks if isinstance(cb, BasePredictionWriter)]
        self.return_predictions = return_predictions
        # Lightning keeps the predictions for a writer that writes at epoch end, even with return_predictions=False
        self._keep = return_predictions or any(cb.interval.on_epoch for cb in writers)
        self._recorders = [_recorder(loader) for loader in loaders]
        unknown = [idx for idx, rec in enumerate(self._recorders) if rec is None]
        if unknown and return_predictions and world_size > 1:
            raise MisconfigurationError(_unordered_message(unknown, loaders, world_size))
        if unknown and writers:
            rank_zero_warn(f"Couldn't infer the batch indices fetched from your dataloader: "
                           f"`{type(loaders[unknown[0]]).__name__}` (only a plain DataLoader over a map-style "
                           "dataset, batched by its own BatchSampler, says which samples each batch holds); "
                           "the prediction writer receives `batch_indices=[]`.")
        self._indices = [[] for _ in loaders]
        self.epoch_batch_indices = list(self._indices)
        self._predictions = [[] for _ in loaders]
        self.current_batch_indices = []

    def batch_fetched(self, dataloader_idx: int, batch_idx: int) -> None:
        """Batch `batch_idx` of loader `dataloader_idx` was fetched: record which samples it holds."""
        recorder = self._recorders[dataloader_idx]
        self.current_batch_indices = recorder.batch_indices(batch_idx) if recorder is not None else []
        if recorder is not None:
            self._indices[dataloader_idx].append(self.current_batch_indices)

    def add(self, dataloader_idx: int, prediction: Any) -> None:
        """Keep a batch's prediction (on the CPU, as Lightning does) when it is returned or written at epoch end."""
        if self._keep:
            self._predictions[dataloader_idx].append(move_to_device(prediction, _CPU))

    def end(self) -> None:
        """Before `on_predict_end`, as in Lightning: the epoch's indices are cleared, and the predictions too
        unless they are returned."""
        self.epoch_batch_indices = []
        if not self.return_predictions:
            self._predictions = []

    def result(self, strategy: Strategy) -> list[Any] | None:
        """What `predict()` returns: every rank's predictions in the dataset's order (collective when returned)."""
        if not self.return_predictions:
            return None
        local = [(preds, indices if rec is not None else None, rec.batch_size if rec is not None else None)
                 for preds, indices, rec in zip(self._predictions, self._indices, self._recorders, strict=True)]
        ranks = strategy.all_gather_object(local)
        loaders = [restore_order([rank[idx] for rank in ranks], idx) for idx in range(len(local))]
        if not loaders:
            return []
        return loaders[0] if len(loaders) == 1 else loaders


def _recorder(loader: Any) -> IndexRecorder | None:
    sampler = getattr(loader, "sampler", None)
    return sampler if isinstance(sampler, IndexRecorder) else None


def _unordered_message(unknown: list[int], loaders: Sequence[Iterable], world_size: int) -> str:
    kinds = ", ".join(f"loader {idx} ({type(loaders[idx]).__name__})" for idx in unknown)
    return (f"predict() on {world_size} ranks returns every rank's predictions in the dataset's order, but {kinds} "
            "does not say which samples each batch holds (only a plain DataLoader over a map-style dataset, batched "
            "by its own BatchSampler, does). Pass predict(..., return_predictions=False) and write the predictions "
            "of each rank with a BasePredictionWriter, or predict with a plain DataLoader.")


Shard = tuple[list[Any], list[list[int]] | None, int | None]  # (batch predictions, batch indices, batch_size)


def restore_order(ranks: Sequence[Shard], dataloader_idx: int = 0) -> list[Any]:
    """One loader's predictions from every rank (rank order), as one list in the dataset's order.

    One rank: its predictions as they are. Several: per sample when every prediction is a tensor, or a
    list/tuple/dict of tensors, batched along dim 0 with the same structure in every batch (re-batched to the
    loader's `batch_size`); else per batch, ordered by each batch's first sample. A sample predicted on several
    ranks (a padded DistributedSampler, or every rank predicting everything) is kept once, from the lowest rank.
    """
    if len(ranks) == 1:
        return ranks[0][0]
    batches: list[tuple[list[int], Any]] = []
    batch_size = None
    for rank, (predictions, indices, size) in enumerate(ranks):
        if indices is None:
            if predictions:
                raise MisconfigurationError(f"predict(): rank {rank} cannot say which samples its batches of "
                                            f"loader {dataloader_idx} hold, so the order cannot be restored.")
            continue
        batch_size = batch_size or size
        batches.extend(zip(indices, predictions, strict=True))
    if batch_size and batches and _same_batched_structure(batches):
        return _rebatch(batches, batch_size)
    return _interleave(batches, dataloader_idx)


def _structure(prediction: Any, rows: int) -> Any:
    """A hashable description of a prediction batched along dim 0 over `rows` samples, or None if it is not."""
    if isinstance(prediction, Tensor):
        ok = prediction.dim() >= 1 and prediction.shape[0] == rows
        return ("tensor", prediction.dtype, tuple(prediction.shape[1:])) if ok else None
    if isinstance(prediction, (list, tuple)) and prediction:
        parts = tuple(_structure(item, rows) for item in prediction)
        return None if None in parts else (type(prediction), parts)
    if isinstance(prediction, Mapping) and prediction:
        items = tuple((key, _structure(value, rows)) for key, value in prediction.items())
        return None if any(part is None for _, part in items) else (type(prediction), items)
    return None


def _same_batched_structure(batches: list[tuple[list[int], Any]]) -> bool:
    shapes = {_structure(prediction, len(indices)) for indices, prediction in batches}
    return None not in shapes and len(shapes) == 1


def _rebatch(batches: list[tuple[list[int], Any]], batch_size: int) -> list[Any]:
    """Cut the batches into samples, sort them by dataset index, and batch them again by `batch_size`."""
    where: dict[int, tuple[int, int]] = {}
    for number, (indices, _) in enumerate(batches):
        for row, index in enumerate(indices):
            where.setdefault(index, (number, row))  # ranks come in order: the lowest rank's sample wins
    order = sorted(where)
    out = []
    for start in range(0, len(order), batch_size):
        runs: list[list[int]] = []  # [batch number, first row, end row) of consecutive rows of one batch
        for index in order[start:start + batch_size]:
            number, row = where[index]
            if runs and runs[-1][0] == number and runs[-1][2] == row:
                runs[-1][2] = row + 1
            else:
                runs.append([number, row, row + 1])
        out.append(_concat([_rows(batches[number][1], first, end) for number, first, end in runs]))
    return out


def _rows(prediction: Any, first: int, end: int) -> Any:
    if isinstance(prediction, Tensor):
        return prediction[first:end]
    if isinstance(prediction, Mapping):
        return _like(prediction, {key: _rows(value, first, end) for key, value in prediction.items()})
    return _like(prediction, [_rows(item, first, end) for item in prediction])


def _concat(parts: list[Any]) -> Any:
    """Join row slices taken by `_rows` into one prediction of the same structure."""
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return _like(first, {key: _concat([part[key] for part in parts]) for key in first})
    return _like(first, [_concat([part[pos] for part in parts]) for pos in range(len(first))])


def _like(template: Any, values: Any) -> Any:
    """`values` (a dict or a list) in the container type of `template` (dict, its subclasses, list, tuple,
    namedtuple); a mapping whose type cannot be built from a dict comes back as a dict."""
    if isinstance(template, Mapping):
        try:
            return type(template)(values)  # type: ignore[call-arg]
        except TypeError:
            return dict(values)
    if hasattr(template, "_fields"):
        return type(template)(*values)
    return type(template)(values)


def _interleave(batches: list[tuple[list[int], Any]], dataloader_idx: int) -> list[Any]:
    """Per-batch predictions in the order of each batch's first sample; a batch seen on an earlier rank is dropped."""
    kept: list[Any] = []
    taken: set[tuple[int, ...]] = set()
    seen: set[int] = set()
    for indices, prediction in sorted(batches, key=lambda batch: batch[0][0] if batch[0] else -1):
        key = tuple(indices)
        if key in taken:
            continue
        if seen.intersection(indices):
            raise MisconfigurationError(
                f"predict(): loader {dataloader_idx} predicted some samples on several ranks in different batches, "
                "and its predictions are not tensors batched along dim 0, so they cannot be put in one order. Pass "
                "return_predictions=False and write them per rank with a BasePredictionWriter.")
        taken.add(key)
        seen.update(indices)
        kept.append(prediction)
    return kept
