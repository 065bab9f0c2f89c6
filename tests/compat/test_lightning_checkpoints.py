"""Checkpoints written by Lightning 2.x: `load_from_checkpoint` and `fit(ckpt_path=...)` take the weights, the
optimizer and scheduler states and the loop position, read weights-only, and name what they could not take.

The main path runs on the checked-in file (tests/compat/fixtures/, written by tests/compat/lightning_fixture.py);
where Lightning 2.6.6 is installed, more files are made by running it, and its own resume is the oracle.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from strategies.exceptions import CheckpointLoadError
from tests.compat.lightning_fixture import BATCHES_PER_EPOCH, FIXTURE, build_net, loader, loss_of, optimizers_of
from tests.helpers.boring import QUIET
from trainer import Trainer, TrainModule


class Regressor(TrainModule):
    """The TrainModule twin of the fixture's LightningModule (same __init__, same parameter names)."""

    def __init__(self, hidden: int = 8, lr: float = 0.05, options: Any = None, activation: Any = nn.Tanh) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = build_net(hidden)
        self.seen: list[tuple[int, int, int, float]] = []  # (epoch, batch_idx, global_step, lr) per training batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        self.seen.append((self.current_epoch, batch_idx, self.global_step, lr))
        return loss_of(self.net, batch)

    def configure_optimizers(self) -> Any:
        return optimizers_of(self, self.hparams.lr)


def _saved(path: Path) -> dict[str, Any]:
    """The file as torch reads it when the two classes its hyperparameters name are trusted (test-only)."""
    with torch.serialization.safe_globals([argparse.Namespace, nn.Tanh]):
        return torch.load(path, weights_only=True)


def _quietly(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _resume(ckpt: Path, max_epochs: int = 3) -> tuple[Regressor, Trainer]:
    model = Regressor()
    trainer = Trainer(max_epochs=max_epochs, **QUIET)
    _quietly(trainer.fit, model, loader(), ckpt_path=ckpt)
    return model, trainer


def test_the_fixture_is_small_and_really_a_lightning_checkpoint():
    assert FIXTURE.stat().st_size < 100_000
    saved = _saved(FIXTURE)
    assert saved["pytorch-lightning_version"].startswith("2.") and "format_version" not in saved


def test_load_from_checkpoint_takes_the_weights_and_the_safe_hyperparameters():
    with pytest.warns(UserWarning, match=r"written by PyTorch Lightning 2\.6\.6.*Not taken: "
                                         r"hyper_parameters\['options'\]: a argparse.Namespace"):
        model = Regressor.load_from_checkpoint(FIXTURE, options={"depth": 2})
    saved = _saved(FIXTURE)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved["state_dict"].items())
    assert (model.hparams.hidden, model.hparams.lr) == (8, 0.05)
    assert model.hparams.activation is nn.Tanh  # the class was saved by name and is the __init__ default


def test_load_from_checkpoint_names_the_hyperparameters_it_could_not_read():
    with pytest.raises(CheckpointLoadError, match=r"'options' \(a argparse.Namespace \(refused by the safe loader\)\)"
                                                  r".*load_from_checkpoint\(path, options=\.\.\.\)") as info:
        _quietly(Regressor.load_from_checkpoint, FIXTURE)
    assert "activation" not in str(info.value)


def test_fit_resumes_at_the_saved_epoch_step_optimizer_and_scheduler_state():
    restored: dict[str, Any] = {}

    class Probe(Regressor):
        def on_fit_start(self) -> None:  # after the restore, before any step
            restored["momentum"] = [s["momentum_buffer"].clone() for s in self.trainer.optimizers[0].state.values()]
            restored["scheduler"] = self.trainer.lr_scheduler_configs[0].scheduler.state_dict()

    model = Probe()
    trainer = Trainer(max_epochs=3, **QUIET)
    _quietly(trainer.fit, model, loader(), ckpt_path=FIXTURE)
    saved = _saved(FIXTURE)
    expected = [s["momentum_buffer"] for s in saved["optimizer_states"][0]["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(restored["momentum"], expected, strict=True))
    assert restored["scheduler"] == saved["lr_schedulers"][0]
    # Lightning saved at the end of epoch 0 (4 steps, its epoch scheduler already stepped to lr 0.025)
    assert model.seen[0] == (1, 0, BATCHES_PER_EPOCH, 0.025)
    assert [s[:3] for s in model.seen] == [(e, b, e * BATCHES_PER_EPOCH + b) for e in (1, 2) for b in range(4)]
    assert (trainer.current_epoch, trainer.global_step) == (3, 3 * BATCHES_PER_EPOCH)


def test_a_file_without_the_loop_position_says_where_it_continues(tmp_path: Path):
    path = tmp_path / "no_loops.ckpt"
    torch.save({k: v for k, v in _saved(FIXTURE).items() if k not in ("loops", "hyper_parameters")}, path)
    model = Regressor()
    with pytest.warns(UserWarning, match=r"the loop position \(no 'loops' entry\): continuing at the start of epoch 0"):
        Trainer(**{**QUIET, "max_epochs": 1}).fit(model, loader(), ckpt_path=path)
    assert model.seen[0][:3] == (0, 0, BATCHES_PER_EPOCH)  # the saved step count goes on


def test_the_grad_scaler_state_of_16_mixed_is_taken(tmp_path: Path):
    path = tmp_path / "amp.ckpt"
    scaler = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
              "_growth_tracker": 7}
    torch.save({**_saved(FIXTURE), "MixedPrecision": scaler, "hyper_parameters": {"hidden": 8}}, path)
    restored: dict[str, Any] = {}

    class Probe(Regressor):
        def on_fit_start(self) -> None:
            restored.update(self.trainer.strategy.precision.state_dict())

    _quietly(Trainer(**{**QUIET, "max_epochs": 2, "precision": "16-mixed"}).fit, Probe(), loader(), ckpt_path=path)
    assert restored["scaler"]["scale"] == 1024.0 and restored["scaler"]["_growth_tracker"] == 7


def test_a_class_the_safe_loader_refuses_in_the_weights_is_an_error_naming_it(tmp_path: Path):
    path = tmp_path / "odd.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "epoch": 0, "global_step": 0,
                "state_dict": {"net.0.weight": argparse.Namespace(data=1)}}, path)
    with pytest.raises(CheckpointLoadError, match=r"its 'state_dict' holds argparse.Namespace, which the safe"):
        Regressor.load_from_checkpoint(path)


def test_a_dictconfig_among_the_hyperparameters_is_named_and_the_rest_is_taken(tmp_path: Path):
    from omegaconf import OmegaConf

    path = tmp_path / "hydra.ckpt"
    saved = _saved(FIXTURE)
    torch.save({**saved, "hyper_parameters": {"hidden": 8, "options": OmegaConf.create({"depth": 2})}}, path)
    taken = r"Not taken: hyper_parameters\['options'\]: a omegaconf.dictconfig.DictConfig"
    with pytest.warns(UserWarning, match=taken):
        model = Regressor.load_from_checkpoint(path, options={"depth": 2})
    assert model.hparams.hidden == 8 and torch.equal(model.net[0].weight, saved["state_dict"]["net.0.weight"])


def test_lightning_attributedict_hyperparameters_are_read_as_a_dict(tmp_path: Path):
    data = pytest.importorskip("lightning.fabric.utilities.data", reason="needs Lightning's AttributeDict class")
    path = tmp_path / "attributedict.ckpt"
    saved = _saved(FIXTURE)
    torch.save({**saved, "hyper_parameters": data.AttributeDict(hidden=8, lr=0.01)}, path)
    model = _quietly(Regressor.load_from_checkpoint, path)
    assert (model.hparams.hidden, model.hparams.lr) == (8, 0.01)


def test_a_file_of_ours_naming_lightning_in_a_value_gets_no_stand_ins(tmp_path: Path):
    path = tmp_path / "ours.ckpt"
    torch.save({"format_version": 1, "state_dict": {}, "hparams": {"note": "pytorch-lightning_version",
                                                                   "ns": argparse.Namespace(a=1)}}, path)
    with pytest.raises(CheckpointLoadError, match=r"refused by the safe \(weights-only\) loader: it references "
                                                  r"argparse.Namespace"):
        Regressor.load_from_checkpoint(path)


@pytest.mark.subprocess
def test_nothing_of_the_file_is_imported_or_run(tmp_path: Path):
    """A Lightning-marked file naming a function with side effects: the stand-in never calls it."""
    path = tmp_path / "evil.ckpt"

    class Evil:
        def __reduce__(self) -> Any:
            return (print, ("the file ran code",))

    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {}, "hyper_parameters": {"x": Evil()}}, path)
    import subprocess
    import sys

    code = ("import warnings; warnings.simplefilter('ignore'); "
            "from strategies.checkpoint_io.safe_load import safe_load; "
            f"print(sorted(safe_load({str(path)!r})))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=root)
    assert "the file ran code" not in out.stdout and "hyper_parameters" in out.stdout


def _ddp_rank(rank: int) -> dict[str, Any]:
    restored: dict[str, Any] = {}

    class Probe(Regressor):
        def on_fit_start(self) -> None:
            restored["weights"] = {k: v.clone() for k, v in self.state_dict().items()}
            restored["lr"] = self.trainer.optimizers[0].param_groups[0]["lr"]

    model = Probe()
    trainer = Trainer(**{**QUIET, "max_epochs": 3, "devices": 2, "strategy": "ddp"})
    _quietly(trainer.fit, model, loader(), ckpt_path=FIXTURE)
    return {"restored": restored, "seen": [s[:3] for s in model.seen], "end": (trainer.current_epoch,
            trainer.global_step), "weights": {k: v.clone() for k, v in model.state_dict().items()}}


@pytest.mark.distributed
def test_two_ranks_resume_a_lightning_checkpoint_alike():
    from tests.helpers.dist import run_distributed

    ranks = run_distributed(_ddp_rank, timeout=120)
    saved = _saved(FIXTURE)
    for rank in ranks:
        assert all(torch.equal(rank["restored"]["weights"][k], v) for k, v in saved["state_dict"].items())
        assert rank["restored"]["lr"] == 0.025
        # 16 samples, batches of 4 split over 2 ranks: 2 steps per epoch from the saved step 4 on
        assert rank["seen"] == [(1, 0, 4), (1, 1, 5), (2, 0, 6), (2, 1, 7)] and rank["end"] == (3, 8)
    assert all(torch.equal(ranks[0]["weights"][k], v) for k, v in ranks[1]["weights"].items())


# --- with Lightning itself (skipped where it is not installed) ------------------------------------------------
@pytest.fixture(scope="module")
def lightning_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("lightning.pytorch", reason="these checkpoints are made by running Lightning 2.x")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.compat.lightning_fixture import lightning_module_class, lightning_trainer

    root = tmp_path_factory.mktemp("lightning")
    lit = lightning_module_class()
    every_epoch = ModelCheckpoint(dirpath=root / "epochs", save_top_k=-1, filename="{epoch}")
    mid_epoch = ModelCheckpoint(dirpath=root / "steps", save_top_k=-1, every_n_train_steps=6, filename="{step}")
    weights = ModelCheckpoint(dirpath=root / "weights", save_weights_only=True, filename="w", every_n_epochs=2)
    after_validation = ModelCheckpoint(dirpath=root / "val", monitor="val_loss", save_top_k=-1, filename="{epoch}",
                                       save_on_train_epoch_end=False)  # saved in on_validation_end, inside the epoch
    trainer = lightning_trainer(root, 2, callbacks=[every_epoch, mid_epoch, weights, after_validation])
    _quietly(trainer.fit, lit(), loader(), loader())
    trainer.save_checkpoint(root / "after_fit.ckpt")
    return {"epoch_end": root / "epochs" / "epoch=0.ckpt", "mid_epoch": root / "steps" / "step=6.ckpt",
            "validation_end": root / "val" / "epoch=0.ckpt",
            "after_fit": root / "after_fit.ckpt", "weights_only": root / "weights" / "w.ckpt"}


@pytest.fixture(scope="module")
def lightning_uninterrupted(lightning_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
                            ) -> dict[str, torch.Tensor]:
    """The weights of Lightning's own 3-epoch run that never stopped: what every resume must reach."""
    from tests.compat.lightning_fixture import lightning_module_class, lightning_trainer

    model = lightning_module_class()()
    _quietly(lightning_trainer(tmp_path_factory.mktemp("uninterrupted"), 3).fit, model, loader())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_checked_in_fixture_is_what_its_script_writes(lightning_files: dict[str, Path], tmp_path: Path):
    from tests.compat.lightning_fixture import write_checkpoints

    fresh = _saved(_quietly(write_checkpoints, tmp_path)[0])
    kept = _saved(FIXTURE)
    # Not bitwise: the file was written by the torch of its day, and a later torch's float kernels may round the
    # last bit differently (torch 2.14.1 differs by 1 ulp). A different model, data or schedule is far outside this.
    for name, tensor in kept["state_dict"].items():
        torch.testing.assert_close(fresh["state_dict"][name], tensor, rtol=1e-6, atol=1e-7)
    assert (fresh["epoch"], fresh["global_step"], fresh["lr_schedulers"]) == (
        kept["epoch"], kept["global_step"], kept["lr_schedulers"])


def _lightning_resume(ckpt: Path, root: Path) -> dict[str, torch.Tensor]:
    """Lightning's own resume. Lightning 2.6.6 refuses its own file when the hyperparameters hold a Namespace
    or a class (weights-only load): for the oracle, the test's own trusted file is loaded unsafely."""
    from tests.compat.lightning_fixture import lightning_module_class, lightning_trainer

    model = lightning_module_class()()
    _quietly(lightning_trainer(root, 3).fit, model, loader(), ckpt_path=ckpt, weights_only=False)
    return {k: v.detach() for k, v in model.state_dict().items()}


# Files written by Lightning on the running torch, so that the comparison can be bitwise: the checked-in file holds
# the rounding of the torch that wrote it (its resume is compared with Lightning's own resume of it, below).
@pytest.mark.parametrize("source", ["epoch_end", "validation_end"])
def test_resuming_a_lightning_checkpoint_trains_what_the_uninterrupted_lightning_run_trained(
        lightning_files: dict[str, Path], lightning_uninterrupted: dict[str, torch.Tensor], source: str):
    model, _ = _resume(lightning_files[source])
    assert all(torch.equal(model.state_dict()[k], v) for k, v in lightning_uninterrupted.items())


@pytest.mark.parametrize("source", ["fixture", "epoch_end"])
def test_resuming_a_lightning_checkpoint_trains_what_lightning_resumed_trains(
        lightning_files: dict[str, Path], tmp_path: Path, source: str):
    ckpt = FIXTURE if source == "fixture" else lightning_files[source]
    expected = _lightning_resume(ckpt, tmp_path)
    model, _ = _resume(ckpt)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())


def test_a_checkpoint_saved_after_fit_resumes_with_nothing_left_to_train(lightning_files: dict[str, Path]):
    model, trainer = _resume(lightning_files["after_fit"], max_epochs=2)
    assert model.seen == [] and (trainer.current_epoch, trainer.global_step) == (2, 2 * BATCHES_PER_EPOCH)
    model, trainer = _resume(lightning_files["after_fit"], max_epochs=3)
    assert [s[:2] for s in model.seen] == [(2, b) for b in range(BATCHES_PER_EPOCH)]


def test_a_mid_epoch_checkpoint_continues_that_epoch_after_the_batches_done(lightning_files: dict[str, Path]):
    model, trainer = _resume(lightning_files["mid_epoch"])  # step 6: epoch 1, 2 of its 4 batches done
    assert [s[:3] for s in model.seen][:2] == [(1, 2, 6), (1, 3, 7)]
    assert trainer.global_step == 3 * BATCHES_PER_EPOCH


def test_a_weights_only_lightning_checkpoint_loads_but_cannot_resume(lightning_files: dict[str, Path]):
    path = lightning_files["weights_only"]
    model = _quietly(Regressor.load_from_checkpoint, path, options=None)
    assert torch.equal(model.net[0].weight, _saved(path)["state_dict"]["net.0.weight"])
    with pytest.raises(CheckpointLoadError, match=r"has no 'optimizer_states'.*holds the weights only"):
        _resume(path)
