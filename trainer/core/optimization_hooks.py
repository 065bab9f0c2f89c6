"""The optimization half of TrainModule: the hooks of the optimizer path, which a user overrides to change how
the Trainer steps (Lightning's names and arguments), and the methods called from training_step.

Where each hook runs: trainer/loops/automatic_optimization.py (automatic optimization) and trainer/hooks.py (the order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.optim import Optimizer

from strategies.exceptions import MisconfigurationError
from strategies.model.wrapped_optimizer import StrategyOptimizer, unwrap_optimizer
from trainer.core.optimizer_setup import step_scheduler
from trainer.hooks import call_hook

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_ALGORITHMS = ("norm", "value")


class OptimizationHooks:
    """Mixed into TrainModule; `self.trainer` is the Trainer running the module."""

    trainer: Trainer

    # --- hooks of the optimizer path (override) -------------------------------------------------
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Optimizer,
                       optimizer_closure: Callable[[], Any] | None = None) -> None:
        """Step the optimizer; called on the batch that closes each accumulation window (automatic optimization).

        `optimizer_closure` runs training_step, zero_grad (first batch of a window) and backward, and returns the
        loss: it must run, through `optimizer.step(closure=optimizer_closure)` or a direct call (the Trainer raises
        if it did not). An override can act around the step, e.g. a learning-rate warm-up:

            def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
                optimizer.step(closure=optimizer_closure)
                if self.trainer.global_step < 500:
                    for group in optimizer.param_groups:
                        group["lr"] = min(1.0, (self.trainer.global_step + 1) / 500) * self.hparams.lr

        `optimizer` is the wrapper `self.optimizers()` returns (an instance of your optimizer's class).
        """
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Zero the gradients; called inside the closure, before backward, on the first batch of each window."""
        optimizer.zero_grad()

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward on the loss (scaled under 16-mixed; divided by `accumulate_grad_batches`); `args`/`kwargs` come
        from `manual_backward` and go to `Tensor.backward`."""
        loss.backward(*args, **kwargs)

    def configure_gradient_clipping(self, optimizer: Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip before each optimizer step; overridden, it is called at every step with the Trainer's
        `gradient_clip_val` and `gradient_clip_algorithm`. Call `self.clip_gradients(...)` with your own values."""
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step one scheduler at its interval: `scheduler.step()`, or `scheduler.step(metric)` for one that monitors a
        metric. Override it to drive a scheduler that does not follow torch's API (then it is accepted)."""
        step_scheduler(scheduler, metric)

    # --- methods to call -------------------------------------------------------------------------
    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizer(s) of the fit: one object, or a list when there are several.

        Each is a wrapper that is an instance of your optimizer's class and whose `.step(closure)` goes through the
        strategy (precision, hooks, step count); `use_pl_optimizer=False` gives the optimizers themselves.
        """
        opts = self.trainer.fit_state.optimizers_for_user(wrapped=use_pl_optimizer)
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self) -> Any:
        """The scheduler(s) from configure_optimizers: None, one object, or a list."""
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        if not scheds:
            return None
        return scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward for manual optimization: use this instead of `loss.backward()` (precision, DDP). `args` and
        `kwargs` (e.g. `retain_graph=True`) go to `backward`."""
        loop = self.trainer.fit_state
        call_hook(loop, "on_before_backward", loss)
        loop.strategy.manual_backward(loss, *args, **kwargs)
        call_hook(loop, "on_after_backward")

    def clip_gradients(self, optimizer: Optimizer | StrategyOptimizer, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Clip the optimizer's gradients through the strategy (unscaled first under 16-mixed).

        None takes the Trainer's `gradient_clip_val` / `gradient_clip_algorithm`; a value that contradicts a
        `gradient_clip_val` (or a non-default `gradient_clip_algorithm`) set on the Trainer is an error (set one of
        them). A value of 0 or None clips nothing.
        """
        trainer = self.trainer
        flag_val, flag_algorithm = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
        if gradient_clip_val is None:
            gradient_clip_val = flag_val
        elif flag_val is not None and flag_val != gradient_clip_val:
            raise MisconfigurationError(
                f"Trainer(gradient_clip_val={flag_val!r}) and clip_gradients(gradient_clip_val={gradient_clip_val!r}) "
                "disagree; set only one of them."
            )
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = flag_algorithm or "norm"
        gradient_clip_algorithm = gradient_clip_algorithm.lower()
        if gradient_clip_algorithm not in _ALGORITHMS:
            raise MisconfigurationError(
                f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not one of {list(_ALGORITHMS)}."
            )
        if flag_val is not None and flag_algorithm not in (None, "norm") and gradient_clip_algorithm != flag_algorithm:
            raise MisconfigurationError(
                f"Trainer(gradient_clip_algorithm={flag_algorithm!r}) and clip_gradients(gradient_clip_algorithm="
                f"{gradient_clip_algorithm!r}) disagree; set only one of them."
            )
        if gradient_clip_val is None or gradient_clip_val == 0:
            return
        if isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, (int, float)):
            raise MisconfigurationError(f"gradient_clip_val must be an int or a float, got {gradient_clip_val!r}.")
        if gradient_clip_algorithm == "norm":
            trainer.strategy.clip_gradients(optimizer, max_norm=gradient_clip_val)
        else:
            trainer.strategy.clip_gradients(optimizer, max_value=gradient_clip_val)

    # --- several optimizers (manual optimization, e.g. a GAN) ------------------------------------------------
    def toggle_optimizer(self, optimizer: Optimizer | StrategyOptimizer) -> None:
        """Let only `optimizer`'s parameters compute gradients: parameters that only the other optimizers hold get
        `requires_grad=False` until `untoggle_optimizer`. A parameter frozen before stays frozen."""
        saved: dict[Tensor, bool] = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in saved:
                        saved[param] = param.requires_grad
                        param.requires_grad = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.requires_grad = saved[param]
        self._param_requires_grad_state = saved

    def untoggle_optimizer(self, optimizer: Optimizer | StrategyOptimizer) -> None:
        """Give the parameters of the other optimizers back the `requires_grad` they had at `toggle_optimizer`."""
        saved: dict[Tensor, bool] = getattr(self, "_param_requires_grad_state", {})
        target = unwrap_optimizer(optimizer)
        for opt in self.trainer.optimizers:
            if opt is target:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in saved:
                        param.requires_grad = saved[param]
        self._param_requires_grad_state = {}

    @contextmanager
    def toggled_optimizer(self, optimizer: Optimizer | StrategyOptimizer) -> Iterator[None]:
        """`toggle_optimizer` for the block, `untoggle_optimizer` after it (also when it raises)."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)
