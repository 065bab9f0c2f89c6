"""Hook dispatch: `call_hook` is the one function that calls callbacks and TrainModule hooks.

Callbacks run first, in list order with ModelCheckpoint callbacks moved last, then the TrainModule.
One exception, as in Lightning: for `on_train_epoch_end` the monitoring callbacks (ModelCheckpoint,
EarlyStopping) run *after* the module hook, so that metrics the module logs there can be monitored.

The order of every hook during `fit` (the hook-order test expands this pseudocode and compares):

    fit:
        setup
        configure_optimizers
        on_fit_start
        if sanity_check:
            on_sanity_check_start
            on_validation_start
            on_validation_epoch_start
            for batch in sanity_batches:
                on_validation_batch_start
                validation_step
                on_validation_batch_end
            on_validation_epoch_end
            on_validation_end
            on_sanity_check_end
        on_train_start
        for epoch in epochs:
            on_train_epoch_start
            for batch in train_batches:
                on_train_batch_start
                optimizer_step
                    training_step
                    on_before_zero_grad
                    optimizer_zero_grad
                    on_before_backward
                    backward
                    on_after_backward
                    on_before_optimizer_step
                    configure_gradient_clipping
                on_train_batch_end
            if validation:
                on_validation_start
                on_validation_epoch_start
                for batch in val_batches:
                    on_validation_batch_start
                    validation_step
                    on_validation_batch_end
                on_validation_epoch_end
                on_validation_end
            on_train_epoch_end
        on_train_end
        on_fit_end
        teardown

Notes on the pseudocode:
- An indented block runs inside the line above it: the module's `optimizer_step` runs the closure
  (training_step ... backward) through `optimizer.step(closure=...)`, and the optimizer steps after
  on_before_optimizer_step and clipping (trainer/loops/automatic_optimization.py). This is Lightning 2.x's order;
  tests/compat/test_optimizer_path.py compares it with Lightning's own.
- With accumulate_grad_batches=N, optimizer_step (and so on_before_optimizer_step and
  configure_gradient_clipping) runs only on the last batch of each window and of the epoch; the other
  batches run the closure's work directly. on_before_zero_grad and optimizer_zero_grad run only on the
  first batch of each window. An optimizer that calls its closure several times (LBFGS) runs the
  block several times.
- `configure_gradient_clipping` and `optimizer_zero_grad` are module methods (no callback hooks);
  `configure_gradient_clipping` is called only when the module overrides it (the default clips with
  the Trainer's flags directly). A window whose batches were all skipped (training_step returned None)
  has no on_before_optimizer_step and no clipping, and does not count as a step.
- With a mid-epoch `val_check_interval`, the validation block runs right after the
  on_train_batch_end of each batch that is due, and on_train_epoch_end still closes the epoch.
- Checkpoint saves call `on_save_checkpoint` wherever a ModelCheckpoint decides to save
  (after validation, or at on_train_epoch_end when there is no validation).
- `validate`/`test` run the validation block above with their own stage names
  (on_test_start, on_test_epoch_start, ...), between setup and teardown.
- On an exception, callbacks get `on_exception(trainer, module, exc)` before teardown.
- Module and DataModule hooks around the pseudocode (they are not callback hooks, as in Lightning):
  `configure_callbacks` at the start of every run, then `prepare_data` (once per machine) before setup,
  and `configure_model` right after setup; before every batch's `on_*_batch_start`,
  `on_before_batch_transfer`, `transfer_batch_to_device` and `on_after_batch_transfer` (the DataModule's
  when it defines them); `on_validation_model_eval` before `on_validation_start` (after
  `on_sanity_check_start`) and `on_validation_model_train` after `on_validation_end`, likewise for test
  and `on_predict_model_eval`; `on_validation_model_zero_grad` before a validation inside fit.
- `setup` and `teardown` get the run's `TrainerFn` by keyword (`stage="fit"`), the DataModule's first, then the
  callbacks', then the module's (teardown likewise).
- Where the loaders are requested (Lightning's order): `val_dataloader` inside the sanity check (after
  on_sanity_check_start), `train_dataloader` after the sanity check, before on_train_start (and `val_dataloader`
  there when no sanity check ran and the first epoch validates); `val/test/predict_dataloader` of validate/test/
  predict after the module's `zero_grad()`, which runs before every stage (after on_fit_start in fit). A stage
  whose loaders hold no batch (or whose limit is 0) runs none of its hooks. With
  `reload_dataloaders_every_n_epochs` they are requested again at the epoch start / validation that is due.
- Schedulers: step-interval ones right after the optimizer step, epoch-interval ones after the epoch's last batch
  (both before on_train_batch_end); the ones that monitor a metric (ReduceLROnPlateau) after that batch's validation
  or after on_train_epoch_end. Manual optimization steps its schedulers itself.
- Evaluation hooks, from on_*_model_eval to on_*_model_train, run under `torch.inference_mode` (`no_grad` inside
  fit); the module's mode is left as it is for training (no `.train()` at epoch start).
- A `model.<hook> = None` switches the hook off (a `validation_step = None` the validation loop).
- A fit() on a Trainer that already reached max_epochs/max_steps runs setup, configure_optimizers, on_fit_start,
  the sanity check, `train_dataloader`, on_fit_end and teardown (as in Lightning).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.loops.fit_state import FitState
    from trainer.trainer import Trainer

# Lightning's prefixes of an object's actions in a profiler report, kept as a report of Lightning's shows them
MODULE, DATAMODULE, STRATEGY = "[LightningModule]", "[LightningDataModule]", "[Strategy]"
# Hooks for which monitoring callbacks must run after the module (see module docstring).
_MONITOR_AFTER_MODULE = frozenset({"on_train_epoch_end"})
# `call_hook(loop, "on_train_epoch_end")` calls the other callbacks and the module; the loop calls
# `call_hook(loop, "on_train_epoch_end" + MONITORING)` for the monitoring callbacks once the values the module
# logged there are in `callback_metrics` (as Lightning's, computed when read).
MONITORING = ":monitoring"
_LOGGED_AS = {name + MONITORING: name for name in _MONITOR_AFTER_MODULE}  # what `self.log` in such a part counts as


def is_overridden(obj: Any, name: str, base: type) -> bool:
    """Lightning's rule: `obj.name` has code other than `base.name`'s. A wrapper (`functools.wraps`,
    `functools.partial`, `Mock(wraps=...)`) counts as what it wraps, and `obj.name = None` (Lightning's idiom to switch
    a loop or a hook off) as not defined. A callable without code of its own (an object with `__call__`) counts."""
    attr = getattr(obj, name, None) if obj is not None else None
    if attr is None:
        return False
    attr = getattr(attr, "__wrapped__", attr)
    if type(attr).__module__ == "unittest.mock":  # Mock(wraps=fn): the function it wraps (without importing mock)
        attr = getattr(attr, "_mock_wraps", None)
    elif isinstance(attr, partial):
        attr = attr.func
    if attr is None:
        return False
    default = getattr(base, name, None)
    default = getattr(default, "__wrapped__", default)
    code = getattr(attr, "__code__", None)
    return code is None or code is not getattr(default, "__code__", None)


def runs_hook(obj: Any, name: str, base: type) -> bool:
    """Whether calling `obj.name` may do more than `base`'s no-op: a class override, or any callable instance
    attribute (a wrapper of the default included, so that it is called as Lightning calls every hook); None or
    another non-callable switches the hook off. Cheaper than `is_overridden`: the dispatcher asks it once per hook."""
    own = getattr(obj, "__dict__", {})
    if name in own:
        return callable(own[name])
    impl = getattr(type(obj), name, None)
    return impl is not None and impl is not getattr(base, name, None)


def module_hook(module: Any, name: str) -> Callable[..., Any] | None:
    """`module.name` when it is callable, else None: a hook set to None is skipped, as Lightning skips it."""
    fn = getattr(module, name, None)
    return fn if callable(fn) else None


class HookDispatcher:
    """Caches, per hook name, the bound callables that really do something (resolved once per run).

    `silent` holds the names resolved to nothing. The per-step call sites test it before calling `call_hook`
    (`if "on_before_backward" not in loop.hooks.silent: call_hook(...)`), so a hook nobody overrides costs one set
    lookup per step and no call.
    """

    def __init__(self, trainer: Trainer, module_base: type) -> None:
        self._trainer = trainer
        self._module_base = module_base  # TrainModule, whose no-op hooks count as not overridden
        self._cache: dict[str, list[Callable[..., Any]]] = {}
        self.silent: set[str] = set()

    def reset(self) -> None:
        self._cache.clear()
        self.silent.clear()

    def __getstate__(self) -> dict[str, Any]:
        # bound closures do not pickle; rebuilt on use
        return {"_trainer": self._trainer, "_module_base": self._module_base, "_cache": {}, "silent": set()}

    def targets(self, name: str) -> list[Callable[..., Any]]:
        found = self._cache.get(name)
        if found is None:
            found = self._cache[name] = self._resolve(name)
            if not found:
                self.silent.add(name)
        return found

    def _resolve(self, name: str) -> list[Callable[..., Any]]:
        trainer = self._trainer
        module = trainer.lightning_module
        name, _, part = name.partition(":")
        callbacks: list[Any] = []
        if trainer.callbacks:  # without any, callbacks.base need not be imported
            from callbacks.base import Callback

            callbacks = [cb for cb in trainer.callbacks if runs_hook(cb, name, Callback)]
        if name in _MONITOR_AFTER_MODULE:
            monitoring = [cb for cb in callbacks if getattr(cb, "is_monitoring_callback", False)]
            if part:  # the monitoring callbacks' turn
                return [_callback_call(cb, name, trainer) for cb in monitoring]
            callbacks = [cb for cb in callbacks if cb not in monitoring]
        calls = [_callback_call(cb, name, trainer) for cb in callbacks]
        # Lightning calls (and so profiles) every module hook; without a profiler only the ones that do something
        profiling_default = trainer.profiler.enabled and callable(getattr(self._module_base, name, None))
        if module is not None and (runs_hook(module, name, self._module_base)
                                   or profiling_default and module_hook(module, name) is not None):
            calls.append(_profiled(trainer, f"{MODULE}{type(module).__name__}.{name}", getattr(module, name)))
        return calls


def _profiled(trainer: Trainer, action: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` timed under Lightning's action name when a profiler is on; `fn` itself (no cost) when not."""
    return timed(trainer.profiler, action, fn)


def timed(profiler: Any, action: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` timed as `action` when `profiler` is on; `fn` itself (no cost) when it is off."""
    if not profiler.enabled:
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        with profiler.profile(action):
            return fn(*args, **kwargs)

    return call


def profiled_method(profiler: Any, obj: Any, name: str, tag: str) -> Callable[..., Any]:
    """`obj.name`, timed as Lightning names it (`[LightningModule]MyModel.configure_optimizers`, ...) when profiling;
    `tag` is one of MODULE, DATAMODULE, STRATEGY."""
    return timed(profiler, f"{tag}{type(obj).__name__}.{name}", getattr(obj, name))


def _callback_call(callback: Any, name: str, trainer: Trainer) -> Callable[..., Any]:
    """`callback.name(trainer, module, ...)`, with the run's module bound now: the cache is rebuilt whenever a run
    attaches a module (`HookDispatcher.reset`), and a `partial` adds no Python frame per call."""
    call = partial(getattr(callback, name), trainer, trainer.lightning_module)
    return _profiled(trainer, f"[Callback]{callback.state_key}.{name}", call)


def call_hook(loop: FitState, name: str, *args: Any, **kwargs: Any) -> Any:
    """Call hook `name` on every callback (as `cb.name(trainer, module, *args)`), then on the module.

    Returns the last non-None value a hook returned (on_train_batch_start may return -1).
    """
    hooks = loop.hooks
    targets = hooks._cache.get(name)
    if targets is None:
        targets = hooks.targets(name)
    if not targets:  # the common case on the hot path: nobody overrides this hook
        return None
    results = loop.results
    previous = results.current_fx
    results.current_fx = _LOGGED_AS.get(name, name)
    returned = None
    try:
        for fn in targets:
            value = fn(*args, **kwargs)
            if value is not None:
                returned = value
    finally:
        results.current_fx = previous
    return returned
