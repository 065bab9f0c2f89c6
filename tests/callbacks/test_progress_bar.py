"""ProgressBar (Lightning's TQDMProgressBar): a string metric off a terminal (W&B's run id as `v_num`), the bars as
public attributes, the `init_*_tqdm` methods a subclass overrides, `total_val_batches`, `refresh_rate=0`, the
dataloader tracker, and the padded numbers of `Tqdm`."""

from __future__ import annotations

from typing import Any

import pytest

from callbacks import ProgressBar, Tqdm
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.loggers import CSVLogger

BAR = {**QUIET, "enable_progress_bar": True, "limit_train_batches": 2, "limit_val_batches": 2,
       "limit_test_batches": 3, "limit_predict_batches": 1, "num_sanity_val_steps": 0}


class Shows(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("word_free", 0.5, prog_bar=True)
        return super().training_step(batch, batch_idx)


def test_a_string_version_off_a_terminal_is_printed_not_a_crash(tmp_path, capsys: pytest.CaptureFixture):
    """Off a terminal (here: pytest's captured stdout) the bar prints plain lines; a string `v_num` (a W&B run id)
    used to raise `ValueError: Unknown format code 'g' for object of type 'str'` there."""
    logger = CSVLogger(tmp_path, version="run-x7k2")
    Trainer(**{**BAR, "logger": logger, "max_epochs": 1}).fit(Shows())
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Epoch 0: 2/2") and line.endswith("v_num=x7k2, word_free=0.5") for line in lines)


def test_the_bars_are_public_attributes_with_their_totals():
    bar = ProgressBar()
    with pytest.raises(TypeError, match="train_progress_bar` reference has not been set yet"):
        _ = bar.train_progress_bar
    trainer = Trainer(**{**BAR, "callbacks": [bar], "max_epochs": 1})
    model = BoringModel()
    trainer.fit(model)
    trainer.test(model, verbose=False)
    trainer.predict(model)
    assert (bar.train_progress_bar.total, bar.val_progress_bar.total) == (2, 2)
    assert (bar.test_progress_bar.total, bar.predict_progress_bar.total) == (3, 1)
    assert (bar.refresh_rate, bar.process_position, bar.is_enabled) == (1, 0, True)


def test_an_overridden_init_tqdm_makes_that_bar(tmp_path):
    made: list[Any] = []

    class QuietValidation(ProgressBar):
        def init_validation_tqdm(self) -> Any:
            bar = Tqdm(disable=True, leave=False)
            made.append(bar)
            return bar

    bar = QuietValidation()
    Trainer(**{**BAR, "callbacks": [bar], "max_epochs": 1}).fit(BoringModel())
    assert made and bar.val_progress_bar is made[-1] and made[-1].total == 2


def test_total_val_batches_is_0_in_an_epoch_without_validation():
    seen: list[Any] = []

    class Reads(BoringModel):
        def on_train_epoch_end(self) -> None:
            seen.append(self.trainer.progress_bar_callback.total_val_batches)

    Trainer(**{**BAR, "max_epochs": 4, "check_val_every_n_epoch": 2}).fit(Reads())
    assert seen == [0, 2, 0, 2]


def test_refresh_rate_0_disables_the_bar(capsys: pytest.CaptureFixture):
    bar = ProgressBar(refresh_rate=0)
    Trainer(**{**BAR, "callbacks": [bar], "max_epochs": 1}).fit(BoringModel())
    assert bar.is_disabled and capsys.readouterr().out == ""


def test_the_dataloader_tracker():
    bar = ProgressBar()
    assert bar.has_dataloader_changed(0) and not bar.has_dataloader_changed(0) and bar.has_dataloader_changed(1)
    bar.reset_dataloader_idx_tracker()
    assert bar.has_dataloader_changed(1)


def test_tqdm_pads_numbers_as_lightnings_does():
    values = (0.5, 1.0, "0.25", 3, "word", 1e-9, 12345.678, "7", 2.0)
    ours = [Tqdm.format_num(v) for v in values]
    assert ours[:3] == ["0.500", "1.000", "0.250"]
    tqdm_progress = pytest.importorskip("lightning.pytorch.callbacks.progress.tqdm_progress")
    assert ours == [tqdm_progress.Tqdm.format_num(v) for v in values]
