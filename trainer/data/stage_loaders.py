"""The loaders of a run, per stage (`StageLoaders`): resolved from the arguments, the datamodule or the module's hooks,
prepared for the strategy, limited, and reloaded on Lightning's schedule."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strategies.exceptions import MisconfigurationError
from trainer.data import loaders as data
from trainer.data import overfit
from trainer.data.combined_loader import MODES, CombinedBatches, CombinedLoader
from trainer.data.lengths import limit_batches, loader_length
from trainer.data.sampling import prepare_loader, record_indices
from trainer.seed import seed_workers_of
from trainer.setup.flags import RunSpec
from trainer.state import TrainerFn

if TYPE_CHECKING:
    from strategies.base import Strategy


_HOOK_OF = {"train": "train_dataloader", "val": "val_dataloader", "test": "test_dataloader",
             "predict": "predict_dataloader"}


@dataclass
class StageLoaders:
    """The dataloaders of the current run and how many batches each may yield.

    A run first binds the sources (`bind`); each stage's loaders are requested when its loop first needs them, as
    Lightning requests them: the fit's validation loaders in the sanity check (or right before `on_train_start`, or at
    the first validation), the training loaders after the sanity check, the evaluation and prediction loaders when
    their loop starts. Nothing requests a stage that will not run (a limit of 0, no step method).
    """

    train: Any = None
    num_train: int | float = 0
    val: list[Any] = field(default_factory=list)
    val_limits: list[int | float] = field(default_factory=list)
    test: list[Any] = field(default_factory=list)
    test_limits: list[int | float] = field(default_factory=list)
    predict: list[Any] = field(default_factory=list)
    predict_limits: list[int | float] = field(default_factory=list)
    given: dict[str, Any] = field(default_factory=dict)  # the loaders passed to the entry point (None: none)
    _last: tuple[Any, ...] = ()
    loaded: set[str] = field(default_factory=set)  # the stages requested in this run
    collections: dict[str, Any] = field(default_factory=dict)  # each stage's loaders in the shape they came in
    counts: dict[str, list[int | float]] = field(default_factory=dict)  # batches per loader (CombinedLoader: each)
    requested_at: dict[str, float] = field(default_factory=dict)  # the epoch each fit stage's loaders were requested
    _resumed_at: dict[str, float] = field(default_factory=dict)  # request epochs a checkpoint carried over
    seen: dict[str, list[int]] = field(default_factory=dict)  # evaluation batches run per loader since requested
    profiler: Any = None  # times the loader hooks as Lightning names them

    def bind(self, spec: RunSpec, strategy: Strategy, module: Any, datamodule: Any, fn: TrainerFn,
             given: dict[str, Any]) -> None:
        """A new run: where each stage's loaders come from (arguments > datamodule > module hooks); none is
        requested yet, and the previous run's loaders are dropped."""
        self.given, self._last = dict(given), (spec, strategy, module, datamodule, fn, given)
        self.train, self.num_train = None, 0
        self.val, self.val_limits, self.test, self.test_limits = [], [], [], []
        self.predict, self.predict_limits = [], []
        self.loaded.clear()
        self.collections.clear()
        self.counts.clear()
        self.requested_at.clear()
        self._resumed_at.clear()
        self.seen.clear()

    def defined(self, stage: str) -> bool:
        """Whether the run has a source for `stage`: a loader given to the entry point, or the hook of the
        datamodule or the module overridden (Lightning's `is_defined`)."""
        from trainer.core.datamodule import DataModule
        from trainer.core.module import TrainModule
        from trainer.hooks import is_overridden

        if not self._last:
            return False
        module, datamodule, given = self._last[2], self._last[3], self._last[5]
        hook = _HOOK_OF[stage]
        return given.get(stage) is not None or is_overridden(datamodule, hook, DataModule) \
            or is_overridden(module, hook, TrainModule)

    def load(self, stage: str, epoch: float = 0) -> None:
        """Request `stage`'s loaders now ("train", "val", "test" or "predict"): the hooks run, samplers are
        injected, limits applied. `epoch` is the fit's current epoch, for `reload_dataloaders_every_n_epochs`."""
        spec, strategy, module, datamodule, fn, given = self._last
        sampler_kwargs = strategy.distributed_sampler_kwargs if spec.use_distributed_sampler else None
        self.seen.pop(stage, None)  # new loaders count their batches from 0
        if stage == "train":
            self._resolve_train(spec, strategy, sampler_kwargs, data.requested("train", given.get("train"),
                                                                                datamodule, module, self.profiler))
        else:
            loaders, limits = self._prepare(stage, spec, strategy, sampler_kwargs)
            setattr(self, stage, loaders)
            setattr(self, f"{stage}_limits", limits)
            if fn != TrainerFn.FITTING:
                _require(loaders, fn.value, _HOOK_OF[stage])
        self.loaded.add(stage)
        if stage in ("train", "val"):
            self.requested_at[stage] = self._resumed_at.pop(stage, epoch)

    def _prepare(self, stage: str, spec: RunSpec, strategy: Strategy,
                 sampler_kwargs: dict[str, Any] | None) -> tuple[list[Any], list[int | float]]:
        """The loaders an evaluation or prediction stage iterates and each one's batch limit. Loaders read one after
        another are iterated one by one (with `dataloader_idx`); a CombinedLoader in another mode is one stream of
        combined batches. `counts[stage]` gets each loader's own batch count (Lightning's `num_val_batches`)."""
        _, _, module, datamodule, fn, given = self._last
        combined = data.resolve_loaders(stage, given.get(stage), datamodule, module, self.profiler)
        loaders = combined.flattened if combined is not None else []
        if spec.overfit_batches and fn == TrainerFn.FITTING:  # Lightning's rule: in fit only
            loaders = overfit.in_order(loaders, stage)
        even = strategy.evaluation_shards_even
        loaders = [prepare_loader(dl, sampler_kwargs, False, even) for dl in loaders]
        if stage == "predict":  # so writers and the gather across ranks know each batch's samples
            loaders = [record_indices(dl) for dl in loaders]
        for loader in loaders:
            seed_workers_of(loader, strategy.global_rank)
        limit = getattr(spec, f"limit_{stage}_batches")
        limits = [limit_batches(stage, loader_length(dl), limit) for dl in loaders]
        self.counts[stage] = limits
        if combined is None:
            self.collections[stage] = None
            return [], []
        combined.flattened, combined.limits = loaders, limits
        self.collections[stage] = combined.iterables
        if combined.mode == "sequential" or not loaders:
            return loaders, limits
        return [CombinedBatches(combined)], [len(combined)]

    def _resolve_train(self, spec: RunSpec, strategy: Strategy, sampler_kwargs: dict[str, Any] | None,
                       source: Any) -> None:
        """One training loader as it is; several (a list, tuple or dict, or a CombinedLoader) read together as
        Lightning does, in "max_size_cycle" mode unless the CombinedLoader names another."""
        if source is None:
            raise MisconfigurationError(
                "fit() found no training data: pass train_dataloaders, a datamodule with train_dataloader(), "
                "or define train_dataloader() on the module."
            )
        combined = source if isinstance(source, CombinedLoader) else \
            CombinedLoader(source, "max_size_cycle") if isinstance(source, (list, tuple, dict)) else None
        if combined is not None and combined.mode == "sequential":
            raise MisconfigurationError('fit() does not support CombinedLoader(mode="sequential") for training; '
                                        f"use one of {[m for m in MODES if m != 'sequential']}.")
        loaders = combined.flattened if combined is not None else [source]
        if not loaders:
            raise MisconfigurationError("fit(): the collection of training loaders is empty.")
        if spec.overfit_batches:
            loaders = overfit.in_order(loaders, "train")
        prepared = []
        for loader in loaders:
            if not isinstance(loader, Iterable):
                raise MisconfigurationError(f"train_dataloader() returned {type(loader).__name__}; return a "
                                            "DataLoader, an iterable, or a list/dict of them.")
            loader = prepare_loader(loader, sampler_kwargs, True)
            seed_workers_of(loader, strategy.global_rank)
            prepared.append(loader)
        limits = [limit_batches("train", loader_length(dl), spec.limit_train_batches) for dl in prepared]
        if combined is None:
            self.train, self.num_train = prepared[0], limits[0]
            self.collections["train"] = prepared[0]
            return
        combined.flattened, combined.limits = prepared, limits
        self.train = CombinedBatches(combined)
        self.num_train = loader_length(self.train)
        self.collections["train"] = combined.iterables

    def reload_due(self, stage: str, epoch: int) -> bool:
        """Lightning's schedule for the fit's "train" and "val" loaders: requested the first time they are needed,
        then again once `reload_dataloaders_every_n_epochs` epochs have passed since the last request."""
        if stage not in self.loaded:
            return True
        every = self._last[0].reload_dataloaders_every_n_epochs if self._last else 0
        return bool(every) and epoch - self.requested_at.get(stage, -math.inf) >= every

    def resumed(self, requested_at: dict[str, float]) -> None:
        """A resumed fit keeps the saved request epochs, so that its reloads fall where the uninterrupted run's
        do (the loaders it requests first, at the resumed epoch, count as requested then)."""
        self._resumed_at = {stage: epoch for stage, epoch in requested_at.items() if stage in ("train", "val")}

    def batches_seen(self, stage: str, count: int) -> list[int]:
        """How many batches of each `stage` ("val", "test") loader evaluations ran since the loaders were requested,
        counted in place by the evaluation loop: Lightning's step for evaluation step values."""
        seen = self.seen.setdefault(stage, [])
        seen.extend([0] * (count - len(seen)))
        return seen

    def reload(self) -> None:
        """Request the loaders this run requested so far again from the same sources (the hooks read the module's
        attributes anew: a batch size the BatchSizeFinder set takes effect, as after Lightning's search)."""
        for stage in list(self.loaded):
            self.load(stage, self.requested_at.get(stage, 0))


def _require(loaders: list[Any], fn: str, hook: str) -> None:
    if not loaders:
        raise MisconfigurationError(
            f"{fn}() found no data: pass dataloaders=, a datamodule with {hook}(), or define {hook}() on the module."
        )
