"""What a config may build at a given place (a "slot"), checked before anything is called.

Why: a `class_path`/`_target_` names any importable callable, and building it calls it. Objects were once built
before their type was checked, so `class_path: os.system` or `_target_: subprocess.call` ran, at the top of a
section, as a callback, or nested as a model argument annotated `int`. Now the target is imported, then checked
against the slot's type, and only then called:

- a section's slot is its base class (`model`: TrainModule, `data`: DataModule, `callbacks`: Callback, `logger`:
  Logger; the Trainer's `strategy`, `profiler`, `callbacks`, `logger` likewise);
- an argument's slot is its annotation (`backbone: nn.Module`, `callbacks: list[Callback] | None`); a value
  annotation (`int`, `str | None`, ...) takes no object at all;
- a plain function (not a class) is built only where the annotation asks for a callable; an unannotated or `Any`
  argument takes classes only.

This makes a config say what it builds; it does not make a config from an untrusted source safe: importing a module
runs its code, and a class in an open slot is still called (docs/cli.md says so).
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

_VALUES = (int, float, str, bool, bytes, type(None), PurePath, dict)
_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable,
              collections.abc.Collection, collections.abc.MutableSequence)


@dataclass(frozen=True)
class Slot:
    """What may be built at one place of a config: subclasses of `classes` (None: any class), and plain functions
    when `callables` is set."""

    classes: tuple[type, ...] | None = None
    callables: bool = False

    def describe(self) -> str:
        if self.classes is None:
            return "a class"
        names = [getattr(c, "__qualname__", repr(c)) for c in self.classes]
        if self.callables:
            names.append("a function")
        return " or ".join(names) if names else "a plain value"


ANY_CLASS = Slot()


def section_slots() -> dict[str, Slot]:
    """The slots of `python -m trainer`'s sections."""
    from callbacks.base import Callback
    from trainer.core.datamodule import DataModule
    from trainer.core.module import TrainModule
    from trainer.loggers.base import Logger

    return {"model": Slot((TrainModule,)), "data": Slot((DataModule,)), "callbacks": Slot((Callback,)),
            "logger": Slot((Logger,))}


def trainer_slots() -> dict[str, Slot]:
    """The Trainer arguments that take objects, which its signature annotates as Any (they also take names)."""
    from callbacks.base import Callback
    from strategies.base import Strategy
    from trainer.loggers.base import Logger
    from trainer.profilers.base import Profiler

    return {"callbacks": Slot((Callback,)), "logger": Slot((Logger,)), "strategy": Slot((Strategy,)),
            "profiler": Slot((Profiler,))}


def slot_for(annotation: Any) -> Slot:
    """The slot an annotation describes: its classes (a union's, a list's items'), callables for Callable."""
    if annotation in (None, inspect.Parameter.empty, Any) or isinstance(annotation, (str, typing.TypeVar)):
        return ANY_CLASS
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return _union([slot_for(arg) for arg in args])
    if origin is collections.abc.Callable or annotation is collections.abc.Callable or annotation is typing.Callable:
        return Slot((), callables=True)
    if origin in _SEQUENCES:
        return slot_for(args[0]) if args else ANY_CLASS
    if origin is not None:  # dict[...], type[...], Literal[...], Annotated[...]: not a slot for one object
        return Slot(()) if origin is dict or origin is typing.Literal else ANY_CLASS
    if isinstance(annotation, type):
        return Slot(()) if issubclass(annotation, _VALUES) else Slot((annotation,))
    return ANY_CLASS


def _union(parts: list[Slot]) -> Slot:
    callables = any(part.callables for part in parts)
    if any(part.classes is None for part in parts):
        return Slot(None, callables)
    return Slot(tuple(cls for part in parts for cls in part.classes or ()), callables)


def argument_slots(cls: Any) -> dict[str, Slot]:
    """The slot of each argument of `cls`'s constructor (or of a function), from its resolved annotations."""
    target = getattr(cls, "__init__", cls) if isinstance(cls, type) else cls
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - unresolvable annotations (names under TYPE_CHECKING, C types): open slots
        hints = {}
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}
    return {name: slot_for(hints.get(name, param.annotation)) for name, param in params.items()}


def refusal(obj: Any, slot: Slot, target: str) -> str | None:
    """Why `obj` (what `target` imported to) must not be called at `slot`, or None."""
    if slot.classes == () and not slot.callables:
        return f"this place takes a plain value, not an object: '{target}' is not built here"
    if not isinstance(obj, type):
        if slot.callables:
            return None
        kind = "a function" if inspect.isroutine(obj) else f"a {type(obj).__name__}"
        return (f"'{target}' is {kind}, not a class; a config builds classes here ({slot.describe()}), and calls a "
                "function only where the argument is annotated as a Callable")
    if slot.classes is None or slot.callables or _subclass(obj, slot.classes):
        return None
    return f"'{target}' is not a subclass of {slot.describe()}, which this place expects; nothing was built"


def _subclass(obj: type, classes: tuple[type, ...]) -> bool:
    try:
        return issubclass(obj, classes)
    except TypeError:  # a class that refuses issubclass (a non-runtime Protocol): its annotation is not checkable
        return True
