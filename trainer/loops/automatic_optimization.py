"""Automatic optimization through the module's overridable hooks, in Lightning's closure design.

On the batch that closes an accumulation window the loop calls the module's
`optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)`; its default calls
`optimizer.step(closure=optimizer_closure)`. The closure (`TrainingClosure`) does the batch's work:
training_step, the per-step agreement between ranks (a skip, NaN or stop is settled on every rank before any
backward), `optimizer_zero_grad` on the first batch of a window, and backward. Because the optimizer calls
the closure, an override can act around the step (a learning-rate warm-up) and closure optimizers work
(LBFGS calls it several times: training_step runs each time). The optimizer handed to `optimizer_step` is the
wrapper of strategies/model/wrapped_optimizer.py: after each closure call it runs `after_closure` below
(on_before_optimizer_step, then clipping through `configure_gradient_clipping`), then steps through the
strategy. Batches that only accumulate call the closure directly, without `optimizer_step`, as Lightning does.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.optim import Optimizer

from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import MisconfigurationError
from strategies.model.wrapped_optimizer import StrategyOptimizer, wrap_optimizer
from trainer.checkpoint.loop_position import Phase
from trainer.hooks import MODULE, call_hook, is_overridden, module_hook, timed

if TYPE_CHECKING:
    from trainer.loops.fit_state import FitState

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


class TrainingClosure:
    """One batch's training_step, agreement, zero_grad and backward; returns the detached loss (None: skipped).

    `output` and `loss` keep what the last call's training_step returned, `detached` what it returned itself (the
    loss detached, or None); `calls` counts the calls.
    """

    __slots__ = ("loop", "batch", "batch_idx", "is_last", "is_last_micro", "zero_grad", "output", "loss", "detached",
                 "calls")

    def __init__(self, loop: FitState, batch: Any, batch_idx: int, is_last: bool, is_last_micro: bool) -> None:
        self.loop, self.batch, self.batch_idx = loop, batch, batch_idx
        self.is_last, self.is_last_micro = is_last, is_last_micro
        self.zero_grad = batch_idx % loop.schedule.accumulate_grad_batches == 0  # the first batch of its window
        self.output: Any = None
        self.loss: Tensor | None = None
        self.detached: Tensor | None = None
        self.calls = 0

    def __call__(self) -> Tensor | None:
        loop = self.loop
        self.calls += 1
        self.detached = None
        control = loop.control
        self.output = out = loop.run_step("training_step", self.batch, self.batch_idx)
        # loss_from's own first check, here: the common output (a scalar loss tensor) needs no call
        self.loss = loss = out if type(out) is Tensor and out.requires_grad and out.numel() == 1 else loss_from(out)
        # Every rank learns whether any rank skips (here), ran out of data or got a stop signal
        # (trainer/ranks/agreement.py).
        skip = control.after_training_step(loop, loss, self.is_last, True)
        silent = loop.hooks.silent  # hooks nobody overrides: skipped without a call (trainer/hooks.py)
        if self.zero_grad:  # the first batch of its window: on_before_zero_grad, then the module's optimizer_zero_grad
            optimizer = loop.optimizers[0]
            if "on_before_zero_grad" not in silent:
                call_hook(loop, "on_before_zero_grad", optimizer)
            _call_module(loop, "optimizer_zero_grad", loop.progress.current_epoch, self.batch_idx, optimizer)
        if skip or loss is None:
            return None
        if "on_before_backward" not in silent:
            call_hook(loop, "on_before_backward", loss)
        accumulate = loop.schedule.accumulate_grad_batches
        results = loop.results
        previous, results.current_fx = results.current_fx, "backward"
        try:
            loop.backward(loss / accumulate if accumulate > 1 else loss)
        finally:
            results.current_fx = previous
        if control.in_flight is not None:  # a NaN loss or differing metric names on any rank: every rank raises here
            control.after_backward(loop)
        loop.window_has_loss = True
        loop.position.phase = Phase.STEP_PENDING if self.is_last_micro else Phase.BACKWARD_DONE
        if "on_after_backward" not in silent:
            call_hook(loop, "on_after_backward")
        self.detached = detached = loss.detach()  # on_train_batch_end's outputs hold this same tensor (as Lightning's)
        return detached


class RestoredGradients:
    """The closure of a step resumed from a checkpoint taken between its backward and its step: the gradients
    were restored from the checkpoint, so there is nothing to run again."""

    calls = 0

    def __call__(self) -> None:
        self.calls += 1


def step_window(loop: FitState, batch_idx: int, closure: TrainingClosure | RestoredGradients) -> None:
    """The batch that closes an accumulation window: the module's `optimizer_step`, which must run the closure;
    then, when the window had a backward, step-interval schedulers and the step count."""
    loop.step_taken = False
    _call_module(loop, "optimizer_step", loop.progress.current_epoch, batch_idx, loop.user_optimizers[0], closure)
    if not closure.calls:
        raise MisconfigurationError(
            f"{type(loop.strategy.module).__name__}.optimizer_step did not run its `optimizer_closure`, which runs "
            "training_step and backward. Call `optimizer.step(closure=optimizer_closure)`, or call "
            "`optimizer_closure()` yourself when you skip the step."
        )
    if not loop.window_has_loss:  # every batch of the window was skipped: no gradients, no step
        return
    progress = loop.progress
    stepper = loop.scheduler_stepper
    if loop.step_taken and stepper.configs and stepper.has_step_schedulers:  # counted in batches of the epoch
        stepper.step("step", batch_idx + 1, loop.metrics.callback_metrics, plateau=False)
    loop.position.phase = Phase.STEPPED
    progress.global_step += 1
    loop.window_has_loss = False


def after_closure(loop: FitState, optimizer: Optimizer) -> None:
    """Between the closure and the optimizer's own step (the wrapper calls it).

    Automatic optimization, when the window has gradients: unscale them (hooks and clipping see true values
    under 16-mixed), on_before_optimizer_step, then clip through the module's `configure_gradient_clipping` with
    the Trainer's flags. Manual optimization: on_before_optimizer_step.
    """
    if not loop.automatic:
        call_hook(loop, "on_before_optimizer_step", optimizer)
        return
    if not loop.window_has_loss:
        return
    loop.position.phase = Phase.STEP_PENDING  # also when this batch was skipped but the window has gradients
    strategy, spec = loop.strategy, loop.spec
    if strategy.unscales_gradients:  # a precision without a loss scaler has nothing to undo
        strategy.unscale_gradients(optimizer)
    if "on_before_optimizer_step" not in loop.hooks.silent:
        call_hook(loop, "on_before_optimizer_step", optimizer)
    if loop.custom_clipping:  # Lightning passes the flags by keyword, the algorithm None when not given
        _call_module(loop, "configure_gradient_clipping", optimizer, gradient_clip_val=spec.gradient_clip_val,
                     gradient_clip_algorithm=loop.trainer.gradient_clip_algorithm)
    elif spec.gradient_clip_val:  # None or 0: no clipping
        loop.clip_gradients(optimizer)


def after_step(loop: FitState, optimizer: Optimizer, stepped: bool) -> None:
    """After the wrapper stepped. Automatic: remember whether it really stepped (an AMP overflow skips it) for the
    schedulers. Manual: every `optimizer.step()` counts as a step, as in Lightning."""
    if loop.automatic:
        loop.step_taken = loop.step_taken or stepped
        return
    loop.progress.global_step += 1
    loop.position.phase = Phase.MANUAL_STEPPED


_AUTOMATIC_ONLY = ("optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping")


def check_manual_optimization(loop: FitState, module: Any, base: type) -> None:
    """Manual optimization: refuse `gradient_clip_val` (as Lightning does: clip in training_step with
    `self.clip_gradients`), and say that overrides of the automatic path's hooks are not called."""
    if loop.automatic:
        return
    if loop.spec.gradient_clip_val:
        raise MisconfigurationError(
            f"Trainer(gradient_clip_val={loop.spec.gradient_clip_val!r}) clips in automatic optimization only; with "
            "`self.automatic_optimization = False` call `self.clip_gradients(optimizer, gradient_clip_val=..., "
            "gradient_clip_algorithm=...)` in training_step and drop the flag."
        )
    unused = [name for name in _AUTOMATIC_ONLY if is_overridden(module, name, base)]
    if unused:
        rank_zero_warn(
            f"{type(module).__name__} overrides {', '.join(unused)}, which the Trainer calls in automatic optimization "
            "only; with `self.automatic_optimization = False` they are not called (as in Lightning). Step, zero and "
            "clip in training_step instead."
        )


def wrap_optimizers(loop: FitState, built: list[Optimizer]) -> list[StrategyOptimizer]:
    """The wrappers of the run's optimizers (`loop.optimizers`, as the strategy set them up), each an instance of
    the class of the optimizer `configure_optimizers` built (`built`)."""
    return [wrap_optimizer(optimizer, loop.strategy, partial(after_closure, loop), partial(after_step, loop),
                           type(user)) for optimizer, user in zip(loop.optimizers, built, strict=True)]


def _call_module(loop: FitState, name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the module's own `name` (its default or the user's override), with `self.log` attributed to it. The module
    is the run's TrainModule (`loop.module`), the one every other module hook is called on (trainer/hooks.py)."""
    module = loop.module
    fn = module_hook(module, name)
    if fn is None:  # switched off with `module.<hook> = None`
        return None
    if loop.trainer.profiler.enabled:
        fn = timed(loop.trainer.profiler, f"{MODULE}{type(module).__name__}.{name}", fn)
    results = loop.results
    previous, results.current_fx = results.current_fx, name
    try:
        return fn(*args, **kwargs)
    finally:
        results.current_fx = previous
