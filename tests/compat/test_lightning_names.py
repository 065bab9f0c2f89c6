"""trainer/setup/lightning_names.py lists every public name of Lightning's LightningModule, LightningDataModule and
Callback; checked against an installed Lightning 2.x (our compatibility oracle), skipped without it."""

from __future__ import annotations

import pytest
from torch import nn

from trainer.setup.lightning_names import (
    CALLBACK_NAMES,
    DATAMODULE_NAMES,
    HOOK,
    METHOD,
    MODULE_NAMES,
    REMOVED_CALLBACK_NAMES,
    REMOVED_MODULE_NAMES,
    SUPPORTED,
)


def _public(cls: type, minus: type | None = None) -> set[str]:
    skip = set(dir(minus)) if minus is not None else set()
    return {n for n in dir(cls) if not n.startswith("_") and n not in skip}


def test_module_names_are_lightnings():
    pl = pytest.importorskip("lightning.pytorch")
    assert set(MODULE_NAMES) == _public(pl.LightningModule, nn.Module)


def test_datamodule_names_are_lightnings():
    pl = pytest.importorskip("lightning.pytorch")
    assert set(DATAMODULE_NAMES) == _public(pl.LightningDataModule)


def test_callback_names_are_lightnings():
    pl = pytest.importorskip("lightning.pytorch")
    assert set(CALLBACK_NAMES) == _public(pl.Callback)


def test_removed_names_are_not_in_lightning_2():
    pl = pytest.importorskip("lightning.pytorch")
    assert not set(REMOVED_MODULE_NAMES) & set(dir(pl.LightningModule))
    assert not set(REMOVED_CALLBACK_NAMES) & set(dir(pl.Callback))


def test_every_entry_has_a_kind_and_refusals_say_what_to_do():
    entries = [*MODULE_NAMES.values(), *REMOVED_MODULE_NAMES.values(), *DATAMODULE_NAMES.values(),
               *CALLBACK_NAMES.values(), *REMOVED_CALLBACK_NAMES.values()]
    assert {e.kind for e in entries} <= {HOOK, METHOD}
    assert all(e.note for e in entries if e.status == "refused")
    assert all(e.status in (SUPPORTED, "refused") for e in entries)


def test_supported_names_exist_on_our_classes():
    from callbacks import Callback
    from trainer import DataModule, TrainModule

    missing = [f"TrainModule.{n}" for n, e in MODULE_NAMES.items()
               if e.status == SUPPORTED and n != "automatic_optimization" and not hasattr(TrainModule, n)]
    missing += [f"DataModule.{n}" for n, e in DATAMODULE_NAMES.items()
                if e.status == SUPPORTED and n != "hparams" and not hasattr(DataModule, n)]
    missing += [f"Callback.{n}" for n, e in CALLBACK_NAMES.items()
                if e.status == SUPPORTED and not hasattr(Callback, n)]
    assert missing == []
