"""LearningRateFinder and BatchSizeFinder: Lightning's callbacks that run the tuner's searches when fit starts
and let the run continue with what they found.

Both reuse `trainer.tuner.Tuner` (the searches of trainer/tuner/lr_finder.py and trainer/tuner/batch_size_scaling.py,
which run in a trial Trainer built from this Trainer's flags), then put the module back into this run: its `trainer`
points here again, the random number generators are as before the search, and the found value is in use.
LearningRateFinder sets the suggestion on the module's `lr`/`learning_rate` (or `attr_name`) and on every param
group of the run's optimizers (built before the search, as in Lightning; a scheduler keeps its own `base_lrs`).
BatchSizeFinder sets the batch size where `batch_arg_name` lives and rebuilds the run's loaders from their
hooks, so the run trains (or evaluates) with the found size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import ConfigError, MisconfigurationError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer
    from trainer.tuner.lr_finder import LRFinderResult


def _reattach(trainer: Trainer, pl_module: TrainModule) -> None:
    """The trial Trainer attached the module (and datamodule) to itself: attach them to this run again."""
    pl_module.trainer = trainer
    if trainer.datamodule is not None:
        trainer.datamodule.trainer = trainer


class LearningRateFinder(Callback):
    """Run the learning-rate range test when fit starts, then train with its suggestion (`Tuner.lr_find`'s
    search, Lightning's arguments); `optimal_lr` holds the result (`.suggestion()`, `.results`, `.plot()`).
    One process only (a search nested in a multi-process run is refused at setup).

    Example:
        ```python
        finder = LearningRateFinder(num_training_steps=50)
        trainer = Trainer(max_epochs=5, callbacks=[finder])
        trainer.fit(model)  # model.lr (or .learning_rate) is set to finder.optimal_lr.suggestion()
        ```
    """

    SUPPORTED_MODES = ("linear", "exponential")

    def __init__(self, min_lr: float = 1e-8, max_lr: float = 1, num_training_steps: int = 100,
                 mode: str = "exponential", early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                 attr_name: str = "") -> None:
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ConfigError(f"LearningRateFinder(mode={mode!r}) is not valid: use 'exponential' or 'linear'.")
        self._min_lr, self._max_lr, self._num_training_steps = min_lr, max_lr, num_training_steps
        self._mode, self._early_stop_threshold = mode, early_stop_threshold
        self._update_attr, self._attr_name = update_attr, attr_name
        self.optimal_lr: LRFinderResult | None = None

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage == "fit" and trainer.world_size > 1:
            raise MisconfigurationError(
                "LearningRateFinder runs on one process here (Lightning's also runs under ddp): search on one device "
                "(or with Tuner(trainer).lr_find(model) before fit), then train with the found rate on several.")

    def lr_find(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Run the search now (override `on_fit_start` and call this from another hook to search later)."""
        from trainer.seed import capture_rng_state, restore_rng_state
        from trainer.tuner import Tuner

        given, rng = trainer.fit_state.loaders.given, capture_rng_state()
        try:
            self.optimal_lr = Tuner(trainer).find_lr(
                pl_module, given.get("train"), given.get("val"), datamodule=trainer.datamodule,
                min_lr=self._min_lr, max_lr=self._max_lr, num_training=self._num_training_steps, mode=self._mode,
                early_stop_threshold=self._early_stop_threshold, update_attr=self._update_attr,
                attr_name=self._attr_name)
        finally:
            _reattach(trainer, pl_module)
            restore_rng_state(rng)
        lr = self.optimal_lr.suggestion() if self.optimal_lr is not None and self._update_attr else None
        if lr is not None:
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = lr

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.lr_find(trainer, pl_module)


class BatchSizeFinder(Callback):
    """Find the largest batch size that fits in memory when fit (or validate, test, predict) starts, then run
    with it (`Tuner.scale_batch_size`'s search, Lightning's arguments); `optimal_batch_size` holds it.

    The loaders must read the batch size from the module or datamodule (or their hparams) in their
    `*_dataloader()` hooks; loaders passed to `fit()` are refused, as in Lightning. One process only.

    Example:
        ```python
        trainer = Trainer(max_epochs=5, callbacks=[BatchSizeFinder(mode="binsearch")])
        trainer.fit(model)  # model.batch_size is the size found, and the loaders use it
        ```
    """

    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                 batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192) -> None:
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ConfigError(f"BatchSizeFinder(mode={mode!r}) is not valid: use 'power' or 'binsearch'.")
        if not 0.0 <= margin < 1.0:
            raise ConfigError(f"BatchSizeFinder(margin={margin}) must be in [0, 1).")
        self.optimal_batch_size: int | None = init_val
        self._mode, self._steps_per_trial, self._init_val = mode, steps_per_trial, init_val
        self._max_trials, self._batch_arg_name = max_trials, batch_arg_name
        self._margin, self._max_val = margin, max_val

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if trainer.world_size > 1:
            raise MisconfigurationError("BatchSizeFinder runs on one process (as in Lightning): find the size on one "
                                        "device, then train with the distributed strategy.")
        name = self._batch_arg_name
        hparams = getattr(pl_module, "hparams", None) or {}
        if hasattr(pl_module, name) and name in hparams:
            rank_zero_warn(f"BatchSizeFinder: `model.{name}` and `model.hparams.{name}` both exist; `model.{name}` is "
                           "the starting size of the search. Remove one of them if that is not what you want.")

    def scale_batch_size(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Run the search now for the running entry point, and rebuild the run's loaders with the size found."""
        from trainer.tuner import Tuner

        given = trainer.fit_state.loaders.given
        method = str(getattr(trainer.state.fn, "value", trainer.state.fn))
        loaders = {"train_dataloaders": given.get("train"), "val_dataloaders": given.get("val")} \
            if method == "fit" else {"dataloaders": given.get(_EVAL_KEY[method])}
        try:
            self.optimal_batch_size = Tuner(trainer).scale_batch_size(
                pl_module, **loaders, datamodule=trainer.datamodule, method=method, mode=self._mode,
                steps_per_trial=self._steps_per_trial, init_val=self._init_val, max_trials=self._max_trials,
                batch_arg_name=self._batch_arg_name, margin=self._margin, max_val=self._max_val)
        finally:
            _reattach(trainer, pl_module)
        trainer.fit_state.reload_dataloaders()

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.scale_batch_size(trainer, pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.sanity_checking and str(getattr(trainer.state.fn, "value", "")) == "validate":
            self.scale_batch_size(trainer, pl_module)

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.scale_batch_size(trainer, pl_module)

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.scale_batch_size(trainer, pl_module)


_EVAL_KEY = {"validate": "val", "test": "test", "predict": "predict"}
