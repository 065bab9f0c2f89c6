"""The fit, evaluation and predict loops. Flat, and blind to the strategy type: every difference
between single device, DP, DDP and ZeRO is behind `trainer.strategy`. Hook order: see trainer.hooks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from strategies.distributed import rank_zero_info
from strategies.exceptions import MisconfigurationError
from trainer import data, preemption, resume
from trainer.hooks import call_hook
from trainer.position import Phase
from trainer.sampling import resumable_sampler
from trainer.seed import capture_rng_state, restore_rng_state
from trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_ACCEPTED_STEP_OUTPUT = "a scalar loss tensor, a dict with a 'loss' tensor, or None (skip this batch)"


def loss_from(out: Any) -> Tensor | None:
    """The loss in a training_step output, validated; None means skip the batch."""
    if type(out) is Tensor and out.requires_grad and out.numel() == 1:  # the common case, checked cheaply
        return out
    if out is None:
        return None
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if isinstance(out, Mapping) and "loss" not in out:
        raise MisconfigurationError(
            f"training_step returned a dict without a 'loss' key (keys: {sorted(out)}); return {_ACCEPTED_STEP_OUTPUT}."
        )
    if not isinstance(loss, Tensor):
        raise MisconfigurationError(f"training_step returned {type(loss).__name__}; return {_ACCEPTED_STEP_OUTPUT}.")
    if loss.numel() != 1:
        raise MisconfigurationError(
            f"training_step returned a loss tensor of shape {tuple(loss.shape)}; it must be a scalar "
            "(reduce it, e.g. with .mean())."
        )
    if not loss.requires_grad:
        raise MisconfigurationError(
            "training_step returned a loss that does not require grad (was it computed under torch.no_grad(), "
            "or detached?). Return the loss tensor from the forward computation."
        )
    return loss


def _detached(out: Any, loss: Tensor | None) -> Any:
    """What on_train_batch_end receives: the step output with the loss detached (as in Lightning)."""
    if loss is None:
        return out
    if out is loss:
        return {"loss": loss.detach()}
    if isinstance(out, Mapping):
        return {**out, "loss": loss.detach()}
    return {"loss": loss.detach()}


def train_one_batch(trainer: Trainer, batch: Any, batch_idx: int, is_last: bool) -> Any:
    """Automatic optimization: forward, backward, and (at the end of an accumulation window) step."""
    s, accumulate = trainer.strategy, trainer._spec.accumulate_grad_batches
    is_last_micro = is_last or (batch_idx + 1) % accumulate == 0
    with s.no_backward_sync(not is_last_micro):  # wraps forward and backward
        out = trainer._run_step("training_step", batch, batch_idx)
        loss = loss_from(out)
        # Every rank learns here whether any rank skips, hit a NaN, ran out of data or got a stop signal.
        skip = trainer._control.after_training_step(trainer, loss, is_last, True)
        if not skip and loss is not None:
            call_hook(trainer, "on_before_backward", loss)
            s.backward(loss / accumulate if accumulate > 1 else loss)
            trainer._window_has_loss = True
            trainer._position.set(Phase.STEP_PENDING if is_last_micro else Phase.BACKWARD_DONE)
            call_hook(trainer, "on_after_backward")
    if is_last_micro and trainer._window_has_loss:
        close_window(trainer)
    return _detached(out, loss)


def close_window(trainer: Trainer) -> None:
    """The end of an accumulation window: clip, optimizer step, step-interval schedulers, zero_grad."""
    s, opt, position = trainer.strategy, trainer.optimizers[0], trainer._position
    position.set(Phase.STEP_PENDING)
    s.unscale_gradients(opt)  # hooks see true gradients under 16-mixed, as in Lightning
    call_hook(trainer, "on_before_optimizer_step", opt)
    trainer._clip_gradients(opt)
    if s.optimizer_step(opt) and trainer._scheduler_stepper.has_step_schedulers:
        trainer._scheduler_stepper.step("step", trainer._progress.global_step + 1, trainer.callback_metrics)
    position.set(Phase.STEPPED)
    call_hook(trainer, "on_before_zero_grad", opt)
    opt.zero_grad(set_to_none=True)
    trainer._progress.global_step += 1
    trainer._window_has_loss = False


def train_one_batch_manual(trainer: Trainer, batch: Any, batch_idx: int, is_last: bool) -> Any:
    """Manual optimization: the step does its own backward and optimizer calls."""
    with trainer.strategy.manual_step_context():
        out = trainer._run_step("training_step", batch, batch_idx)
    loss = out.get("loss") if isinstance(out, Mapping) else out
    trainer._control.after_training_step(trainer, loss if isinstance(loss, Tensor) else None, is_last, False)
    return out


def run_train_epoch(trainer: Trainer) -> None:
    """One training epoch, with validation wherever it is due."""
    s, progress, results, schedule = trainer.strategy, trainer._progress, trainer._train_results, trainer._schedule
    metrics, position = trainer._metrics, trainer._position
    loader = trainer._loaders.train
    resume.before_epoch(trainer)
    data.set_epoch(loader, progress.current_epoch)
    trainer._results = results
    trainer.state.stage = RunningStage.TRAINING
    s.module.train()
    step_fn = train_one_batch if trainer._automatic else train_one_batch_manual
    call_hook(trainer, "on_train_epoch_start")
    iterator, start = resume.open_epoch(trainer, loader)
    progress.epoch_batches, progress.epoch_finished = start, False
    control = trainer._control
    control.check_batch_counts(trainer.num_training_batches)
    if start and not progress.val_started and schedule.val_due(start - 1, start == trainer.num_training_batches):
        _validate_during_fit(trainer)  # the save came before the validation due after that batch
    runs_out, sampler, stopped = data.runs_out(loader, trainer.num_training_batches), resumable_sampler(loader), False
    position.before_fetch(sampler)
    last_seen = False
    for batch_idx, batch, is_last in data.iterate(iterator, trainer.num_training_batches, start):
        last_seen = is_last
        position.set(Phase.BATCH_STARTED)
        progress.val_started = False
        batch = s.batch_to_device(batch)
        results.set_batch(batch)
        if call_hook(trainer, "on_train_batch_start", batch, batch_idx) == -1:
            break
        outputs = step_fn(trainer, batch, batch_idx, is_last)
        progress.epoch_batches += 1
        progress.total_batches += 1
        position.set(Phase.BETWEEN_BATCHES)
        call_hook(trainer, "on_train_batch_end", outputs, batch, batch_idx)
        if metrics.loggers:
            metrics.step_end(results, progress.total_batches, progress.global_step, progress.current_epoch)
        if control.stop_signal:  # agreed by every rank after this same batch
            preemption.stop_and_exit(trainer, control.stop_signal)
        if is_last and runs_out:
            data.run_out(iterator)  # as a plain `for` loop over the loader does
        if schedule.val_due(batch_idx, is_last):
            _validate_during_fit(trainer)
        if schedule.stop_in_epoch():
            stopped = not is_last
            break
        position.before_fetch(sampler)
    else:
        if not last_seen and trainer.num_training_batches > start:  # the data ended before the announced last batch
            control.ran_dry(trainer)
            if control.stop_signal:
                preemption.stop_and_exit(trainer, control.stop_signal)
    if stopped:  # the fit ends inside this epoch: checkpoints from here on continue it (trainer/position.py)
        resume.freeze_at_stop(trainer)
    progress.epoch_finished = True
    _train_epoch_end(trainer, complete=not stopped)


def _validate_during_fit(trainer: Trainer) -> None:
    trainer._progress.val_started = True
    trainer._position.validation_started(capture_rng_state())
    with trainer._control.outside_steps():  # no step bound on collectives during validation
        run_evaluation(trainer, RunningStage.VALIDATING)
    trainer._position.validation_finished()
    trainer._results = trainer._train_results
    trainer.state.stage = RunningStage.TRAINING


def _train_epoch_end(trainer: Trainer, complete: bool) -> None:
    """Epoch metrics (readable in on_train_epoch_end), the hook, late metrics, epoch schedulers.

    Epoch-interval schedulers step only after a complete epoch (as in Lightning): not when the fit
    stops inside it, so that a resume continuing that epoch steps them once, at its real end.
    """
    results, p, metrics = trainer._train_results, trainer._progress, trainer._metrics
    trainer._control.epoch_ends()  # epoch-end hooks and the next epoch's data loaders: no step bound
    trainer._results = results
    metrics.epoch_end(results.epoch_end("training epoch end"), p.global_step, p.current_epoch)
    call_hook(trainer, "on_train_epoch_end")
    metrics.epoch_end(results.epoch_end("on_train_epoch_end"), p.global_step, p.current_epoch)
    if complete:
        trainer._scheduler_stepper.step("epoch", p.current_epoch + 1, trainer.callback_metrics)
    p.current_epoch += 1
    p.epoch_finished, p.epoch_batches, p.epoch_opened = False, 0, False


def run_fit(trainer: Trainer) -> None:
    """Sanity check, then epochs until a limit (max_epochs, max_steps, max_time, should_stop) is hit.

    A Trainer that already reached its limit trains nothing (as in Lightning) and says so. The
    sanity check leaves every RNG as it found it, so it does not shift the run's random draws.
    """
    reached = trainer._schedule.limit_reached()
    if reached is not None:
        rank_zero_info(
            f"`Trainer.fit` stopped: {reached} reached; this Trainer has nothing left to train. To train further, "
            "create a Trainer with a higher limit and call fit(model, ckpt_path=<a checkpoint of this run>)."
        )
        return
    val_limits = trainer._loaders.val_limits
    if val_limits and trainer._schedule.sanity_steps(max(val_limits)):
        rng = capture_rng_state()
        trainer._position.validation_started(rng)  # a checkpoint taken in it records the RNG from before it
        run_evaluation(trainer, RunningStage.SANITY_CHECKING)
        restore_rng_state(rng)
        trainer._position.validation_finished()
    trainer._results = trainer._train_results
    call_hook(trainer, "on_train_start")
    while not trainer._schedule.fit_done():
        run_train_epoch(trainer)
    late_signal = trainer._control.stop_signal_after_fit(trainer)  # e.g. Ctrl-C during the final validation
    if late_signal:
        preemption.stop_and_exit(trainer, late_signal)
    call_hook(trainer, "on_train_end")


_PREFIX = {RunningStage.VALIDATING: "validation", RunningStage.SANITY_CHECKING: "validation",
           RunningStage.TESTING: "test"}


def run_evaluation(trainer: Trainer, stage: RunningStage) -> list[dict[str, float]]:
    """Validation, sanity check or test over every eval loader; returns one metrics dict per loader."""
    s, prefix = trainer.strategy, _PREFIX[stage]
    loaders, limits = trainer._eval_loaders(stage)
    module = s.module
    was_training = module.training
    results = trainer._new_eval_results()
    trainer._results, previous_stage = results, trainer.state.stage
    trainer.state.stage = stage
    module.eval()
    if stage == RunningStage.SANITY_CHECKING:
        call_hook(trainer, "on_sanity_check_start")
    call_hook(trainer, f"on_{prefix}_start")
    call_hook(trainer, f"on_{prefix}_epoch_start")
    many = len(loaders) > 1
    with torch.no_grad():
        for dl_idx, (loader, limit) in enumerate(zip(loaders, limits, strict=True)):
            results.key_suffix = f"/dataloader_idx_{dl_idx}" if many else ""
            _evaluate_loader(trainer, results, loader, limit, prefix, (dl_idx,) if many else ())
    results.key_suffix = ""
    metrics = _eval_epoch_end(trainer, results, stage, prefix)
    if stage == RunningStage.VALIDATING:
        trainer._position.validation_finished()  # a checkpoint from on_validation_end on counts it as done
    call_hook(trainer, f"on_{prefix}_end")
    if stage == RunningStage.SANITY_CHECKING:
        call_hook(trainer, "on_sanity_check_end")
    module.train(was_training)
    trainer.state.stage = previous_stage
    return _split_by_loader(metrics, len(loaders))


def _evaluate_loader(trainer: Trainer, results: Any, loader: Any, limit: int | float, prefix: str,
                     extra: tuple[int, ...]) -> None:
    """One evaluation loader. Its shards may hold different numbers of batches on different ranks (no padding, or
    no length): from the first step some rank may lack, every step is a round that every rank joins
    (`reduce_eval_step`, before and after the batch-end hook), so a per-step sync_dist value never leaves a rank
    waiting; a rank that has run out joins the remaining rounds with nothing to add."""
    s, control = trainer.strategy, trainer._control
    counts = control.eval_batch_counts(limit)  # None: the same known count on every rank (or one process)
    joined_from = math.inf if counts is None else max(min(counts), 0)  # counts known and different: the fewest
    more = counts is not None  # whether this rank must join the round at joined_from (or after its last step)
    for batch_idx, batch, is_last in data.iterate(loader, limit):
        results.defer_eval_sync = joined = batch_idx >= joined_from
        batch = s.batch_to_device(batch)
        results.set_batch(batch)
        call_hook(trainer, f"on_{prefix}_batch_start", batch, batch_idx, *extra)
        out = trainer._run_step(f"{prefix}_step", batch, batch_idx, *extra)
        if joined:  # reduced before the batch-end hook reads it, as a value reduced in self.log would be
            control.reduce_eval_step(results)
        call_hook(trainer, f"on_{prefix}_batch_end", out, batch, batch_idx, *extra)
        if joined:
            more = control.reduce_eval_step(results, more=not is_last)
    results.defer_eval_sync = False
    while counts is not None and more:  # rounds of steps this rank does not have
        control.reduce_eval_step(results)
        more = control.reduce_eval_step(results)


def _eval_epoch_end(trainer: Trainer, results: Any, stage: RunningStage, prefix: str) -> dict[str, float]:
    """Epoch metrics (readable in the epoch-end hook), the hook, late metrics; sanity checks log nothing."""
    if stage == RunningStage.SANITY_CHECKING:
        call_hook(trainer, f"on_{prefix}_epoch_end")
        results.reset()
        return {}
    step = trainer._progress.global_step
    computed = results.epoch_end(f"{prefix} epoch end")
    trainer._metrics.epoch_end({**computed, "logger": {}}, step, None)
    call_hook(trainer, f"on_{prefix}_epoch_end")
    late = results.epoch_end(f"on_{prefix}_epoch_end")
    merged = {k: {**computed[k], **late[k]} for k in computed}
    epoch = trainer.current_epoch if trainer.state.fn == TrainerFn.FITTING else None
    trainer._metrics.epoch_end(merged, step, epoch)
    return {k: float(v) for k, v in merged["callback"].items()}


def _split_by_loader(metrics: Mapping[str, float], count: int) -> list[dict[str, float]]:
    if count <= 1:
        return [dict(metrics)] if count else []
    out: list[dict[str, float]] = [{} for _ in range(count)]
    for key, value in metrics.items():
        for idx in range(count):
            if key.endswith(f"/dataloader_idx_{idx}"):
                out[idx][key] = value
                break
        else:
            for part in out:
                part[key] = value
    return out


def run_predict(trainer: Trainer, return_predictions: bool = True) -> list[Any] | None:
    """Predict over every predict loader; returns predictions (a list per loader when several)."""
    s = trainer.strategy
    loaders, limits = trainer._loaders.predict, trainer._loaders.predict_limits
    module = s.module
    module.eval()
    trainer.state.stage = RunningStage.PREDICTING
    many = len(loaders) > 1
    all_predictions: list[list[Any]] = []
    call_hook(trainer, "on_predict_start")
    call_hook(trainer, "on_predict_epoch_start")
    with torch.no_grad():
        for dl_idx, (loader, limit) in enumerate(zip(loaders, limits, strict=True)):
            predictions: list[Any] = []
            extra = (dl_idx,) if many else ()
            for batch_idx, batch, _ in data.iterate(loader, limit):
                batch = s.batch_to_device(batch)
                call_hook(trainer, "on_predict_batch_start", batch, batch_idx, *extra)
                out = trainer._run_step("predict_step", batch, batch_idx, *extra)
                call_hook(trainer, "on_predict_batch_end", out, batch, batch_idx, *extra)
                if return_predictions:
                    predictions.append(out)
            all_predictions.append(predictions)
    call_hook(trainer, "on_predict_epoch_end")
    call_hook(trainer, "on_predict_end")
    if not return_predictions:
        return None
    return all_predictions if many else (all_predictions[0] if all_predictions else [])
