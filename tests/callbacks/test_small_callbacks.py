"""Timer, LambdaCallback and OnExceptionCheckpoint with Lightning 2.6's documented behaviour (Lightning side by side
where it is cheap)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import LambdaCallback, ModelCheckpoint, OnExceptionCheckpoint, Timer
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer


class Slow(BoringModel):
    """Each training step takes at least 20 ms, so a time limit lands after a known number of batches."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def test_timer_stops_training_when_the_duration_is_up():
    timer = Timer(duration=timedelta(seconds=0.1), verbose=False)
    trainer = Trainer(max_epochs=100, callbacks=[timer], **QUIET)
    trainer.fit(Slow())
    assert 1 <= trainer.global_step < 8  # stopped within the first of 100 epochs of 8 batches
    assert timer.time_elapsed("train") >= 0.1 and timer.time_remaining() <= 0


def test_timer_measures_every_stage():
    timer = Timer()
    trainer = Trainer(max_epochs=1, limit_val_batches=2, callbacks=[timer], **QUIET)
    trainer.fit(BoringModel())
    trainer.test(trainer.lightning_module, verbose=False)
    assert all(timer.time_elapsed(stage) > 0 for stage in ("train", "validate", "test"))
    assert timer.end_time("train") >= timer.start_time("train") and timer.time_remaining() is None
    assert timer.time_elapsed("predict") == 0.0


@pytest.mark.parametrize("duration", ["00:00:00:01", {"seconds": 1}, timedelta(seconds=1)])
def test_timer_takes_lightnings_duration_forms(duration: Any):
    assert Timer(duration=duration).time_remaining() == pytest.approx(1.0)


def test_timer_refuses_bad_arguments():
    with pytest.raises(ConfigError, match="in the format DD:HH:MM:SS"):
        Timer(duration="1 hour")
    with pytest.raises(ConfigError, match="interval='batch'.*Unsupported parameter value"):
        Timer(interval="batch")


def test_timer_says_why_it_stops(capsys: pytest.CaptureFixture):
    Trainer(max_epochs=100, callbacks=[Timer(duration=timedelta(seconds=0.05))], **QUIET).fit(Slow())
    assert "Time limit reached. Elapsed time is 0:00:00. Signaling Trainer to stop." in capsys.readouterr().out


def test_the_timer_keeps_training_time_across_a_resume(tmp_path: Path):
    timer = Timer()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4)
    Trainer(max_steps=4, callbacks=[timer, saver], **{**QUIET, "enable_checkpointing": True}).fit(Slow())
    saved = torch.load(saver.best_model_path, weights_only=True)["callbacks"]["Timer"]["time_elapsed"]["train"]
    assert 0.08 <= saved <= timer.time_elapsed("train")  # four batches of >= 20 ms
    resumed = Timer()
    Trainer(max_steps=8, callbacks=[resumed], **QUIET).fit(Slow(), ckpt_path=saver.best_model_path)
    assert resumed.time_elapsed("train") >= saved + 0.08  # four more batches on top of the saved time


def test_timer_state_matches_lightnings():
    lightning_timer = pytest.importorskip("lightning.pytorch.callbacks").Timer
    assert set(Timer().state_dict()["time_elapsed"]) == set(lightning_timer().state_dict()["time_elapsed"])


def test_lambda_callback_runs_the_functions_at_their_hooks():
    seen: list[str] = []
    callback = LambdaCallback(on_train_start=lambda trainer, module: seen.append("start"),
                              on_train_batch_end=lambda trainer, module, out, batch, i: seen.append(f"batch {i}"),
                              on_fit_end=None)
    Trainer(max_steps=2, callbacks=[callback], **QUIET).fit(BoringModel())
    assert seen == ["start", "batch 0", "batch 1"]


def test_lambda_callback_refuses_a_name_that_is_not_a_hook():
    with pytest.raises(TypeError, match="on_train_batch_finish"):
        LambdaCallback(on_train_batch_finish=print)


def test_lambda_callback_takes_lightnings_hook_names():
    lightning = pytest.importorskip("lightning.pytorch.callbacks")
    import inspect

    names = set(inspect.signature(lightning.LambdaCallback).parameters)
    for name in names:
        LambdaCallback(**{name: print})  # every hook Lightning's takes is one here


class Fails(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == 3:
            raise RuntimeError("a bug in step 3")
        return super().training_step(batch, batch_idx)


def test_on_exception_checkpoint_saves_where_the_run_failed(tmp_path: Path):
    callback = OnExceptionCheckpoint(dirpath=tmp_path)
    with pytest.raises(RuntimeError, match="a bug in step 3"):
        Trainer(max_epochs=1, callbacks=[callback], **QUIET).fit(Fails())
    checkpoint = torch.load(callback.ckpt_path, weights_only=True)
    assert callback.ckpt_path == str(tmp_path / "on_exception.ckpt") and checkpoint["global_step"] == 3
    trainer = Trainer(max_epochs=1, **QUIET)
    trainer.fit(BoringModel(), ckpt_path=callback.ckpt_path)  # resumable
    assert trainer.global_step == 8


def test_on_exception_checkpoint_needs_one_process():
    callback = OnExceptionCheckpoint(dirpath="unused")
    with pytest.raises(ConfigError, match="single process"):
        callback.setup(Trainer(devices=2, accelerator="cpu", strategy="ddp"), BoringModel(), "fit")



def test_on_exception_checkpoint_names_its_file_as_lightning_and_a_good_fit_removes_a_stale_one(tmp_path: Path):
    class Dotted(OnExceptionCheckpoint):
        FILE_EXTENSION = ".pt"

    callback = Dotted(tmp_path, filename="failed")
    assert callback.ckpt_path == str(tmp_path / "failed.pt") and callback.dirpath == tmp_path
    (tmp_path / "failed.pt").write_bytes(b"from an earlier failure")
    Trainer(max_steps=1, callbacks=[callback], **QUIET).fit(BoringModel())
    assert not (tmp_path / "failed.pt").exists()
    with pytest.raises(ValueError, match="filename cannot be empty"):
        OnExceptionCheckpoint(tmp_path, filename="")
