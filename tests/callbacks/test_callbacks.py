"""EarlyStopping, LearningRateMonitor, ProgressBar and ModelSummary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import EarlyStopping, LearningRateMonitor, ProgressBar
from callbacks.model_summary import summarize
from tests.helpers.boring import QUIET, BoringModel
from tests.trainer.test_logging import MemoryLogger
from trainer import Trainer
from trainer.exceptions import MisconfigurationError

BAR = {**QUIET, "enable_progress_bar": True}  # a bar given in callbacks needs the flag on, as in Lightning


class Curve(BoringModel):
    """val_metric per epoch follows `values`."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.values = values

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("val_metric", self.values[self.current_epoch])


@pytest.mark.parametrize(
    ("values", "kwargs", "epochs"),
    [
        ([5, 4, 4, 4, 4, 1, 1, 1], {"patience": 3}, 5),  # stops after 3 checks without improvement
        ([5, 4, 4, 4, 4, 1, 1, 1], {"patience": 3, "min_delta": 2}, 4),
        ([5, 4, 3, 2, 1, 0, 0, 0], {"stopping_threshold": 2.5}, 4),
        ([1, 2, 99, 2, 1, 0, 0, 0], {"divergence_threshold": 50}, 3),
        ([1, float("nan"), 1, 1, 1, 1, 1, 1], {}, 2),
        ([1, 2, 3, 4, 5, 6, 7, 8], {"mode": "max", "patience": 1}, 8),
    ],
)
def test_early_stopping(values: list[float], kwargs: dict, epochs: int):
    cb = EarlyStopping(monitor="val_metric", **kwargs)
    trainer = Trainer(max_epochs=8, limit_train_batches=1, num_sanity_val_steps=0, callbacks=[cb], **QUIET)
    trainer.fit(Curve(values))
    assert trainer.current_epoch == epochs


def test_early_stopping_on_train_metric_without_validation():
    class M(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("train_metric", 1.0, on_step=False, on_epoch=True)
            return super().training_step(batch, batch_idx)

    cb = EarlyStopping(monitor="train_metric", patience=2)
    trainer = Trainer(max_epochs=10, limit_train_batches=1, limit_val_batches=0, callbacks=[cb], **QUIET)
    trainer.fit(M())
    assert trainer.current_epoch == 3 and trainer.early_stopping_callback is cb


def test_early_stopping_missing_metric_is_a_clear_error():
    with pytest.raises(MisconfigurationError, match=r"metric `nope` which is not available"):
        Trainer(max_epochs=2, callbacks=[EarlyStopping(monitor="nope")], **QUIET).fit(BoringModel())


def test_lr_monitor_logs_learning_rates():
    class M(BoringModel):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=1.0, momentum=0.9)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)]

    logger = MemoryLogger()
    cb = LearningRateMonitor(log_momentum=True)
    Trainer(max_epochs=3, limit_train_batches=1, limit_val_batches=0, callbacks=[cb],
            **{**QUIET, "logger": logger}).fit(M())
    assert cb.lrs == {"lr-SGD": [1.0, 0.5, 0.25]}
    assert cb.last_momentum_values == {"lr-SGD-momentum": 0.9}
    assert logger.rows[0] == (0, {"lr-SGD": 1.0, "lr-SGD-momentum": 0.9})


def test_lr_monitor_logs_step_rates_at_the_trainers_logging_cadence():
    """Every `log_every_n_steps`-th training batch, before its optimizer step, at the step it starts from."""

    class M(BoringModel):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5),
                                                       "interval": "step"}}

    logger = MemoryLogger()
    cb = LearningRateMonitor()
    trainer = Trainer(max_epochs=2, limit_train_batches=4, limit_val_batches=0, log_every_n_steps=3,
                      accumulate_grad_batches=2, callbacks=[cb], **{**QUIET, "logger": logger})
    trainer.fit(M())
    # Lightning's count is optimizer steps: both batches of the window that closes the 3rd step (batches 5 and 6 of
    # 8) log, at the 2 steps before it (Lightning 2.6 gives the same rows)
    assert logger.rows == [(2, {"lr-SGD": 0.25}), (2, {"lr-SGD": 0.25})]
    assert cb.lrs == {"lr-SGD": [0.25, 0.25]}
    assert "lr-SGD" not in trainer.logged_metrics  # as in Lightning: the callback's values are not self.log values


def test_lr_monitor_needs_a_logger():
    with pytest.raises(MisconfigurationError, match="`LearningRateMonitor` callback with `Trainer` that has no logger"):
        Trainer(max_epochs=1, callbacks=[LearningRateMonitor()], **QUIET).fit(BoringModel())


def test_progress_bar_shows_epochs_and_prog_bar_metrics(capsys: pytest.CaptureFixture):
    class M(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("shown", 1.25, prog_bar=True)
            return loss

    Trainer(max_epochs=2, callbacks=[ProgressBar(plain=False)], **BAR).fit(M())
    out = capsys.readouterr().out
    assert "Epoch 0" in out and "Epoch 1" in out and "shown=1.25" in out and "8/8" in out


def test_progress_bar_prints_plain_lines_when_stdout_is_not_a_terminal(capsys: pytest.CaptureFixture):
    class M(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("shown", 1.25, prog_bar=True)
            return loss

    Trainer(max_epochs=2, num_sanity_val_steps=0, callbacks=[ProgressBar()], **BAR).fit(M())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" batches")[0] for line in lines] == [
        "Validation: 8/8", "Epoch 0: 8/8", "Validation: 8/8", "Epoch 1: 8/8"]
    assert lines[1].endswith("shown=1.25") and "\r" not in "".join(lines)


@pytest.mark.subprocess
def test_progress_bar_through_a_pseudo_terminal_draws_tqdm(tmp_path):  # noqa: ANN001
    import os
    import pty
    import subprocess
    import sys

    script = tmp_path / "bar.py"
    script.write_text(
        "from tests.helpers.boring import BoringModel, QUIET\n"
        "from callbacks import ProgressBar\nfrom trainer import Trainer\n"
        "class M(BoringModel):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        self.log('shown', 1.25, prog_bar=True)\n"
        "        return super().training_step(batch, batch_idx)\n"
        "Trainer(max_epochs=1, callbacks=[ProgressBar()], **{**QUIET, 'enable_progress_bar': True}).fit(M())\n"
    )
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=follower, stderr=follower, env=env)
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    assert proc.wait(timeout=60) == 0
    text = output.decode(errors="replace")
    assert "\r" in text and "Epoch 0" in text and "shown=1.25" in text and "100%" in text


def test_model_summary_counts_parameters(capsys: pytest.CaptureFixture):
    text = summarize(BoringModel())
    assert "| layer | Linear | 66" in text and "66        Trainable params" in text
    Trainer(max_epochs=1, limit_train_batches=1, **{**QUIET, "enable_model_summary": True}).fit(BoringModel())
    assert "66        Total params" in capsys.readouterr().out
