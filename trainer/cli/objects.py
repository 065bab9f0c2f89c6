"""Building the objects a config names: `class_path`/`init_args` (or `_target_`) specs are imported, checked
against the type their place expects (trainer/cli/slots.py) and their arguments against the signature (unknown
names with a suggestion, missing ones, plainly wrong types) before anything is built; then built depth-first."""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from typing import Any

from strategies.exceptions import ConfigError, MisconfigurationError
from trainer.cli.config import ConfigSources
from trainer.cli.slots import ANY_CLASS, Slot, argument_slots, refusal

# Where a class name without a dot is looked up, by key path (`callbacks: [{class_path: EarlyStopping}]`).
_SHORT_NAMES = {"callbacks": "callbacks", "trainer.callbacks": "callbacks", "logger": "trainer.loggers",
                "trainer.logger": "trainer.loggers", "trainer.strategy": "strategies"}
# Annotations simple enough to check a YAML value against; anything richer is left to the callee.
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "None": (type(None),),
    "Path": (str,), "list": (list,), "Sequence": (list,), "tuple": (list,), "dict": (dict,), "Mapping": (dict,),
}


def did_you_mean(name: str, choices: Any) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _type_ok(value: Any, annotation: Any) -> bool:
    """True unless `annotation` is simple (int, float | None, ...) and `value` plainly does not fit."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    allowed: list[type] = []
    for part in text.split("|"):
        name = part.strip().split("[")[0]
        if name not in _SIMPLE_TYPES:
            return True
        allowed.extend(_SIMPLE_TYPES[name])
    if isinstance(value, bool):
        return bool in allowed
    return isinstance(value, tuple(allowed))


def is_class_spec(value: Any) -> bool:
    return isinstance(value, dict) and ("class_path" in value or "_target_" in value)


class ObjectBuilder:
    """Walks config values: `check` imports classes and checks their kwargs without building anything;
    `build` then instantiates class specs depth-first (init_args may hold further specs)."""

    def __init__(self, sources: ConfigSources) -> None:
        self.sources = sources

    def check(self, value: Any, key: str, slot: Slot = ANY_CLASS) -> None:
        self._walk(value, key, make=False, slot=slot)

    def build(self, value: Any, key: str, slot: Slot = ANY_CLASS) -> Any:
        return self._walk(value, key, make=True, slot=slot)

    def arguments(self, cls: Any, kwargs: dict[str, Any], key: str, make: bool,
                  slots: dict[str, Slot] | None = None) -> dict[str, Any]:
        """`kwargs` of `cls` with the specs inside them checked (and built when `make`), each against its argument's
        slot (`slots` first, then `cls`'s annotations)."""
        known = {**argument_slots(cls), **(slots or {})}
        return {k: self._walk(v, f"{key}.{k}", make, known.get(k, ANY_CLASS)) for k, v in kwargs.items()}

    def _walk(self, value: Any, key: str, make: bool, slot: Slot = ANY_CLASS) -> Any:
        if isinstance(value, list):
            return [self._walk(item, f"{key}[{i}]", make, slot) for i, item in enumerate(value)]
        if is_class_spec(value):
            return self._instantiate(value, key, make, slot)
        if isinstance(value, dict):
            return {k: self._walk(v, f"{key}.{k}", make) for k, v in value.items()}
        return value

    def _instantiate(self, spec: dict[str, Any], key: str, make: bool, slot: Slot) -> Any:
        if "class_path" in spec:
            for extra in spec:
                if extra not in ("class_path", "init_args"):
                    raise self.sources.error(f"{key}.{extra}", "unexpected key beside class_path; put arguments "
                                             f"under init_args{did_you_mean(extra, ['init_args'])}")
            target, target_key = spec["class_path"], f"{key}.class_path"
            kwargs, args_key = spec.get("init_args") or {}, f"{key}.init_args"
        else:
            target, target_key = spec["_target_"], f"{key}._target_"
            kwargs, args_key = {k: v for k, v in spec.items() if k != "_target_"}, key
        if not isinstance(kwargs, dict):
            raise self.sources.error(args_key, f"must be a mapping of arguments, got {kwargs!r}")
        cls = self.import_target(target, target_key, _SHORT_NAMES.get(re.sub(r"\[\d+\]$", "", key)))
        problem = refusal(cls, slot, target)
        if problem is not None:  # before anything is called: the check that keeps `os.system` from running
            raise self.sources.error(target_key, problem)
        return self.construct(cls, kwargs, args_key, make, label=f"{key}", name=target)

    def construct(self, cls: Any, kwargs: dict[str, Any], args_key: str, make: bool = True,
                  label: str | None = None, name: str | None = None, extra: dict[str, Any] | None = None) -> Any:
        """Check `kwargs` against `cls`'s signature, build the specs inside them (each checked against its
        argument's annotation), then call `cls` (when `make`). `extra` holds arguments that are objects already
        (built elsewhere), passed as they are."""
        self.check_kwargs(cls, kwargs, args_key, provided=set(extra or ()))
        built = self.arguments(cls, kwargs, args_key, make)
        if not make:
            return None
        try:
            return cls(**built, **(extra or {}))
        except (ConfigError, MisconfigurationError) as exc:
            where = name or getattr(cls, "__qualname__", repr(cls))
            raise self.sources.error(label or args_key, f"{where}: {exc}") from None

    def import_target(self, target: Any, key: str, default_module: str | None) -> Any:
        """`package.module.Name` (or a bare `Name` where the key has a default module) → the object."""
        if not isinstance(target, str) or not _IMPORT_PATH.fullmatch(target):
            raise self.sources.error(key, f"must be an import path like 'package.module.Class' (no leading dot, no "
                                     f"spaces), got {target!r:.200}")
        module_name, _, attr = target.rpartition(".")
        if not module_name:
            if default_module is None:
                raise self.sources.error(key, f"'{target}' is not an import path; write 'package.module.{target}'")
            module_name = default_module
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            hint = " (run from the folder that holds it, or add it to PYTHONPATH)" if exc.name == module_name else ""
            raise self.sources.error(key, f"cannot import '{target}': {exc}{hint}") from None
        if not hasattr(module, attr):
            names = [n for n in dir(module) if not n.startswith("_")]
            raise self.sources.error(key, f"cannot import '{target}': module '{module_name}' has no "
                                     f"'{attr}'{did_you_mean(attr, names)}")
        obj = getattr(module, attr)
        if not callable(obj):
            raise self.sources.error(key, f"'{target}' is not a class or function")
        return obj

    def check_kwargs(self, cls: Any, kwargs: dict[str, Any], key: str, provided: set[str] | None = None) -> None:
        """Unknown names (with a suggestion), missing required arguments and plainly wrong types; `provided` names
        arguments that will be given as objects (not checked)."""
        try:
            params = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            return
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        named = {n: p for n, p in params.items() if p.kind in kinds}
        open_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
        label = getattr(cls, "__qualname__", repr(cls))
        for name, value in kwargs.items():
            sub = f"{key}.{name}"
            if name not in named:
                if open_kwargs:
                    continue
                raise self.sources.error(sub, f"unknown argument '{name}' of {label}{did_you_mean(name, named)}")
            annotation = named[name].annotation
            plainly_wrong = not is_class_spec(value) and not _type_ok(value, annotation)
            if annotation is not inspect.Parameter.empty and plainly_wrong:
                raise self.sources.error(sub, f"{label} expects {annotation}, got {type(value).__name__} {value!r}")
        for name, p in named.items():
            if p.default is inspect.Parameter.empty and name not in kwargs and name not in (provided or ()):
                raise self.sources.error(key, f"{label} needs the argument '{name}'")
