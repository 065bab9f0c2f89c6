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
from trainer.data.combined_loader import MODES, CombinedLoader, TrainingBatches
from trainer.data.lengths import limit_batches, loader_length
from trainer.data.sampling import prepare_loader, record_indices
from trainer.seed import seed_workers_of
from trainer.setup.flags import RunSpec
from trainer.state import TrainerFn

if TYPE_CHECKING:
    from strategies.base import Strategy


@dataclass
class StageLoaders:
    """The dataloaders of the current run and how many batches each may yield."""

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
    requested_at: dict[str, float] = field(default_factory=dict)  # the epoch each fit stage's loaders were requested
    stale: bool = False  # a resumed fit's loaders were requested before its epoch was restored
    seen: dict[str, list[int]] = field(default_factory=dict)  # evaluation batches run per loader since requested

    def resolve(self, spec: RunSpec, strategy: Strategy, module: Any, datamodule: Any, fn: TrainerFn,
                given: dict[str, Any], only: str | None = None) -> None:
        """Resolve the loaders `fn` needs (arguments > datamodule > module hooks), samplers injected, limits applied;
        in fit, `only="train"` or `"val"` requests one of the two again."""
        self.given, self._last = dict(given), (spec, strategy, module, datamodule, fn, given)
        sampler_kwargs = strategy.distributed_sampler_kwargs if spec.use_distributed_sampler else None

        def prepare(stage: str, training: bool) -> tuple[list[Any], list[int | float]]:
            loaders = data.resolve_loaders(stage, given.get(stage), datamodule, module)
            self.seen.pop(stage, None)  # new loaders count their batches from 0
            if spec.overfit_batches and fn == TrainerFn.FITTING:  # Lightning's rule: in fit only
                loaders = overfit.in_order(loaders, stage)
            even = strategy.evaluation_shards_even
            loaders = [prepare_loader(dl, sampler_kwargs, training, even) for dl in loaders]
            if stage == "predict":  # so writers and the gather across ranks know each batch's samples
                loaders = [record_indices(dl) for dl in loaders]
            for loader in loaders:
                seed_workers_of(loader, strategy.global_rank)
            limit = getattr(spec, f"limit_{stage}_batches")
            return loaders, [limit_batches(stage, loader_length(dl), limit) for dl in loaders]

        if fn == TrainerFn.FITTING:
            if only != "val":
                self._resolve_train(spec, strategy, sampler_kwargs, data.requested("train", given.get("train"),
                                                                                    datamodule, module))
            if only != "train":
                self.val, self.val_limits = _fit_validation(module, prepare)
        elif fn == TrainerFn.VALIDATING:
            self.val, self.val_limits = prepare("val", False)
            _require(self.val, "validate", "val_dataloader")
        elif fn == TrainerFn.TESTING:
            self.test, self.test_limits = prepare("test", False)
            _require(self.test, "test", "test_dataloader")
        else:
            self.predict, self.predict_limits = prepare("predict", False)
            _require(self.predict, "predict", "predict_dataloader")


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
            return
        combined.flattened, combined.limits = prepared, limits
        self.train = TrainingBatches(combined)
        self.num_train = loader_length(self.train)

    def batches_seen(self, stage: str, count: int) -> list[int]:
        """How many batches of each `stage` ("val", "test") loader evaluations ran since the loaders were requested,
        counted in place by the evaluation loop: Lightning's step for evaluation step values."""
        seen = self.seen.setdefault(stage, [])
        seen.extend([0] * (count - len(seen)))
        return seen

    def sanity_checked(self) -> None:
        """Lightning does not count the sanity check's request of the validation loaders: with
        `reload_dataloaders_every_n_epochs`, the fit's first validation requests them again."""
        self.requested_at["val"] = -math.inf

    def resumed(self, requested_at: dict[str, float]) -> None:
        """A resumed fit goes on with the saved request epochs; with reloads on, its first epoch requests the
        loaders again, since the ones it has were requested before the checkpoint's epoch was restored."""
        self.requested_at.update(requested_at)
        self.stale = bool(requested_at) and bool(self._last and self._last[0].reload_dataloaders_every_n_epochs)

    def reload_due(self, stage: str, epoch: int) -> bool:
        """Lightning's `reload_dataloaders_every_n_epochs=N`: request the fit's `stage` ("train" or "val") loaders
        again once N epochs have passed since they were last requested (at the fit's start, the first time)."""
        every = self._last[0].reload_dataloaders_every_n_epochs if self._last else 0
        for each in ("train", "val"):  # both were requested at the fit's start, where the first check happens
            self.requested_at.setdefault(each, epoch)
        last = self.requested_at[stage]
        stale, self.stale = self.stale and stage == "train", self.stale and stage != "train"
        if not stale and (not every or epoch - last < every):
            return False
        spec, strategy, module, datamodule, fn, given = self._last
        self.resolve(spec, strategy, module, datamodule, fn, given, only=stage)
        self.requested_at[stage] = epoch
        return True

    def reload(self) -> None:
        """Resolve the current run's loaders again from the same sources (the hooks read the module's attributes
        anew: a batch size the BatchSizeFinder set takes effect, as after Lightning's search)."""
        if self._last:
            self.resolve(*self._last)


def _fit_validation(module: Any, prepare: Any) -> tuple[list[Any], list[int | float]]:
    """The loaders a fit validates on: none without a `validation_step`, or when every limit is 0."""
    from trainer.core.module import TrainModule
    from trainer.hooks import is_overridden

    loaders, limits = prepare("val", False) if is_overridden(module, "validation_step", TrainModule) else ([], [])
    return (loaders, limits) if any(limits) else ([], [])


def _require(loaders: list[Any], fn: str, hook: str) -> None:
    if not loaders:
        raise MisconfigurationError(
            f"{fn}() found no data: pass dataloaders=, a datamodule with {hook}(), or define {hook}() on the module."
        )
