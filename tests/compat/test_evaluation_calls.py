"""validate()/test() as in Lightning 2.x: `verbose` in fourth place and a results table printed by rank 0 (laid out
as Lightning prints it without rich, compared character for character), and, without a model, the best checkpoint
of the previous fit loaded with a warning (an error when there is none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.metrics.results_table import format_results


class EpochScore(BoringModel):
    """Logs its epoch as `score`: with mode='min' the best checkpoint is the first epoch's."""

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("score", float(self.current_epoch))
        return super().validation_step(batch, batch_idx)


def test_verbose_prints_the_table_and_is_lightnings_fourth_argument(capsys: pytest.CaptureFixture[str]):
    model = BoringModel()
    trainer = Trainer(**QUIET)
    trainer.test(model, None, None, False)
    assert capsys.readouterr().out == ""
    results = trainer.test(model)
    out = capsys.readouterr().out
    assert "Test metric" in out and "DataLoader 0" in out and f"{results[0]['test_loss']}" in out


def test_the_table_is_laid_out_as_lightning_prints_it(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]):
    evaluation_loop = pytest.importorskip("lightning.pytorch.loops.evaluation_loop")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(evaluation_loop, "_RICH_AVAILABLE", False)
    results = [{"val_loss/dataloader_idx_0": torch.tensor(0.125), "acc/dataloader_idx_0": 0.5},
               {"val_loss/dataloader_idx_1": 2.0, "a_metric_with_a_rather_long_name_that_wraps_around_" * 2: 1.0}]
    evaluation_loop._EvaluationLoop._print_results(results, "validate")
    assert format_results(results, "validate") + "\n" == capsys.readouterr().out


def test_without_a_model_the_best_checkpoint_of_the_fit_is_evaluated(tmp_path: Path):
    saver = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="min", save_top_k=1)
    trainer = Trainer(max_epochs=3, callbacks=[saver], **{**QUIET, "enable_checkpointing": True})
    model = EpochScore()
    trainer.fit(model)
    assert saver.best_model_path.endswith("epoch=0-step=8.ckpt")
    best = torch.load(saver.best_model_path, weights_only=True)["state_dict"]
    assert not torch.equal(best["layer.weight"], model.layer.weight)
    with pytest.warns(UserWarning, match="loads the best checkpoint of the previous fit"):
        trainer.validate(verbose=False)
    assert torch.equal(best["layer.weight"], model.layer.weight)


def test_without_a_model_and_without_a_checkpoint_it_is_an_error():
    trainer = Trainer(max_epochs=1, **QUIET)
    model = BoringModel()
    trainer.fit(model)
    with pytest.raises(MisconfigurationError, match=r"no ModelCheckpoint saved one.*trainer.test\(model\)"):
        trainer.test()
    assert trainer.test(model, verbose=False)  # with the model: its current weights
