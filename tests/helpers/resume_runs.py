"""Runs for the resume matrix (tests/trainer/test_resume_matrix.py).

One configuration trains 3 epochs of 8 batches with accumulate_grad_batches=3 and a validation
every 4 batches, and fixes four stop points (1-based batch numbers): 11 closes an accumulation window
in mid-epoch, 12 is followed by a mid-epoch validation, 13 is inside a window, 16 ends an epoch.
Per configuration there is one uninterrupted reference; one recording run saves a checkpoint from
every in-fit source (ModelCheckpoint cadences, save_checkpoint from hooks and training_step); short
runs end fit() in every way (max_steps, max_epochs, max_time, EarlyStopping, should_stop, an
exception, SIGTERM) and save after it. Each checkpoint is then resumed to the end and compared with
the reference: weights, optimizer state, scheduler state and the per-batch loss series, torch.equal.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback, EarlyStopping, ModelCheckpoint
from tests.helpers.boring import QUIET, regression_data
from trainer import Trainer, TrainModule, seed_everything

MID, AFTER_VAL, WINDOW, EPOCH_END = 11, 12, 13, 16
BATCHES_PER_EPOCH, EPOCHS = 8, 3
TOTAL = BATCHES_PER_EPOCH * EPOCHS
FLAGS = {**QUIET, "max_epochs": EPOCHS, "accumulate_grad_batches": 3, "val_check_interval": 0.5,
         "num_sanity_val_steps": 1}
DATA = ("global_shuffle", "generator_shuffle", "dropout")


class Net(TrainModule):
    """Records every training loss; saves from training_step while a chosen batch is in flight."""

    def __init__(self, dropout: float = 0.0, save_in_step: dict[int, Path] | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))
        self.losses: list[torch.Tensor] = []
        self.epoch_losses: list[tuple[int, torch.Tensor]] = []  # (epoch, train_loss_epoch)
        self.val_losses: list[tuple[int, torch.Tensor]] = []  # (batches done, val_loss) per validation
        self.save_in_step = save_in_step or {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.losses.append(loss.detach().clone())
        path = self.save_in_step.get(self.trainer.total_batches + 1)
        if path is not None:
            self.trainer.save_checkpoint(path)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_losses.append((self.trainer.total_batches, self.trainer.callback_metrics["val_loss"]))

    def on_train_epoch_end(self) -> None:
        self.epoch_losses.append((self.current_epoch, self.trainer.callback_metrics["train_loss_epoch"]))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=0.02)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


class AtBatch(Callback):
    """Calls `action(trainer, hook)` in every hook; `self.batch` is the batch in flight or last finished."""

    def __init__(self, action: Callable[[Trainer, str, int], None]) -> None:
        self.action, self.batch = action, 0

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self.batch = trainer.total_batches + 1
        self.action(trainer, "on_train_batch_start", self.batch)


def _forward(name: str) -> Callable[..., None]:
    def hook(self: AtBatch, trainer: Trainer, *args: Any) -> None:
        sanity = trainer.sanity_checking and name.startswith("on_validation")
        self.action(trainer, "sanity" if sanity else name, self.batch)

    return hook


for _name in ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_before_backward", "on_after_backward",
              "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end", "on_validation_start",
              "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_train_epoch_end",
              "on_sanity_check_end"):
    setattr(AtBatch, _name, _forward(_name))

# save_checkpoint from a hook (or training_step) while batch k is in flight or just done: (hook, k)
HOOK_SAVES = [
    ("on_fit_start", 0), ("on_sanity_check_end", 0), ("on_train_start", 0), ("on_train_epoch_start", 0),
    *((hook, MID) for hook in ("on_train_batch_start", "training_step", "on_before_backward", "on_after_backward",
                               "on_before_optimizer_step", "on_train_batch_end")),
    ("on_before_zero_grad", AFTER_VAL),  # runs on the first batch of a window (12), after its training_step
    *((hook, WINDOW) for hook in ("on_train_batch_start", "training_step", "on_before_backward",
                                  "on_after_backward", "on_train_batch_end")),
    *((hook, AFTER_VAL) for hook in ("on_train_batch_end", "on_validation_start", "on_validation_batch_end",
                                     "on_validation_epoch_end", "on_validation_end")),
    *((hook, EPOCH_END) for hook in ("on_train_batch_end", "on_validation_end", "on_train_epoch_end",
                                     "on_train_epoch_start")),
]
# ModelCheckpoint folder -> the files resumed (named "{epoch}-{step}"; the batch each is taken at in brackets)
MODEL_CHECKPOINTS = {
    "every_n_train_steps": ["epoch=1-step=4"],  # [11]
    "on_validation": ["epoch=1-step=4", "epoch=1-step=6"],  # [12, after its validation], [16, idem]
    "every_n_epochs": ["epoch=1-step=6"],  # [16, on_train_epoch_end]
    "train_time_interval": ["epoch=0-step=1"],  # [3, the first optimizer step: none is saved at step 0, as Lightning]
    "save_last": ["last"],  # [22]
}
AFTER_FIT = ("max_steps", "max_epochs", "max_time", "early_stopping", "should_stop", "exception", "sigterm")


def _loaders(data: str, n_train: int) -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(1) if data == "generator_shuffle" else None
    train = DataLoader(regression_data(n=n_train, features=8), batch_size=4, shuffle=True, generator=generator)
    return train, DataLoader(regression_data(n=8, features=8, seed=1), batch_size=4)


def build(data: str, root: Path, seed: int = 0, callbacks: list[Callback] | None = None,
          save_in_step: dict[int, Path] | None = None, n_train: int = 32, model_cls: type[Net] = Net,
          **flags: Any) -> tuple[Net, Trainer, tuple[DataLoader, DataLoader]]:
    """A seeded model, its Trainer (FLAGS overridden by `flags`) and the loaders of configuration `data`."""
    seed_everything(seed)
    model = model_cls(0.3 if data == "dropout" else 0.0, save_in_step)
    options = {**FLAGS, "default_root_dir": str(root), **flags}
    if any(isinstance(cb, ModelCheckpoint) for cb in callbacks or []):
        options["enable_checkpointing"] = True
    return model, Trainer(callbacks=callbacks or [], **options), _loaders(data, n_train)


def fit(data: str, root: Path, seed: int = 0, ckpt: Path | None = None, callbacks: list[Callback] | None = None,
        save_in_step: dict[int, Path] | None = None, n_train: int = 32, **flags: Any) -> tuple[Net, Trainer]:
    """One fit in this process (a rank under run_distributed); returns the model and trainer.

    `flags` are Trainer flags, and `model_cls` (a Net subclass) for another module."""
    model, trainer, loaders = build(data, root, seed, callbacks, save_in_step, n_train, **flags)
    trainer.fit(model, *loaders, ckpt_path=ckpt)
    return model, trainer


def record(data: str, root: Path, n_train: int = 32, hook_saves: list[tuple[str, int]] = HOOK_SAVES,
           model_checkpoints: tuple[str, ...] = tuple(MODEL_CHECKPOINTS), **flags: Any,
           ) -> tuple[Net, Trainer, dict[str, Path]]:
    """The recording run: uninterrupted, saving from every in-fit source. Returns {source: path}."""
    paths = {f"{hook}@{k}": root / "hooks" / f"{hook}-{k}.ckpt" for hook, k in hook_saves}
    plan = {(hook, k): path for (hook, k), path in zip(hook_saves, paths.values(), strict=True)}

    def save(trainer: Trainer, hook: str, k: int) -> None:
        if (hook, k) in plan:
            trainer.save_checkpoint(plan[hook, k])

    d = root / "mc"
    options = {
        "every_n_train_steps": {"every_n_train_steps": 4},
        "on_validation": {"monitor": "val_loss"},
        "every_n_epochs": {"every_n_epochs": 1, "save_on_train_epoch_end": True},
        "train_time_interval": {"train_time_interval": timedelta(0)},
        "save_last": {"every_n_train_steps": 8, "save_top_k": 0, "save_last": True},
    }
    callbacks: list[Callback] = [AtBatch(save)] + [
        ModelCheckpoint(d / folder, **{"save_top_k": -1, **options[folder]}) for folder in model_checkpoints]
    paths.update({f"{folder}/{name}": d / folder / f"{name}.ckpt"
                  for folder in model_checkpoints for name in MODEL_CHECKPOINTS[folder]})
    step_saves = {k: path for (hook, k), path in plan.items() if hook == "training_step"}
    model, trainer = fit(data, root, callbacks=callbacks, save_in_step=step_saves, n_train=n_train, **flags)
    return model, trainer, paths


class _Stopper(Callback):
    def __init__(self, how: str) -> None:
        self.how = how

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.total_batches != WINDOW:
            return
        if self.how == "should_stop":
            trainer.should_stop = True
        elif self.how == "max_time":
            time.sleep(1.2)  # past max_time: the loop stops after this batch (or earlier on a slow machine)
        elif self.how == "sigterm" and trainer.is_global_zero:
            os.kill(os.getpid(), signal.SIGTERM)  # recorded; every rank stops after the next batch

    def on_before_backward(self, trainer: Trainer, *args: Any) -> None:
        if self.how == "exception" and trainer.total_batches + 1 == WINDOW + 1:
            raise RuntimeError("injected failure")


def end_fit(how: str, data: str, root: Path, n_train: int = 32, **extra: Any) -> Path:
    """Run a fit that ends by `how`, then save after it (or take the SIGTERM checkpoint); returns the file."""
    flags: dict[str, Any] = {"max_steps": 4} if how == "max_steps" else {"max_epochs": 2} if how == "max_epochs" else {}
    if how == "max_time":
        flags["max_time"] = timedelta(seconds=1)
    callbacks: list[Callback] = [_Stopper(how)]
    if how == "early_stopping":
        callbacks.append(EarlyStopping("val_loss", stopping_threshold=1e9))  # stops at the first validation
    model, trainer, loaders = build(data, root, callbacks=callbacks, n_train=n_train, **flags, **extra)
    try:
        trainer.fit(model, *loaders)
    except SystemExit as err:
        assert err.code == 128 + signal.SIGTERM
        return root / "checkpoints" / "last.ckpt"
    except RuntimeError as err:
        if "injected failure" not in str(err):
            raise
    path = root / f"after_{how}.ckpt"
    trainer.save_checkpoint(path)
    return path


def batches_done(ckpt: Path) -> int:
    """The training batches a checkpoint counts as done: a resume from it trains the ones after them."""
    return int(torch.load(ckpt, weights_only=True)["progress"]["total_batches"])


def _expected_logs(reference: dict[str, Any], progress: dict[str, Any]) -> dict[str, list[tuple[int, Any]]]:
    """The epoch and validation values a run resumed at `progress` logs: those of the reference from there on."""
    done, first_epoch = progress["total_batches"], progress["current_epoch"] + progress["epoch_finished"]
    return {
        "epoch_losses": [e for e in reference["epoch_losses"] if e[0] >= first_epoch],
        "val_losses": [v for v in reference["val_losses"] if v[0] > done or (v[0] == done and not
                                                                               progress["val_started"])],
    }


def state_of(model: Net, trainer: Trainer) -> dict[str, Any]:
    """What a resume must reproduce, detached from the run."""
    opt = trainer.optimizers[0].state_dict()
    return {
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": {(pid, name): t.clone() for pid, s in opt["state"].items() for name, t in s.items()
                      if isinstance(t, torch.Tensor)},
        "lrs": [group["lr"] for group in opt["param_groups"]],
        "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
        "losses": list(model.losses),
        "epoch_losses": list(model.epoch_losses),
        "val_losses": list(model.val_losses),
        "position": (trainer.global_step, trainer.current_epoch),
    }


def differences(reference: dict[str, Any], resumed: dict[str, Any], progress: dict[str, Any] | None = None,
                ) -> list[str]:
    """Why `resumed` (continuing from the saved `progress`; None: from the start) is not the reference run;
    [] when torch.equal everywhere."""
    progress = progress or {"total_batches": 0, "current_epoch": 0, "epoch_finished": False, "val_started": False}
    done, out = progress["total_batches"], []
    for part, expected_logs in _expected_logs(reference, progress).items():
        got = resumed[part]
        if [k for k, _ in got] != [k for k, _ in expected_logs] or not all(
                torch.equal(a, b) for (_, a), (_, b) in zip(got, expected_logs, strict=True)):
            out.append(f"{part} differ")
    expected = reference["losses"][done:]
    if len(resumed["losses"]) != len(expected):
        out.append(f"{len(resumed['losses'])} batches trained after the resume, expected {len(expected)}")
    elif not all(torch.equal(a, b) for a, b in zip(resumed["losses"], expected, strict=True)):
        first = next(i for i, (a, b) in enumerate(zip(resumed["losses"], expected, strict=True))
                     if not torch.equal(a, b))
        out.append(f"loss of batch {done + first + 1} differs")
    for part in ("weights", "optimizer"):
        bad = [k for k, v in reference[part].items() if not torch.equal(v, resumed[part][k])]
        if bad:
            out.append(f"{part} differ: {bad[:3]}")
    for part in ("lrs", "scheduler", "position"):
        if reference[part] != resumed[part]:
            out.append(f"{part}: {resumed[part]} != {reference[part]}")
    return out


def resume_and_compare(data: str, root: Path, ckpt: Path, reference: dict[str, Any], n_train: int = 32,
                       **flags: Any) -> list[str]:
    """Resume `ckpt` to the end (seeded differently on purpose) and list how it differs from the reference."""
    progress = torch.load(ckpt, weights_only=True)["progress"]
    model, trainer = fit(data, root / "resumed", seed=1234, ckpt=ckpt, n_train=n_train, **flags)
    return differences(reference, state_of(model, trainer), progress)
