"""`save_hyperparameters`, `hparams` and `hparams_initial`, shared by TrainModule and DataModule.

Why here and not at the first checkpoint: a value a weights-only load cannot hold (a module, a class, a function,
a partial, any other object) used to be refused when the first checkpoint was written, after an epoch of
training. It is now seen when `save_hyperparameters()` is called: `self.hparams` keeps the live objects (as in
Lightning), while checkpoints record them in a safe form (trainer/core/hparams_storage.py) with one warning per call,
and `load_from_checkpoint` asks for them again as keyword arguments instead of guessing.
"""

from __future__ import annotations

import copy
import inspect
import types
from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import MisconfigurationError
from trainer.core.data_hooks import AttributeDict
from trainer.core.hparams_storage import rebuild_arguments, stored_forms


class HyperparametersMixin:
    """Records `__init__` arguments for checkpoints and loggers (Lightning's `save_hyperparameters`).

    The `CHECKPOINT_HYPER_PARAMS_*` constants are the checkpoint keys the hyperparameters are saved under, so an
    `on_load_checkpoint` can read `checkpoint[self.CHECKPOINT_HYPER_PARAMS_KEY]` as under Lightning. Lightning's
    `*_TYPE` key (the pickled class of a non-dict `hparams`) is never written here: hyperparameters are saved as a
    plain dict, and a Lightning checkpoint's type entry is not unpickled.
    """

    CHECKPOINT_HYPER_PARAMS_KEY = "hparams"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"

    @property
    def hparams(self) -> AttributeDict:
        """What `save_hyperparameters` recorded, readable as attributes (`self.hparams.lr`); the live objects."""
        if "_hparams" not in self.__dict__:
            self.__dict__["_hparams"] = AttributeDict()
        return self.__dict__["_hparams"]

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyperparameters as `save_hyperparameters` recorded them; later changes to `hparams`
        are not in it (Lightning's read-only view)."""
        return copy.deepcopy(self.__dict__.get("_hparams_initial", AttributeDict()))

    def save_hyperparameters(self, *args: Any, ignore: Sequence[str] | str | None = None,
                             frame: types.FrameType | None = None, logger: bool = True) -> None:
        """Record `__init__` arguments into `self.hparams`, for checkpoints and the loggers.

        Values a weights-only load cannot hold (modules, classes, functions, partials, other objects) stay live
        in `self.hparams`, but checkpoints record them as their import path or repr (never pickled), with one
        warning naming them: `load_from_checkpoint` then needs them passed again as keyword arguments.

        Args:
            *args: nothing (all `__init__` arguments), argument names, or one dict / `argparse.Namespace` /
                mapping to record instead.
            ignore: argument name(s) to leave out, also removing them if a base class recorded them.
            frame: read the arguments of this frame's function instead of this object's `__init__` frames.
            logger: False keeps these hyperparameters from the loggers (they are still checkpointed).

        Example::

            def __init__(self, backbone: nn.Module, lr: float = 1e-3):
                super().__init__()
                self.save_hyperparameters(ignore=["backbone"])  # its weights are in the state_dict anyway
                self.backbone = backbone
        """
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        values, config_name = self._chosen_hyperparameters(args, frame)
        hparams = self.hparams
        hparams.update({k: v for k, v in values.items() if k not in ignored})
        for key in ignored:
            hparams.pop(key, None)
        self.__dict__["_hparams_initial"] = _frozen_copy(hparams)
        self.__dict__["_hparams_to_log"] = logger
        self.__dict__["_hparams_name"] = config_name
        stored, replaced = stored_forms(hparams)
        # what load_from_checkpoint would ask for (a default class or function is found again by name)
        _, needed = rebuild_arguments(type(self), stored, replaced, {}, config_name)
        if needed:
            modules = [key for key in needed if isinstance(hparams.get(key), nn.Module)]
            _warn_replaced(type(self).__name__, needed, modules)

    def remove_ignored_hparams(self, ignore_list: list[str]) -> None:
        """Drop recorded hyperparameters by name: a subclass leaving out what a base class's
        `save_hyperparameters()` recorded (`hparams_initial` keeps them, as in Lightning)."""
        for key in ignore_list:
            self.hparams.pop(key, None)

    def _chosen_hyperparameters(self, args: tuple[Any, ...], frame: types.FrameType | None,
                                ) -> tuple[dict[str, Any], str | None]:
        """(the values to record, the __init__ argument they all came from as one object, if any)."""
        names = [a for a in args if isinstance(a, str)]
        given = [a for a in args if not isinstance(a, str)]
        values = _arguments_of(frame) if frame is not None else self._init_arguments()
        if len(given) == 1 and not names and isinstance(given[0], (Namespace, Mapping)):
            single = given[0]
            # Lightning's hparams_name: load_from_checkpoint passes the saved dict back as this one argument
            config_name = next((name for name, value in values.items() if value is single), None)
            return dict(vars(single) if isinstance(single, Namespace) else single), config_name
        if given:
            raise MisconfigurationError(
                f"save_hyperparameters{args!r}: pass argument names (str), or one dict / argparse.Namespace."
            )
        missing = [a for a in names if a not in values]
        if missing:
            raise MisconfigurationError(f"save_hyperparameters{args}: {missing} are not __init__ arguments.")
        return ({k: values[k] for k in names} if names else values), None

    def _init_arguments(self) -> dict[str, Any]:
        """The arguments of this object's __init__ frames, the outermost (the subclass the user built) winning,
        as in Lightning: those are the arguments load_from_checkpoint passes back to that class."""
        frame = inspect.currentframe()
        values: dict[str, Any] = {}
        while frame is not None:  # from the innermost __init__ (a base class) out to the subclass's
            if frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is self:
                values.update(_arguments_of(frame))
            frame = frame.f_back
        return values


def hparams_entries(owner: Any) -> dict[str, Any]:
    """A module's checkpoint entries for its hyperparameters: `hparams` in their stored form, `hparams_replaced`
    (the keys stored by name or repr) and Lightning's `hparams_name` (the one config argument) when they apply."""
    stored, replaced = stored_forms(getattr(owner, "hparams", {}))
    entries: dict[str, Any] = {"hparams": stored}
    if replaced:
        entries["hparams_replaced"] = replaced  # load_from_checkpoint asks for these
    config_name = getattr(owner, "__dict__", {}).get("_hparams_name")
    if isinstance(config_name, str):
        entries["hparams_name"] = config_name
    return entries


def logs_hparams(module: Any, datamodule: Any) -> bool:
    """Whether the loggers get `log_hyperparams` at fit start: unless both the module and the datamodule called
    `save_hyperparameters(logger=False)` (Lightning sends the possibly empty `hparams_initial` otherwise)."""
    return any(isinstance(owner, HyperparametersMixin) and owner.__dict__.get("_hparams_to_log", True)
               for owner in (module, datamodule))


def hparams_for_loggers(module: Any, datamodule: Any) -> dict[str, Any]:
    """What the loggers receive at fit start, as in Lightning: the `hparams_initial` of the module and the
    datamodule (each unless it called `save_hyperparameters(logger=False)`), merged.

    Raises:
        MisconfigurationError: a key both record holds different values (which one would the logger show?).
    """
    parts = [owner.hparams_initial for owner in (module, datamodule)
             if isinstance(owner, HyperparametersMixin) and owner.__dict__.get("_hparams_to_log", True)]
    if len(parts) == 2:
        clashing = sorted(key for key in parts[0].keys() & parts[1].keys() if _differ(parts[0][key], parts[1][key]))
        if clashing:
            raise MisconfigurationError(
                f"the hyperparameters {clashing} are in both the module's and the DataModule's hparams with "
                "different values; rename one, or call save_hyperparameters(logger=False) on one of them."
            )
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return merged


def _differ(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b))
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - an object whose comparison raises: compare identity
        return a is not b


def _arguments_of(frame: types.FrameType) -> dict[str, Any]:
    """The named arguments (and **kwargs entries) of the function running in `frame`, `self`/`cls` left out."""
    info = inspect.getargvalues(frame)
    values = {arg: info.locals[arg] for arg in info.args if arg not in ("self", "cls") and arg in info.locals}
    if info.keywords and isinstance(info.locals.get(info.keywords), dict):
        for key, value in info.locals[info.keywords].items():
            values.setdefault(key, value)
    return values


def _warn_replaced(owner: str, replaced: dict[str, str], modules: list[str]) -> None:
    listed = "; ".join(f"{key!r}: {what}" for key, what in replaced.items())
    keys = ", ".join(f"{key}=..." for key in replaced)
    advice = (f" An nn.Module argument's weights are in the state_dict anyway: leave it out with "
              f"save_hyperparameters(ignore={modules!r}).") if modules else ""
    rank_zero_warn(
        f"{owner}.save_hyperparameters(): {len(replaced)} value(s) cannot be stored in a weights-only checkpoint "
        f"({listed}). self.hparams keeps them; checkpoints record their import path or repr and never pickle "
        f"them, so {owner}.load_from_checkpoint(path, {keys}) needs them passed again.{advice}",
        stacklevel=5,  # the user's __init__ (rank_zero_warn is wrapped by rank_zero_only)
    )


def _frozen_copy(hparams: AttributeDict) -> AttributeDict:
    """A deep copy, as Lightning takes; a value that cannot be deep-copied (a lock, a generator) is kept as is."""
    frozen = AttributeDict()
    for key, value in hparams.items():
        try:
            frozen[key] = copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - any object's __deepcopy__ may raise anything
            frozen[key] = value
    return frozen
