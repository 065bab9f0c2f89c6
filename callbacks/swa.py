"""StochasticWeightAveraging: Lightning 2.6's SWA callback on torch's `AveragedModel` and `SWALR`.

Lightning's schedule, counted as it counts (0-based epochs): with `swa_epoch_start=k` (or `int(k * max_epochs)` for
a fraction) SWA starts at epoch `swa_start = max(k - 1, 0)`. From the start of that epoch the LR scheduler is
`SWALR`, stepped once per epoch, and at the start of every epoch from `swa_start` to `max_epochs - 1` the average
takes in the weights as the previous epoch left them (so the last epoch's training is not in it, as in Lightning).
Only parameters are averaged. When training ends after its last epoch, the module gets the averaged parameters and,
when it has BatchNorm layers, their statistics are recomputed with one pass of `training_step` over the train loader
(cumulative averages: momentum None, as `torch.optim.swa_utils.update_bn` does).

Where ours differs (docs/from-lightning.md): Lightning runs that BatchNorm pass as one extra training epoch
(`current_epoch` and `global_step` count it, validation and checkpoints run after it); ours runs it inside
`on_train_end`, so the counters end where `max_epochs` says and the run's last checkpoint holds the trained weights
(with the average in this callback's state). The final weights are the same.

The average is an `AveragedModel` over the module's tensor view (callbacks/weight_averaging.py), so only tensors are
copied. Its state (the averaged tensors, `n_averaged`, the last epoch averaged, the `SWALR` state) is in the
checkpoint; on resume the `SWALR` is rebuilt before the Trainer loads the saved scheduler states, so they load
into it and a resumed run is bit-exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import SWALR, AveragedModel, get_swa_avg_fn

from callbacks.base import Callback
from callbacks.weight_averaging import _TensorView
from strategies.comm.distributed import rank_zero_info, rank_zero_warn
from strategies.exceptions import MisconfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


# torch's BatchNorm layers (their common base class is private); InstanceNorm's running statistics are left alone,
# as Lightning leaves them
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LazyBatchNorm1d,
                nn.LazyBatchNorm2d, nn.LazyBatchNorm3d)


class StochasticWeightAveraging(Callback):
    """Average the weights of the last epochs (SWA) with a constant or annealed `SWALR` learning rate.

    Args:
        swa_lrs: the SWA learning rate, one float for every param group or a list with one per group.
        swa_epoch_start: the epoch SWA starts at: an int >= 1 (1-based, as in Lightning) or a fraction of
            `max_epochs` in [0, 1].
        annealing_epochs: epochs `SWALR` takes to anneal from the current LR to `swa_lrs`.
        annealing_strategy: `"cos"` or `"linear"`.
        avg_fn: `avg_fn(averaged, current, num_averaged)` for `AveragedModel`; None: the equal-weight mean.
        device: where the average lives (default: CPU); None: beside the module.

    Example:
        ```python
        trainer = Trainer(max_epochs=20, callbacks=[StochasticWeightAveraging(swa_lrs=1e-2)])
        trainer.fit(model)  # the module ends with the average of epochs 15..19
        ```
    """

    def __init__(self, swa_lrs: float | list[float], swa_epoch_start: int | float = 0.8, annealing_epochs: int = 10,
                 annealing_strategy: Literal["cos", "linear"] = "cos",
                 avg_fn: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None,
                 device: torch.device | str | None = torch.device("cpu")) -> None:
        _check_arguments(swa_lrs, swa_epoch_start, avg_fn, device)
        if annealing_strategy not in ("cos", "linear"):
            raise MisconfigurationError(
                f"StochasticWeightAveraging(annealing_strategy={annealing_strategy!r}): use 'cos' or 'linear'.")
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn: Any = avg_fn or get_swa_avg_fn()  # Lightning's formula: avg + (new - avg) / (n + 1)
        self._device = torch.device(device) if isinstance(device, str) else device
        self._average: AveragedModel | None = None
        self._live: _TensorView | None = None
        self._names: list[str] = []  # the module's names of the view's tensors, in its order (p0, p1, ..., b0, ...)
        self._swa_scheduler: SWALR | None = None
        self._max_epochs = -1
        self._has_batch_norm = False
        self._latest_update_epoch = -1
        self._restored: dict[str, Any] | None = None  # this callback's state from a checkpoint, until it is applied
        self.momenta: dict[nn.Module, Any] = {}  # BatchNorm momenta kept during the BatchNorm pass

    # --- Lightning's read-only schedule ---------------------------------------------------------------
    @property
    def swa_start(self) -> int:
        """The first SWA epoch, 0-based."""
        if not isinstance(self._swa_epoch_start, int):
            raise RuntimeError("swa_start is known once fit has started (swa_epoch_start is a fraction).")
        return max(self._swa_epoch_start - 1, 0)

    @property
    def swa_end(self) -> float:
        """The last SWA epoch, 0-based (inf without an epoch limit)."""
        return float("inf") if self._max_epochs == -1 else self._max_epochs - 1

    @property
    def n_averaged(self) -> Tensor | None:
        """How many weight sets are in the average (None before fit)."""
        return None if self._average is None else self._average.n_averaged

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: nn.Module) -> bool:
        return any(isinstance(module, _BATCH_NORMS) for module in pl_module.modules())

    # --- Lightning's helpers, public there (the callback's own average runs on torch's AveragedModel) ---------
    @staticmethod
    def avg_fn(averaged_model_parameter: Tensor, model_parameter: Tensor, num_averaged: Tensor) -> Tensor:
        """The running mean: the average so far moved 1/(n+1) of the way to the new value."""
        return averaged_model_parameter + (model_parameter - averaged_model_parameter) / (num_averaged + 1)

    @staticmethod
    def update_parameters(average_model: nn.Module, model: nn.Module, n_averaged: Tensor,
                          avg_fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
        """Fold `model`'s parameters into `average_model`'s with `avg_fn` (a copy for the first), then count it in
        `n_averaged` (in place)."""
        for averaged, current in zip(average_model.parameters(), model.parameters(), strict=True):
            current_value = current.detach().to(averaged.device)
            averaged.detach().copy_(current_value if n_averaged == 0 else
                                    avg_fn(averaged.detach(), current_value, n_averaged.to(averaged.device)))
        n_averaged += 1

    @staticmethod
    def transfer_weights(src_pl_module: nn.Module, dst_pl_module: nn.Module) -> None:
        """Copy `src_pl_module`'s parameters into `dst_pl_module`'s (same layout)."""
        with torch.no_grad():
            for source, target in zip(src_pl_module.parameters(), dst_pl_module.parameters(), strict=True):
                target.copy_(source.to(target.device))

    def reset_batch_norm_and_save_state(self, pl_module: nn.Module) -> None:
        """Before the BatchNorm pass: every BatchNorm's statistics reset and its momentum None (a cumulative mean),
        the momenta kept in `momenta` for `reset_momenta`."""
        self.momenta = {}
        for norm in (m for m in pl_module.modules() if isinstance(m, _BATCH_NORMS)):
            assert norm.running_mean is not None and norm.running_var is not None
            assert norm.num_batches_tracked is not None
            norm.running_mean.zero_()
            norm.running_var.fill_(1)
            norm.num_batches_tracked.zero_()
            self.momenta[norm], norm.momentum = norm.momentum, None

    def reset_momenta(self) -> None:
        """After the BatchNorm pass: the momenta `reset_batch_norm_and_save_state` kept, back in place."""
        for norm, momentum in self.momenta.items():
            norm.momentum = momentum

    # --- set-up ---------------------------------------------------------------------------------------------
    def _averaged(self, pl_module: TrainModule) -> AveragedModel:
        if self._average is None:
            if any(hasattr(t, "placements") for t in pl_module.parameters()):
                raise MisconfigurationError(
                    "StochasticWeightAveraging does not support sharded parameters (strategy='zero2'/'zero3'), as "
                    "Lightning does not: use strategy='ddp' or 'zero1', or WeightAveraging, whose average stays "
                    "sharded.")
            self._live = _TensorView(pl_module)
            self._names = [name for name, _ in pl_module.named_parameters()] + [
                name for name, _ in pl_module.named_buffers()]
            self._average = AveragedModel(self._live, device=self._device, avg_fn=self._avg_fn, use_buffers=False)
        return self._average

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if len(trainer.optimizers) != 1:
            raise MisconfigurationError("StochasticWeightAveraging works with exactly 1 optimizer; "
                                        f"configure_optimizers() returned {len(trainer.optimizers)}.")
        if len(trainer.lr_scheduler_configs) > 1:
            raise MisconfigurationError("StochasticWeightAveraging works with at most 1 LR scheduler; "
                                        f"configure_optimizers() returned {len(trainer.lr_scheduler_configs)}.")
        self._max_epochs = trainer.max_epochs
        if isinstance(self._swa_epoch_start, float):
            if self._max_epochs == -1:
                raise MisconfigurationError(
                    "StochasticWeightAveraging(swa_epoch_start=<fraction>) needs max_epochs; with max_epochs=-1 "
                    "give swa_epoch_start as an int.")
            self._swa_epoch_start = int(self._max_epochs * self._swa_epoch_start)
        self._has_batch_norm = self.pl_module_contains_batch_norm(pl_module)
        self._averaged(pl_module)

    def _in_swa(self, epoch: int) -> bool:
        return self.swa_start <= epoch <= self.swa_end

    def _start_swa(self, trainer: Trainer) -> SWALR:
        """Build the SWALR on the optimizer and put it in place of the run's scheduler (or add it)."""
        optimizer = trainer.optimizers[0]
        lrs = self._swa_lrs if isinstance(self._swa_lrs, list) else [self._swa_lrs] * len(optimizer.param_groups)
        for lr, group in zip(lrs, optimizer.param_groups, strict=False):
            group["initial_lr"] = lr
        last_epoch = -1
        if self._annealing_strategy == "cos":  # Lightning's argument: the epoch limit (its BatchNorm epoch included)
            last_epoch = self._max_epochs + (1 if self._has_batch_norm and self._max_epochs != -1 else 0)
        scheduler = SWALR(optimizer, swa_lr=lrs, anneal_epochs=self._annealing_epochs,  # type: ignore[arg-type]
                          anneal_strategy=self._annealing_strategy, last_epoch=last_epoch)
        from trainer.core.optimizer_setup import SchedulerConfig

        configs = trainer.lr_scheduler_configs
        config = SchedulerConfig(scheduler)  # interval "epoch", frequency 1
        if configs:
            if configs[0].interval != "epoch" or configs[0].frequency != 1:
                rank_zero_warn(f"StochasticWeightAveraging steps SWALR every epoch; the scheduler it replaces was "
                               f"stepped every {configs[0].frequency} {configs[0].interval}(s).")
            rank_zero_info(f"Swapping scheduler `{type(configs[0].scheduler).__name__}` for `SWALR`")
            configs[0] = config
        else:
            configs.append(config)
        self._swa_scheduler = scheduler
        return scheduler

    # --- the epochs ----------------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        epoch = trainer.current_epoch
        if self._swa_scheduler is None and self._in_swa(epoch):
            self._start_swa(trainer)
            if epoch != self.swa_start:
                rank_zero_warn("StochasticWeightAveraging starts after swa_start without a checkpoint of its state.")
        if self._in_swa(epoch) and epoch > self._latest_update_epoch:
            average = self._averaged(pl_module)
            assert self._live is not None
            average.update_parameters(self._live)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """After the last epoch (or with no epoch limit): the average into the module, then BatchNorm statistics."""
        if self._average is None or self._average.n_averaged == 0:
            return
        if self._max_epochs == -1:
            self._transfer(pl_module)
        elif trainer.current_epoch - 1 == self.swa_end:
            self._transfer(pl_module)
            if self._has_batch_norm:
                self._update_batch_norm(trainer, pl_module)

    def _transfer(self, pl_module: TrainModule) -> None:
        assert self._average is not None
        self.transfer_weights(self._average.module, pl_module)

    def _update_batch_norm(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """One pass of training_step over the train loader with fresh, cumulative BatchNorm statistics; with
        several ranks, the ranks' statistics are averaged so that every rank ends with the same module."""
        norms = [m for m in pl_module.modules() if isinstance(m, _BATCH_NORMS)]
        self.reset_batch_norm_and_save_state(pl_module)
        state, was_training = trainer.fit_state, pl_module.training
        pl_module.train()
        try:
            # a results collection of its own: what training_step logs in this pass goes nowhere
            with torch.no_grad(), state.using_results(state.new_eval_results()):
                for batch_idx, batch in zip(range(_count(trainer.num_training_batches)), trainer.train_dataloader,
                                            strict=False):
                    state.run_step("training_step", state.to_device(batch), batch_idx)
        finally:
            self.reset_momenta()
            pl_module.train(was_training)
        if trainer.world_size > 1:
            for norm in norms:
                for stat in (norm.running_mean, norm.running_var):
                    assert stat is not None
                    stat.copy_(trainer.strategy.all_reduce(stat, "mean"))

    # --- checkpoints ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Lightning's keys; the average is keyed by the module's own names, as Lightning saves its copy."""
        average = self._average
        return {
            "n_averaged": 0 if average is None else int(average.n_averaged.item()),
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
            "average_model_state": None if average is None else self._named_average(average),
        }

    def _named_average(self, average: AveragedModel) -> dict[str, Tensor]:
        tensors = [*average.module.parameters(), *average.module.buffers()]
        return {name: t.detach().clone() for name, t in zip(self._names, tensors, strict=True)}

    def _load_average(self, average: AveragedModel, saved: dict[str, Tensor]) -> None:
        """The saved average into the copy (every parameter must be there; a buffer the file lacks keeps its value:
        only parameters are averaged)."""
        params = list(average.module.parameters())
        missing = [name for name in self._names[:len(params)] if name not in saved]
        if missing:
            raise MisconfigurationError(f"StochasticWeightAveraging: the checkpoint's average lacks {missing[:5]}; "
                                        "was it saved for another model?")
        with torch.no_grad():
            for name, tensor in zip(self._names, [*params, *average.module.buffers()], strict=True):
                if name in saved:
                    tensor.copy_(saved[name])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_epoch = state_dict["latest_update_epoch"]
        self._restored = state_dict

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Restore the average, and put the SWALR in place now: the Trainer loads the saved scheduler state (the
        SWALR's, once SWA has started) into the run's schedulers right after this hook."""
        state, self._restored = self._restored, None
        if state is None:
            return
        average = self._averaged(pl_module)
        if state["average_model_state"] is not None:
            self._load_average(average, state["average_model_state"])
        average.n_averaged.fill_(state["n_averaged"])
        if state["scheduler_state"] is not None:
            self._max_epochs = trainer.max_epochs
            self._has_batch_norm = self.pl_module_contains_batch_norm(pl_module)
            self._start_swa(trainer).load_state_dict(state["scheduler_state"])


def _count(num_batches: int | float) -> int:
    return int(num_batches) if num_batches != float("inf") else 2**62


def _check_arguments(swa_lrs: Any, swa_epoch_start: Any, avg_fn: Any, device: Any) -> None:
    """Lightning's constructor checks, with messages that name the argument."""
    start_ok = (isinstance(swa_epoch_start, int) and not isinstance(swa_epoch_start, bool) and swa_epoch_start >= 1) \
        or (isinstance(swa_epoch_start, float) and 0 <= swa_epoch_start <= 1)
    if not start_ok:
        raise MisconfigurationError(f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}): use an int "
                                    ">= 1 (an epoch) or a float in [0, 1] (a fraction of max_epochs).")
    lrs_ok = (isinstance(swa_lrs, float) and swa_lrs > 0) or (
        isinstance(swa_lrs, list) and all(isinstance(lr, float) and lr > 0 for lr in swa_lrs))
    if not lrs_ok:
        raise MisconfigurationError(f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}): use a positive float, or a "
                                    "list of positive floats (one per param group).")
    if avg_fn is not None and not callable(avg_fn):
        raise MisconfigurationError("StochasticWeightAveraging(avg_fn=...) must be callable.")
    if device is not None and not isinstance(device, (torch.device, str)):
        raise MisconfigurationError(f"StochasticWeightAveraging(device={device!r}): use a torch.device or a str.")
