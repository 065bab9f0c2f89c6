"""`Tuner(trainer)`: Lightning's tuner entry point (`lightning.pytorch.tuner.Tuner`): `lr_find` and
`scale_batch_size`.

Both run their trials in Trainers built from the same flags as the user's (devices, strategy, precision,
limits...), with only their own callback and no logger, checkpoints, bar or summary, in a scratch folder, so the
user's Trainer, its callbacks and its folders are untouched. The module's weights are put back afterwards;
`scale_batch_size` also puts back the random number generators, so the fit that follows it is the fit that would
have run without it; `lr_find`, as under Lightning, does not.

Example:
    ```python
    tuner = Tuner(trainer)
    finder = tuner.lr_find(model)          # also sets model.lr (or .learning_rate) to the suggestion
    print(finder.suggestion())
    trainer.fit(model)
    ```
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strategies.comm.distributed import rank_zero_info, rank_zero_warn
from strategies.exceptions import ConfigError
from trainer.seed import capture_rng_state, restore_rng_state
from trainer.tuner.batch_size_scaling import BatchSizeTarget, DatasetLength, Search, run_binsearch, run_power
from trainer.tuner.lr_finder import MODES, LRFinderResult, LRSweep

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_LR_NAMES = ("lr", "learning_rate")
_QUIET = {"enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
_EVAL_LIMITS = {"validate": "limit_val_batches", "test": "limit_test_batches", "predict": "limit_predict_batches"}


class MissingLearningRate(ConfigError, AttributeError):
    """The module has no learning rate attribute for `lr_find` to set (an AttributeError too, Lightning's type)."""


def _check_batch_size_arguments(method: str, mode: str, margin: float, train_dataloaders: Any,
                                val_dataloaders: Any, dataloaders: Any) -> None:
    if method not in ("fit", "validate", "test", "predict"):
        raise ConfigError(f"scale_batch_size(method={method!r}) is not valid: use 'fit', 'validate', 'test' or "
                          "'predict'.")
    if mode not in ("power", "binsearch"):
        raise ConfigError(f"scale_batch_size(mode={mode!r}) is not valid: use 'power' or 'binsearch'.")
    if not 0.0 <= margin < 1.0:
        raise ConfigError(f"scale_batch_size(margin={margin}) must be in [0, 1).")
    if any(loader is not None for loader in (train_dataloaders, val_dataloaders, dataloaders)):
        raise ConfigError("scale_batch_size cannot change the batch size of loaders passed in: build them in the "
                          "module's or the datamodule's *_dataloader() hooks from the batch size attribute (as "
                          "Lightning requires).")


def _lr_attribute(model: Any, attr_name: str) -> str:
    """Lightning's lookup: the given name, else `lr` or `learning_rate`, on the module or in its hparams."""
    hparams = getattr(model, "hparams", {}) or {}
    names = (attr_name,) if attr_name else _LR_NAMES
    for name in names:
        if hasattr(model, name) or name in hparams:
            return name
    if attr_name:
        raise MissingLearningRate(f"lr_find(attr_name={attr_name!r}): the module has no attribute or hparam of that "
                                  "name.")
    raise MissingLearningRate("lr_find(update_attr=True) needs the module (or its hparams) to have `lr` or "
                              "`learning_rate`; name yours with lr_find(attr_name=...) or pass update_attr=False.")


def _set_lr(model: Any, name: str, lr: float) -> None:
    if hasattr(model, name):
        setattr(model, name, lr)
    hparams = getattr(model, "hparams", None)
    if hparams is not None and name in hparams:
        hparams[name] = lr


class Tuner:
    """Tunes hyperparameters for `trainer` (Lightning's `Tuner`): `lr_find` and `scale_batch_size`."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def lr_find(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
                dataloaders: Any = None, datamodule: Any = None, method: str = "fit", min_lr: float = 1e-8,
                max_lr: float = 1.0, num_training: int = 100, mode: str = "exponential",
                early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                attr_name: str = "") -> LRFinderResult | None:
        """Run the learning-rate range test and return its curve and suggestion (Lightning's arguments).

        With `update_attr`, the module's `lr`/`learning_rate` (or `attr_name`), attribute or hparam, is set to the
        suggestion. The plot is saved as `lr_find.png` in the Trainer's `default_root_dir` (by global rank 0).
        """
        result = self.find_lr(model, train_dataloaders, val_dataloaders, dataloaders, datamodule, method, min_lr,
                              max_lr, num_training, mode, early_stop_threshold, update_attr, attr_name)
        if result is not None:
            result.plot_path = self._save_plot(result)
        return result

    def find_lr(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
                dataloaders: Any = None, datamodule: Any = None, method: str = "fit", min_lr: float = 1e-8,
                max_lr: float = 1.0, num_training: int = 100, mode: str = "exponential",
                early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                attr_name: str = "") -> LRFinderResult | None:
        """`lr_find` without the plot file: what the `LearningRateFinder` callback runs (Lightning's callback
        writes no plot)."""
        if method != "fit":
            raise ConfigError(f"lr_find(method={method!r}): the learning-rate finder runs on method='fit' only.")
        if mode not in MODES:
            raise ConfigError(f"lr_find(mode={mode!r}) is not valid: use 'exponential' or 'linear'.")
        if not 0 < min_lr < max_lr:
            raise ConfigError(f"lr_find needs 0 < min_lr < max_lr; got min_lr={min_lr}, max_lr={max_lr}.")
        if dataloaders is not None and train_dataloaders is not None:
            raise ConfigError("lr_find: pass train_dataloaders or dataloaders (its alias), not both.")
        trainer = self._trainer
        if trainer.fast_dev_run:
            rank_zero_warn("lr_find is skipped under fast_dev_run.")
            return None
        name = _lr_attribute(model, attr_name) if update_attr else ""
        result = LRFinderResult(mode, min_lr, max_lr, num_training)
        self._run_trial(model, result, early_stop_threshold, train_dataloaders or dataloaders, val_dataloaders,
                        datamodule)
        if len(result.results["lr"]) < num_training:
            rank_zero_info(f"lr_find stopped after {len(result.results['lr'])} of {num_training} steps (the loss "
                           "diverged, or the data ran out).")
        if update_attr:
            lr = result.suggestion()
            if lr is not None:
                _set_lr(model, name, lr)
                rank_zero_info(f"lr_find: learning rate set to {lr}")
        return result

    def scale_batch_size(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
                         dataloaders: Any = None, datamodule: Any = None, method: str = "fit", mode: str = "power",
                         steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                         batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192) -> int | None:
        """Find the largest batch size that runs `steps_per_trial` steps of `method` without running out of memory
        (Lightning's arguments and search), set it where `batch_arg_name` lives and return it. The module's
        weights and the random number generators are as before the search."""
        _check_batch_size_arguments(method, mode, margin, train_dataloaders, val_dataloaders, dataloaders)
        trainer = self._trainer
        if trainer.world_size > 1:
            raise ConfigError("scale_batch_size runs on one process (as in Lightning); find the size on one device, "
                              "then train with the distributed strategy.")
        if trainer.fast_dev_run:
            rank_zero_warn("scale_batch_size is skipped under fast_dev_run.")
            return None
        target = BatchSizeTarget(model, datamodule, batch_arg_name)
        weights, rng = copy.deepcopy(model.state_dict()), capture_rng_state()
        length = DatasetLength()
        # Lightning's trial: steps_per_trial optimizer steps over the whole training set, as many validation batches
        flags: dict[str, Any] = {"max_steps": steps_per_trial, "limit_train_batches": 1.0,
                                 "limit_val_batches": steps_per_trial} if method == "fit" else \
            {_EVAL_LIMITS[method]: steps_per_trial}

        def trial() -> int | None:
            self._run_in_trial_trainer(method, flags, [length], model, datamodule)
            return length.length

        try:
            search = Search(target, trial, max_val)
            size, _ = search.adjust(value=init_val)
            size = run_power(search, size, max_trials) if mode == "power" else \
                run_binsearch(search, size, max_trials, margin)
        finally:
            model.load_state_dict(weights)
            restore_rng_state(rng)
        rank_zero_info(f"scale_batch_size: the full run will use batch size {size}")
        return size

    def _run_in_trial_trainer(self, method: str, flags: dict[str, Any], callbacks: list[Any], model: Any,
                              datamodule: Any) -> None:
        from trainer.trainer import Trainer

        trainer = self._trainer
        with tempfile.TemporaryDirectory(prefix="tuner-") as scratch:
            trial = Trainer(**{**trainer.init_flags, **_QUIET, **flags, "default_root_dir": scratch}, logger=False,
                            callbacks=callbacks)
            getattr(trial, method)(model, datamodule=datamodule)

    def _run_trial(self, model: Any, result: LRFinderResult, early_stop_threshold: float | None,
                   train_dataloaders: Any, val_dataloaders: Any, datamodule: Any) -> None:
        from trainer.trainer import Trainer

        trainer = self._trainer
        weights, rng = copy.deepcopy(model.state_dict()), capture_rng_state()
        flags = {**trainer.init_flags, **_QUIET, "max_steps": result.num_training, "limit_val_batches": 0,
                 "num_sanity_val_steps": 0}
        with tempfile.TemporaryDirectory(prefix="lr_find-") as scratch:
            flags["default_root_dir"] = scratch  # nothing of the trial lands in the user's folders
            trial = Trainer(**flags, logger=False, callbacks=[LRSweep(result, early_stop_threshold)])
            try:
                trial.fit(model, train_dataloaders, val_dataloaders, datamodule=datamodule)
            finally:  # the module and the random generators as before: lr_find changes only the learning rate
                model.load_state_dict(weights)
                restore_rng_state(rng)

    def _save_plot(self, result: LRFinderResult) -> Path | None:
        trainer = self._trainer
        root = str(trainer.default_root_dir)
        if not trainer.is_global_zero or not result.results["lr"] or "://" in root:
            return None  # a remote root_dir: call result.plot() and save the figure where you want it
        from matplotlib.figure import Figure  # no pyplot: the user's backend and open figures stay as they are

        figure = Figure()
        result.plot(suggest=True, ax=figure.subplots())
        path = Path(root) / "lr_find.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
        return path
