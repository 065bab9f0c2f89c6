"""Which arguments a step method takes, read once per run from its signature, as Lightning does.

`training_step(self, batch)` gets no `batch_idx`; `validation_step`, `test_step` and `predict_step` get
`batch_idx` when they take it, and `dataloader_idx` only with several loaders, where they must take it.
Lightning's rule for `batch_idx`: a parameter of that name, `*args`, or at least two parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import CodeType
from typing import Any

from strategies.exceptions import MisconfigurationError

STEP_NAMES = ("training_step", "validation_step", "test_step", "predict_step")


def _parameters(fn: Callable[..., Any]) -> inspect.FullArgSpec:
    fn = getattr(fn, "__wrapped__", fn)  # a decorated step: read the function it wraps
    return inspect.getfullargspec(fn)


def _positional(fn: Callable[..., Any]) -> tuple[list[str], bool]:
    """The step's positional parameter names (`self` included) and whether it takes `*args`.

    A plain function or method is read from its code object, which getfullargspec would also read, at a tenth of
    the cost (four steps are read before every first step); anything else goes through getfullargspec.
    """
    target = getattr(fn, "__wrapped__", fn)
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if isinstance(code, CodeType) and not hasattr(target, "__signature__"):
        return list(code.co_varnames[:code.co_argcount]), bool(code.co_flags & inspect.CO_VARARGS)
    spec = _parameters(fn)
    return spec.args, spec.varargs is not None


def takes_batch_idx(fn: Callable[..., Any]) -> bool:
    """Whether the step is called with `batch_idx` (Lightning: by name, `*args`, or two parameters or more)."""
    names, varargs = _positional(fn)
    args = names[1:] if inspect.ismethod(fn) or names[:1] == ["self"] else names
    return "batch_idx" in args or varargs or len(args) >= 2


class StepSignatureError(MisconfigurationError, RuntimeError):
    """A step method or batch hook whose parameters the loop cannot call it with (a RuntimeError too, the type
    Lightning raises for the same signatures)."""


def steps_without_batch_idx(module: Any) -> frozenset[str]:
    """The step methods of `module` that are called without `batch_idx`; a step that asks for Lightning's
    `dataloader_iter` (the step fetching its own batches) is refused, as this Trainer always hands it the batch."""
    steps = {name: fn for name in STEP_NAMES if callable(fn := getattr(module, name, None))}
    for name, fn in steps.items():
        if "dataloader_iter" in _positional(fn)[0]:
            raise StepSignatureError(
                f"{type(module).__name__}.{name}(dataloader_iter) asks for the loader's iterator: this Trainer calls "
                f"the step with each batch and its index; write it as {name}(self, batch, batch_idx)."
            )
    return frozenset(name for name, fn in steps.items() if not takes_batch_idx(fn))


def check_dataloader_idx(module: Any, step: str, hooks: tuple[str, ...], many: bool) -> None:
    """With several loaders the step and batch hooks get `dataloader_idx`: they must take it (Lightning's check).

    With one loader they do not get it, so a `dataloader_idx` without a default is an error too.
    """
    for name in (step, *hooks):
        fn = getattr(module, name, None)
        if not callable(fn):  # switched off with `module.<hook> = None`
            continue
        spec = _parameters(fn)
        params = inspect.signature(fn).parameters
        present = "dataloader_idx" in spec.args or spec.varargs is not None
        if many and not present:
            raise StepSignatureError(
                f"there are several {step.split('_')[0]} dataloaders, but {type(module).__name__}.{name}() has no "
                "`dataloader_idx` parameter; add `dataloader_idx=0` to its signature."
            )
        if not many and "dataloader_idx" in params and params["dataloader_idx"].default is inspect.Parameter.empty:
            raise StepSignatureError(
                f"there is one {step.split('_')[0]} dataloader, but {type(module).__name__}.{name}() requires "
                "`dataloader_idx`; give it a default (`dataloader_idx=0`) or remove it."
            )
