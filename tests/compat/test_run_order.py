"""The order in which a run calls the module's hooks, a callback's hooks and the loader hooks, compared with
Lightning 2.x (skipped without it): the same recording module and callback run under both frameworks in a few
configurations, and the two call sequences must be equal. It covers where each loader is requested (and requested
again), `setup`/`teardown` getting `stage=` by keyword, `zero_grad` before every stage, when schedulers step, a
stage whose limit is 0 or whose step is switched off with `= None`, and a second `fit` on a finished Trainer."""

from __future__ import annotations

import warnings
from functools import partial, update_wrapper
from typing import Any

import pytest
import torch

from tests.helpers.boring import every_stage_module

_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
          "enable_model_summary": False, "accelerator": "cpu", "devices": 1}
# module methods that are not hooks, or are called so often that they would only add noise
_NOT_RECORDED = {"log", "log_dict", "optimizers", "lr_schedulers", "forward", "print", "all_gather", "manual_backward",
                 "clip_gradients", "toggle_optimizer", "untoggle_optimizer", "save_hyperparameters", "freeze",
                 "unfreeze", "to_onnx", "to_torchscript", "load_from_checkpoint"}


def _frameworks() -> dict[str, tuple[type, type, type]]:
    pl = pytest.importorskip("lightning.pytorch")
    import callbacks
    import trainer

    return {"lightning": (pl.LightningModule, pl.Trainer, pl.Callback),
            "ours": (trainer.TrainModule, trainer.Trainer, callbacks.Callback)}


def _own_hooks(cls: type) -> set[str]:
    """The public functions `cls` adds to nn.Module: its hooks and methods."""
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name, None))
            and not hasattr(torch.nn.Module, name)} - _NOT_RECORDED


def _wrapped(calls: list[str], name: str, fn: Any) -> Any:
    """`fn` recording its calls; a wrapper of a hook counts as the hook it wraps (`__wrapped__`) in both frameworks."""
    return update_wrapper(partial(_record, calls, name, fn), fn)


def _record(calls: list[str], name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    out = fn(*args, **kwargs)
    calls.append(name + (f" {sorted(kwargs)}" if kwargs else "") + (f"({args[0]})" if name == "train" else ""))
    return out


def _module_class(module_base: type, calls: list[str], switched_off: tuple[str, ...]) -> type:
    class Module(every_stage_module(module_base)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            for name in _own_hooks(module_base) | {"train", "zero_grad"}:
                wrapped = None if name in switched_off else _wrapped(calls, name, getattr(self, name))
                setattr(self, name, wrapped)

    return Module


def _callback(callback_base: type, calls: list[str]) -> Any:
    class Recorder(callback_base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            for name in _own_hooks(callback_base) - {"state_dict", "load_state_dict"}:
                setattr(self, name, _wrapped(calls, f"Callback.{name}", getattr(self, name)))

    return Recorder()


def _run(framework: str, runs: list[str], switched_off: tuple[str, ...], **flags: Any) -> list[str]:
    """Every call of a recorded hook, in order, over the entry points `runs` of one Trainer."""
    module_base, trainer_cls, callback_base = _frameworks()[framework]
    calls: list[str] = []
    model = _module_class(module_base, calls, switched_off)()
    runner = trainer_cls(callbacks=[_callback(callback_base, calls)], **{**_QUIET, **flags})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for entry in runs:
            calls.append(f"--- {entry}")
            getattr(runner, entry)(model, **({"verbose": False} if entry in ("validate", "test") else {}))
    return calls


_CASES = {
    "sanity check, validation every epoch": ({"max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 2},
                                             ["fit"], ()),
    "no sanity check": ({"max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 1, "num_sanity_val_steps": 0},
                        ["fit"], ()),
    "reloads, validation every 2nd epoch": ({"max_epochs": 3, "limit_train_batches": 1, "limit_val_batches": 1,
                                             "check_val_every_n_epoch": 2, "reload_dataloaders_every_n_epochs": 1},
                                            ["fit"], ()),
    "mid-epoch validation, accumulation": ({"max_epochs": 1, "limit_train_batches": 4, "limit_val_batches": 1,
                                            "val_check_interval": 2, "accumulate_grad_batches": 2}, ["fit"], ()),
    "a finished Trainer, then every evaluation": ({"max_epochs": 1, "limit_train_batches": 1, "limit_val_batches": 1},
                                                  ["fit", "fit", "validate", "test", "predict"], ()),
    "limit_val_batches=0": ({"max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 0},
                            ["fit", "validate"], ()),
    "validation_step = None": ({"max_epochs": 1, "limit_train_batches": 2}, ["fit"], ("validation_step",)),
    "a hook set to None": ({"max_epochs": 1, "limit_train_batches": 1, "limit_val_batches": 1},
                           ["fit", "test"], ("on_validation_model_eval", "on_train_epoch_start", "on_test_start")),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_hooks_and_loader_requests_come_in_lightnings_order(case: str):
    flags, runs, switched_off = _CASES[case]
    theirs = _run("lightning", runs, switched_off, **flags)
    ours = _run("ours", runs, switched_off, **flags)
    assert ours == theirs
