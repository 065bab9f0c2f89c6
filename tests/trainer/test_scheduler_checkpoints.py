"""torch's own schedulers in checkpoints: the writer accepts exactly what torch's weights-only loader reads.

The writer used to refuse `MultiStepLR` (its milestones are a `collections.Counter`, which torch's safe loader
allows) with a list of types of our own; the rule is now torch's allowlist (strategies/checkpoint_io/weights_only.py).
"""

from __future__ import annotations

import argparse
import collections
import enum
import functools
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as schedulers

from strategies.checkpoint_io.weights_only import refusal
from strategies.exceptions import CheckpointSaveError
from tests.helpers.resume_runs import Net, differences, fit, state_of
from trainer import TrainModule


class _Colour(enum.Enum):
    RED = 1


class _Plain:
    def __init__(self) -> None:
        self.x = 1


VALUES: dict[str, Any] = {
    "Counter": collections.Counter({1: 2}), "OrderedDict": collections.OrderedDict(a=1),
    "defaultdict": collections.defaultdict(int, a=1), "set": {1, 2}, "frozenset": frozenset({1}),
    "complex": 1 + 2j, "bytes": b"ab", "bytearray": bytearray(b"x"), "Namespace": argparse.Namespace(a=1),
    "class": nn.ReLU, "builtin function": torch.tanh, "partial": functools.partial(max, 1),
    "module": nn.Linear(1, 1), "enum": _Colour.RED, "slice": slice(1, 2), "dtype": torch.float16,
    "device": torch.device("cpu"), "Size": torch.Size([2]), "layout": torch.strided, "tuple": (1, "a", None),
    "Parameter": nn.Parameter(torch.ones(1)), "nested Counter": {"a": [1, {"b": collections.Counter()}]},
    "nested Namespace": {"a": [1, {"b": argparse.Namespace()}]}, "plain object": _Plain(),
    "int and tuple keys": {1: 2, (1, 2): 3}, "class in OrderedDict": collections.OrderedDict(a=nn.ReLU),
}


def _torch_reads(value: Any) -> bool:
    buffer = io.BytesIO()
    torch.save({"value": value}, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception:  # noqa: BLE001 - any refusal counts
        return False
    return True


@pytest.mark.parametrize("name", list(VALUES))
def test_the_writer_accepts_exactly_what_the_weights_only_loader_reads(name: str):
    value = VALUES[name]
    assert (refusal({"value": value}) is None) == _torch_reads(value)


def test_a_class_registered_with_add_safe_globals_is_accepted_like_torch_accepts_it():
    with torch.serialization.safe_globals([_Plain, _Colour]):
        assert _torch_reads(_Plain()) and _torch_reads(_Colour.RED)
        assert refusal({"a": _Plain(), "b": _Colour.RED}) is None
    assert refusal({"a": _Plain()}) == f"checkpoint['a'] holds a {__name__}._Plain"


def _build(name: str, opt: torch.optim.Optimizer) -> tuple[Any, str, str | None]:
    """(scheduler, interval, monitor) for each scheduler whose state once broke our writer or may."""
    if name == "MultiStepLR":
        return schedulers.MultiStepLR(opt, milestones=[1, 2], gamma=0.5), "epoch", None
    if name == "OneCycleLR":
        return schedulers.OneCycleLR(opt, max_lr=0.05, total_steps=8), "step", None
    if name == "CyclicLR":
        return schedulers.CyclicLR(opt, 0.001, 0.05, step_size_up=2), "step", None
    if name == "ReduceLROnPlateau":
        return schedulers.ReduceLROnPlateau(opt, mode="max", patience=0, factor=0.5), "epoch", "train_loss_epoch"
    if name == "SequentialLR":
        parts = [schedulers.LinearLR(opt, 0.5, total_iters=1), schedulers.ExponentialLR(opt, 0.5)]
        return schedulers.SequentialLR(opt, parts, milestones=[1]), "epoch", None
    if name == "ChainedScheduler":
        parts = [schedulers.ExponentialLR(opt, 0.9), schedulers.MultiStepLR(opt, [1, 2], 0.5)]
        return schedulers.ChainedScheduler(parts), "epoch", None
    return schedulers.LambdaLR(opt, lambda epoch: 0.8 ** epoch), "epoch", None


SCHEDULERS = ("MultiStepLR", "OneCycleLR", "CyclicLR", "ReduceLROnPlateau", "SequentialLR", "ChainedScheduler",
              "LambdaLR")


def _net_with(name: str) -> type[Net]:
    class Scheduled(Net):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)
            scheduler, interval, monitor = _build(name, opt)
            config: dict[str, Any] = {"scheduler": scheduler, "interval": interval}
            if monitor:
                config["monitor"] = monitor
            return {"optimizer": opt, "lr_scheduler": config}

    return Scheduled


FLAGS = {"accumulate_grad_batches": 1, "val_check_interval": 1.0, "max_epochs": 2}  # 8 optimizer steps in all


@pytest.mark.parametrize("name", SCHEDULERS)
def test_torch_schedulers_save_and_resume_bit_exact(tmp_path: Path, name: str):
    model_cls = _net_with(name)
    saves = {k: tmp_path / f"batch_{k}.ckpt" for k in (3, 4, 6)}  # 4 batches per epoch: 4 is an epoch's last
    model, trainer = fit("global_shuffle", tmp_path / "ref", save_in_step=saves, model_cls=model_cls,
                         n_train=16, **FLAGS)
    reference = state_of(model, trainer)
    assert reference["lrs"] != [0.02], "the scheduler never changed the learning rate: the test would prove nothing"
    for ckpt in saves.values():
        progress = torch.load(ckpt, weights_only=True)["progress"]
        resumed_model, resumed = fit("global_shuffle", tmp_path / ckpt.stem, seed=1234, ckpt=ckpt,
                                     model_cls=model_cls, n_train=16, **FLAGS)
        assert differences(reference, state_of(resumed_model, resumed), progress) == [], ckpt.name


@pytest.mark.parametrize("name", SCHEDULERS)
def test_torch_schedulers_in_a_weights_only_save(tmp_path: Path, name: str):
    model, trainer = fit("global_shuffle", tmp_path, model_cls=_net_with(name), n_train=16, **FLAGS)
    trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    trainer.save_checkpoint(tmp_path / "full.ckpt")
    assert "lr_schedulers" not in torch.load(tmp_path / "weights.ckpt", weights_only=True)
    saved = torch.load(tmp_path / "full.ckpt", weights_only=True)["lr_schedulers"]
    assert saved == [trainer.lr_scheduler_configs[0].scheduler.state_dict()]


class _SavesAnObject(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["extra"] = {"config": collections.defaultdict(int, lr=1)}


def test_what_the_loader_would_refuse_is_still_refused_at_save_time_naming_the_key(tmp_path: Path):
    from trainer.checkpoint.schema import check_weights_only_safe

    checkpoint: dict[str, Any] = {"state_dict": {}}
    _SavesAnObject().on_save_checkpoint(checkpoint)
    with pytest.raises(CheckpointSaveError, match=r"checkpoint\['extra'\]\['config'\] holds a collections.defaultdict"
                                                  r".*add_safe_globals"):
        check_weights_only_safe(checkpoint)
