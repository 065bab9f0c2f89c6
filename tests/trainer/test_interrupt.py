"""Ctrl-C (SIGINT) during fit with one process: stop after the batch, teardown, exit 130 (not a silent return), an
optional checkpoint; a second Ctrl-C stops at once; a user's own SIGINT handler is left alone. The 2-rank cases (every
rank stops after the same batch, under each launcher) are in tests/reliability/test_processes.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import Callback
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.ranks.preemption import SECOND_INTERRUPT_AFTER_S, StopSignals

FLAGS = {**QUIET, "max_epochs": 2, "num_sanity_val_steps": 0, "limit_val_batches": 0}  # 8 batches per epoch


class CtrlC(BoringModel):
    """Sends itself SIGINT (twice, `gap` seconds apart, when asked) at one global step."""

    def __init__(self, step: int, twice: bool = False, gap: float = 0.0) -> None:
        super().__init__()
        self.step, self.twice, self.gap, self.done = step, twice, gap, False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_step == self.step and not self.done:
            self.done = True
            os.kill(os.getpid(), signal.SIGINT)
            if self.twice:
                time.sleep(self.gap)
                os.kill(os.getpid(), signal.SIGINT)
        return super().training_step(batch, batch_idx)


class Seen(Callback):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        kind = "KeyboardInterrupt" if isinstance(exception, KeyboardInterrupt) else type(exception).__name__
        self.events.append(f"on_exception:{kind}")

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        self.events.append("teardown")


def _fit(tmp_path: Path, model: BoringModel, **flags: Any) -> tuple[Trainer, Seen, pytest.ExceptionInfo]:
    seen = Seen()
    trainer = Trainer(default_root_dir=tmp_path, callbacks=[seen], **{**FLAGS, **flags})
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit(model)
    return trainer, seen, exit_info


def test_ctrl_c_stops_after_the_batch_runs_teardown_and_exits_130(tmp_path: Path, capsys: pytest.CaptureFixture):
    trainer, seen, exit_info = _fit(tmp_path, CtrlC(step=2))
    assert exit_info.value.code == 130
    assert trainer.global_step == 3, "the batch in flight finishes, then the run stops"
    assert seen.events == ["on_exception:KeyboardInterrupt", "teardown"]
    assert "[rank 0] SIGINT (Ctrl-C) received: stopped after global step 3 (epoch 0); no checkpoint saved" in \
        capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ckpt"))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler was not restored"


def test_checkpoint_on_interrupt_saves_where_the_run_stopped(tmp_path: Path):
    trainer, _, exit_info = _fit(tmp_path, CtrlC(step=2), checkpoint_on_interrupt=True)
    assert exit_info.value.code == 130
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 3


def test_a_second_ctrl_c_stops_at_once(tmp_path: Path, capsys: pytest.CaptureFixture):
    trainer, seen, exit_info = _fit(tmp_path, CtrlC(step=2, twice=True, gap=SECOND_INTERRUPT_AFTER_S + 0.3))
    assert exit_info.value.code == 130
    assert trainer.global_step == 2, "the second Ctrl-C must not wait for the end of the batch"
    assert seen.events == ["on_exception:KeyboardInterrupt", "teardown"]
    assert "KeyboardInterrupt during fit at global step 2 (epoch 0): stopped at once" in capsys.readouterr().err


def test_one_ctrl_c_delivered_twice_in_a_row_is_one_stop(tmp_path: Path):
    """A terminal's Ctrl-C and a launcher forwarding it arrive within milliseconds: still an orderly stop."""
    trainer, _, exit_info = _fit(tmp_path, CtrlC(step=2, twice=True, gap=0.05))
    assert exit_info.value.code == 130 and trainer.global_step == 3


class CtrlCInValidation(Callback):
    def on_validation_start(self, trainer: Any, module: Any) -> None:
        if trainer.current_epoch == 1:  # the final validation: no training batch follows
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_during_the_final_validation_still_exits_130(tmp_path: Path):
    seen = Seen()
    trainer = Trainer(default_root_dir=tmp_path, callbacks=[seen, CtrlCInValidation()],
                      **{**FLAGS, "limit_val_batches": 2})
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit(BoringModel())
    assert exit_info.value.code == 130
    assert trainer.global_step == 16 and seen.events[-1] == "teardown"


def test_a_sigint_handler_of_the_user_is_left_alone(tmp_path: Path):
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        trainer = Trainer(default_root_dir=tmp_path, **FLAGS)
        trainer.fit(CtrlC(step=2))
        assert calls == [signal.SIGINT] and trainer.global_step == 16
    finally:
        signal.signal(signal.SIGINT, previous)


def test_stop_signals_prefer_a_saving_stop():
    signals = StopSignals()
    signals.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.received == signal.SIGINT
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM  # SIGTERM saves: it wins over a pending Ctrl-C
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.received == signal.SIGTERM
    finally:
        signals.restore()


@pytest.mark.parametrize("value", ["true", 1, None])
def test_checkpoint_on_interrupt_takes_a_bool(value: Any):
    with pytest.raises(ConfigError, match="checkpoint_on_interrupt=.* is not valid: use True or False"):
        Trainer(checkpoint_on_interrupt=value)
