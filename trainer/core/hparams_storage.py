"""The form in which a hyperparameter is stored in a checkpoint, and how it is read back.

Why: a checkpoint is read with `torch.load(weights_only=True)`, so a value torch's safe loader refuses cannot be
pickled into it. Such a value is recorded in a form that loader reads (a class or function as its import path;
a `functools.partial` as Hydra's `{"_target_": ..., "_partial_": True, ...}` when its function and arguments
allow; a mapping or `argparse.Namespace` as a dict; anything else as its repr) and its key is listed under
`hparams_replaced`, so that `load_from_checkpoint` asks for it instead of passing a string where the module
expected an object. Nothing is ever imported from a checkpoint.
"""

from __future__ import annotations

import ast
import csv
import functools
import inspect
import io
import pickle
import sys
from argparse import Namespace
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.weights_only import StandIn, allowed_globals, refusal
from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import MisconfigurationError

_REPR_LIMIT = 300


def is_picklable(obj: object) -> bool:
    """Whether pickle can serialise `obj` (Lightning's test). A weights-only checkpoint holds less than that: what it
    holds is decided by `stored_form`."""
    try:
        pickle.dumps(obj)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def import_path(obj: Any) -> str | None:
    """`module.qualname` when that name leads back to `obj` in an already imported module (nothing is imported)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}.{qualname}" if found is obj else None


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user's __repr__ may raise anything
        text = f"<{type(value).__qualname__} object>"
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + "..."


def stored_form(value: Any, allowed: dict[int, Any] | None = None) -> tuple[Any, str | None]:
    """(what a checkpoint records for `value`, None when that is the value itself or else what it was)."""
    allowed = allowed_globals() if allowed is None else allowed
    if refusal(value, "value", allowed) is None:
        return value, None
    if _is_numpy_scalar(value):  # np.float64(0.1) from a sweep: the same number as a Python scalar
        return value.item(), None
    if isinstance(value, type) and issubclass(value, StandIn):  # a class or function named in a foreign file
        return value.global_name, f"{value.global_name}, a class or function (refused by the safe loader)"
    if isinstance(value, StandIn):
        return _short_repr(value), f"a {value.global_name} (refused by the safe loader)"
    if isinstance(value, functools.partial):
        return _partial_form(value, allowed), "a functools.partial"
    if inspect.isclass(value) or callable(value) and hasattr(value, "__qualname__"):
        what = "a class" if inspect.isclass(value) else "a function"
        path = import_path(value)
        return (path, f"{what}, stored as its import path") if path else (_short_repr(value), f"{what}, stored "
                                                                           "as its repr (it has no import path)")
    container = _container_form(value, allowed)
    if container is not None:
        return container
    return _short_repr(value), f"a {type(value).__module__}.{type(value).__qualname__} instance, stored as its repr"


def _container_form(value: Any, allowed: dict[int, Any]) -> tuple[Any, str | None] | None:
    """A mapping, Namespace, list or tuple with its items in their stored form; None for anything else."""
    if isinstance(value, (Mapping, Namespace)):
        items = vars(value) if isinstance(value, Namespace) else value
        forms = {k: stored_form(v, allowed) for k, v in items.items()}
        stored = {k: form for k, (form, _) in forms.items()}
        if refusal(stored, "value", allowed) is None:
            if type(value) is dict and all(what is None for _, what in forms.values()):
                return stored, None  # NumPy scalars only: nothing lost
            kind = "a dict holding objects" if type(value) is dict else \
                f"a {type(value).__module__}.{type(value).__qualname__}"
            return stored, f"{kind}, stored as a dict (objects by name or repr)"
    if type(value) in (list, tuple):
        pairs = [stored_form(v, allowed) for v in value]
        lossless = all(what is None for _, what in pairs)
        return type(value)(form for form, _ in pairs), None if lossless else f"a {type(value).__name__} holding objects"
    return None


def _is_numpy_scalar(value: Any) -> bool:
    return type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item")


def _partial_form(value: functools.partial, allowed: dict[int, Any]) -> Any:
    target = import_path(value.func)
    arguments = [*value.args, *value.keywords.values()]
    safe = all(refusal(a, "argument", allowed) is None for a in arguments) and all(
        isinstance(k, str) and not k.startswith("_") for k in value.keywords)
    if target is None or not safe:
        return _short_repr(value)
    form: dict[str, Any] = {"_target_": target, "_partial_": True}
    if value.args:
        form["_args_"] = list(value.args)
    return {**form, **value.keywords}


def stored_forms(hparams: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the hparams as a checkpoint stores them, {key: what it held} for the keys that need passing again)."""
    allowed = allowed_globals()
    stored: dict[str, Any] = {}
    replaced: dict[str, str] = {}
    for key, value in hparams.items():
        stored[key], what = stored_form(value, allowed)
        if what is not None:
            replaced[str(key)] = what
    return stored, replaced


def rebuild_arguments(cls: type, saved: Mapping[str, Any], replaced: Mapping[str, str],
                      overrides: Mapping[str, Any], config_name: str | None = None,
                      ) -> tuple[dict[str, Any], dict[str, str]]:
    """The keyword arguments to rebuild `cls` from saved hparams: a replaced key is left to the caller's
    override, or to `cls`'s default when that default is stored the same way; returns (arguments, still missing).

    `config_name`: the `__init__` argument whose one object (a dict, a Namespace) `save_hyperparameters` recorded
    (Lightning's `hparams_name`): the saved hparams are then passed as that one argument, as a dict.
    """
    if config_name is not None and config_name in _named_parameters(cls):
        if config_name in overrides:
            return dict(overrides), {}
        if replaced:
            held = "; ".join(f"{key!r}: {what}" for key, what in replaced.items())
            return {}, {config_name: f"a config holding values stored by name only ({held})"}
        return {config_name: dict(saved), **overrides}, {}
    accepted = _named_parameters(cls) if not _takes_any_keyword(cls) else None
    # as in Lightning: saved values the class does not take (a base class's argument) are left out
    arguments = {k: v for k, v in saved.items() if k not in replaced and (accepted is None or k in accepted)}
    replaced = {k: what for k, what in replaced.items() if accepted is None or k in accepted}
    defaults = _defaults(cls)
    missing: dict[str, str] = {}
    for key, what in replaced.items():
        if key in overrides:
            continue
        default = defaults.get(key, inspect.Parameter.empty)
        by_name = isinstance(default, functools.partial) or inspect.isclass(default) or inspect.isroutine(default)
        if by_name and stored_form(default)[0] == saved.get(key):
            continue  # the default is what was saved (the same class or function): __init__ uses it
        missing[key] = what
    arguments.update(overrides)
    return arguments, missing


def _named_parameters(cls: type) -> set[str]:
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in parameters if p.kind in kinds}


def _takes_any_keyword(cls: type) -> bool:
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return True  # unknown: pass everything and let the call say what is wrong
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _defaults(cls: type) -> dict[str, Any]:
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def read_hparams_file(path: str | Path) -> dict[str, Any]:
    """Hyperparameters from a `.yaml` (e.g. a logger's `hparams.yaml`) or a `.csv` of `key,value` rows with a
    header, as Lightning's `load_from_checkpoint(hparams_file=...)` reads them (plain values only: YAML's safe
    loader, Python literals in the CSV)."""
    path = Path(path)
    text = path.read_text()
    if path.suffix.lower() == ".csv":
        rows = list(csv.reader(io.StringIO(text)))[1:]
        return {row[0]: _literal(row[1]) for row in rows if len(row) >= 2}
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise MisconfigurationError(f"hparams_file={str(path)!r}: use a .yaml, .yml or .csv file.")
    import yaml  # PyYAML, installed with omegaconf; imported only here

    loaded = yaml.safe_load(text) or {}
    if not isinstance(loaded, dict):
        raise MisconfigurationError(f"hparams_file={str(path)!r} holds a {type(loaded).__name__}, not a mapping.")
    return loaded


def save_hparams_to_yaml(config_yaml: str | Path, hparams: Mapping[str, Any] | Namespace,
                         use_omegaconf: bool = True) -> None:
    """Write `hparams` (a dict, `self.hparams` or a Namespace) as YAML that `read_hparams_file` reads back.

    Mappings inside (OmegaConf's too, whatever `use_omegaconf` says) are written as plain YAML mappings; a value
    YAML's safe dumper cannot write is left out with a warning that names it, as Lightning leaves it out."""
    import yaml  # PyYAML, installed with omegaconf; imported only here

    items = vars(hparams) if isinstance(hparams, Namespace) else dict(hparams)
    kept: dict[str, Any] = {}
    for key, value in items.items():
        plain = _plain(value)
        try:
            yaml.safe_dump(plain)
        except yaml.YAMLError:
            rank_zero_warn(f"save_hparams_to_yaml: {key!r} is left out: YAML cannot hold a {type(value).__name__}.")
            continue
        kept[key] = plain
    Path(config_yaml).write_text(yaml.safe_dump(kept))


def _plain(value: Any) -> Any:
    """Mappings as dicts and sequences as lists, all the way down (YAML's safe dumper takes no subclasses)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
