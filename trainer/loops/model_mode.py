"""Train/eval mode around evaluation and predict: the `on_{validation,test,predict}_model_eval` and
`on_{validation,test}_model_train` hooks, called where Lightning calls them.

Before an evaluation the mode of every submodule is recorded, then `on_<stage>_model_eval` runs (by default
`self.eval()`); after it, an overridden `on_<stage>_model_train` runs, or else every submodule gets its recorded mode
back, so a submodule the user froze in eval mode (a BatchNorm, say) stays so, as in Lightning.
"""

from __future__ import annotations

from typing import Any

from torch import nn

_HOOK_STAGE = {"validation": "validation", "test": "test", "predict": "predict"}


class ModuleMode:
    """The `training` flag of every submodule, recorded by `enter` and put back by `leave`."""

    def __init__(self) -> None:
        self._modes: dict[str, bool] = {}

    def enter(self, module: nn.Module, stage: str, profiler: Any = None) -> None:
        """Record the modes, then call `on_<stage>_model_eval` (stage: validation, test or predict)."""
        self._modes = {name: sub.training for name, sub in module.named_modules()}
        _call(module, f"on_{_HOOK_STAGE[stage]}_model_eval", profiler)

    def leave(self, module: nn.Module, stage: str, profiler: Any = None) -> None:
        """Call an overridden `on_<stage>_model_train`, or restore the recorded modes."""
        from trainer.core.module import TrainModule
        from trainer.hooks import is_overridden

        hook = f"on_{_HOOK_STAGE[stage]}_model_train"
        if stage != "predict" and is_overridden(module, hook, TrainModule):
            _call(module, hook, profiler)
            return
        for name, sub in module.named_modules():
            mode = self._modes.get(name)
            if mode is not None:
                sub.training = mode


def zero_grad_before_validation(module: Any, window_open: bool, profiler: Any = None) -> None:
    """`on_validation_model_zero_grad` before a validation inside fit, unless an accumulation window is open."""
    if not window_open:
        _call(module, "on_validation_model_zero_grad", profiler)


def _call(module: Any, name: str, profiler: Any) -> None:
    """The module's hook `name` unless it was switched off (`= None`), timed as Lightning names it when profiling."""
    from trainer.hooks import MODULE, module_hook, timed

    hook = module_hook(module, name)
    if hook is not None and profiler is not None:
        hook = timed(profiler, f"{MODULE}{type(module).__name__}.{name}", hook)
    if hook is not None:
        hook()
