"""RichProgressBar and RichModelSummary: the bars (descriptions, totals, progress, visibility) and the metrics shown at
each step equal those of Lightning's RichProgressBar on the same run; only one progress bar per Trainer."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import (
    Callback,
    ModelSummary,
    ProgressBar,
    RichModelSummary,
    RichProgressBar,
    RichProgressBarTheme,
)
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, RandomDataset
from trainer import Trainer, TrainModule
from trainer.loggers import CSVLogger

pytest.importorskip("rich")
@pytest.fixture(autouse=True)
def _rich_console_reset() -> Any:
    """Lightning's RichProgressBar reconfigures rich's global console with its console_kwargs: undo it."""
    import rich

    yield
    rich.reconfigure()


BAR = {**QUIET, "enable_progress_bar": True}
RUN = {"max_epochs": 2, "limit_train_batches": 5, "limit_val_batches": 3, "num_sanity_val_steps": 2,
       "limit_test_batches": 4, "limit_predict_batches": 2}


def _loader(seed: int, length: int = 64) -> DataLoader:
    return DataLoader(RandomDataset(32, length, seed=seed), batch_size=8)


class _Body:
    """The model both sides train: two validation and two predict loaders, `step` logged to the bar each step."""

    def build(self) -> None:
        torch.manual_seed(0)
        self.layer = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("step", float(batch_idx) + 0.25 * self.current_epoch, prog_bar=True)
        self.log("hidden", 1.0)
        return self(batch).sum()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        self.log("val", self(batch).sum(), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("test", self(batch).sum())

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self(batch)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return _loader(0)

    def val_dataloader(self) -> list[DataLoader]:
        return [_loader(1), _loader(2, length=16)]

    def test_dataloader(self) -> DataLoader:
        return _loader(3)

    def predict_dataloader(self) -> list[DataLoader]:
        return [_loader(4), _loader(5)]


class Ours(_Body, TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.build()


class Seen(Callback):
    """What the bar shows after each training batch (placed after the bar, so the bar has updated)."""

    def __init__(self, texts: Any) -> None:
        self.texts, self.steps = texts, []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps.append(self.texts())


def _tasks(bar: Any) -> list[tuple[str, Any, float, bool]]:
    return [(t.description, t.total, t.completed, t.visible) for t in bar.progress.tasks]


def _run_all(trainer: Any, model: Any, bar: Any) -> list[list[tuple[str, Any, float, bool]]]:
    """fit, validate, test, predict; the bars of each stage."""
    stages = []
    trainer.fit(model)
    stages.append(_tasks(bar))
    for method in ("validate", "test", "predict"):
        getattr(trainer, method)(model, **({} if method == "predict" else {"verbose": False}))
        stages.append(_tasks(bar))
    return stages


def test_bars_and_metrics_match_lightnings(tmp_path: Path):
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import RichProgressBar as LitBar
    from lightning.pytorch.loggers import CSVLogger as LitCSV

    class Lit(_Body, pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.build()

    theirs_bar = LitBar(console_kwargs={"file": io.StringIO(), "force_terminal": True, "width": 160})
    theirs_seen = Seen(lambda: list(theirs_bar._metric_component._generate_metrics_texts()))
    lit = pl.Trainer(**RUN, callbacks=[theirs_bar, theirs_seen], logger=LitCSV(tmp_path / "lit"),
                     enable_checkpointing=False, enable_model_summary=False, accelerator="cpu", devices=1)
    theirs = _run_all(lit, Lit(), theirs_bar)

    ours_bar = RichProgressBar(refresh_rate=10**9, console_kwargs={"file": io.StringIO(), "force_terminal": True})
    ours_seen = Seen(ours_bar.metrics_texts)
    trainer = Trainer(**RUN, callbacks=[ours_bar, ours_seen], **{**BAR, "logger": CSVLogger(tmp_path / "ours")})
    ours = _run_all(trainer, Ours(), ours_bar)

    assert ours == theirs
    assert ours[0][2] == ("Epoch 1/1 ", 5, 5, True) and ours[2] == [("Testing", 4, 4, True)]
    assert ours[1] == [("Validation", 3, 3, False), ("Validation", 2, 2, True)]  # a bar per loader, totals per loader
    assert ours_seen.steps == theirs_seen.steps
    assert ours_seen.steps[4] == ["v_num: 0.000", "step: 4.000"]  # epoch 0 (no val yet); then val's value joins


def test_the_console_shows_descriptions_totals_and_values():
    out = io.StringIO()
    bar = RichProgressBar(console_kwargs={"file": out, "force_terminal": True, "width": 200},
                          theme=RichProgressBarTheme(metrics_format=".2f"))
    Trainer(**{**RUN, "limit_val_batches": 0}, callbacks=[bar], **BAR).fit(Ours())
    text = out.getvalue()
    assert "Epoch 0/1 " in text and "Epoch 1/1 " in text and "5/5" in text and "step: 4.25" in text
    assert "hidden" not in text


def test_the_bars_ids_columns_and_refresh_are_lightnings():
    from rich.progress import TextColumn

    class OneColumn(RichProgressBar):
        def configure_columns(self, trainer: Any) -> list[Any]:
            return [TextColumn("[progress.description]{task.description} only")]

    out = io.StringIO()
    bar = OneColumn(console_kwargs={"file": out, "force_terminal": True, "width": 200})
    trainer = Trainer(**{**RUN, "limit_val_batches": 1, "num_sanity_val_steps": 1}, callbacks=[bar], **BAR)
    with pytest.raises(TypeError, match="not been shown yet"):
        _ = bar.train_progress_bar
    trainer.fit(Ours())
    trainer.test(trainer.lightning_module, verbose=False)
    assert bar.test_progress_bar.total == 4 and bar.test_progress_bar_id is not None
    assert bar.predict_progress_bar_id is None and bar.val_progress_bar_id is None  # test restarted the display
    assert "Testing only" in out.getvalue()
    bar.refresh()


def test_refresh_rate_zero_draws_nothing():
    out = io.StringIO()
    bar = RichProgressBar(refresh_rate=0, console_kwargs={"file": out, "force_terminal": True})
    Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, callbacks=[bar], **BAR).fit(Ours())
    assert out.getvalue() == "" and bar.progress is None


def test_only_rank_zero_draws():
    bar = RichProgressBar()
    bar.setup(SimpleNamespace(is_global_zero=False), Ours(), "fit")  # type: ignore[arg-type]
    assert bar.is_disabled


def test_rich_bar_replaces_the_default_bar_and_brings_the_rich_summary():
    bar = RichProgressBar()
    trainer = Trainer(max_epochs=1, callbacks=[bar], **{**BAR, "enable_model_summary": True})
    assert trainer.progress_bar_callback is bar
    assert not any(type(cb) is ProgressBar for cb in trainer.callbacks)
    assert [type(cb) for cb in trainer.callbacks if isinstance(cb, ModelSummary)] == [RichModelSummary]


def test_only_one_progress_bar_as_in_lightning():
    with pytest.raises(ConfigError, match="takes one"):
        Trainer(callbacks=[ProgressBar(), RichProgressBar()], **BAR)
    with pytest.raises(ConfigError, match="enable_progress_bar=False"):
        Trainer(callbacks=[RichProgressBar()], **QUIET)
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import RichProgressBar as LitBar
    from lightning.pytorch.callbacks import TQDMProgressBar

    with pytest.raises(Exception, match="only one"):
        pl.Trainer(callbacks=[TQDMProgressBar(), LitBar()])
    with pytest.raises(Exception, match="enable_progress_bar=False"):
        pl.Trainer(callbacks=[LitBar()], enable_progress_bar=False)


def test_rich_model_summary_prints_what_lightnings_prints(capsys: pytest.CaptureFixture[str]):
    pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import RichModelSummary as LitSummary

    from callbacks.model_summary import summary_of

    model = Ours()
    model.example_input_array = torch.zeros(4, 32)
    data = summary_of(model, 1, model.example_input_array)
    arguments = (data.columns, data.total_parameters, data.trainable_parameters, data.model_size,
                 data.total_training_modes, data.total_flops)
    LitSummary.summarize(*arguments, header_style="bold")
    theirs = capsys.readouterr().out
    RichModelSummary.summarize(*arguments, header_style="bold")
    assert capsys.readouterr().out == theirs and "Total FLOPs: 512" in theirs


def test_rich_model_summary_prints_at_fit_start(capsys: pytest.CaptureFixture[str]):
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, callbacks=[RichModelSummary()],
            **{**QUIET, "enable_model_summary": True}).fit(Ours())
    out = capsys.readouterr().out
    assert "┃ Name  ┃ Type   ┃ Params ┃" in out and "Total params: 66" in out


def test_summary_options_are_checked():
    with pytest.raises(TypeError, match="header_colour"):
        RichModelSummary(header_colour="red")
    with pytest.raises(TypeError, match="header_style"):
        ModelSummary(header_style="red")  # only the rich table has a header style


def test_without_rich_the_error_names_the_package(monkeypatch: pytest.MonkeyPatch):
    import sys

    monkeypatch.setitem(sys.modules, "rich", None)  # import rich now fails, as where it is not installed
    with pytest.raises(ModuleNotFoundError, match="`RichProgressBar` needs the `rich` package"):
        RichProgressBar()
    with pytest.raises(ModuleNotFoundError, match="`RichModelSummary` needs the `rich` package"):
        RichModelSummary()


def _draw_on_a_rank(rank: int) -> tuple[str, list[Any], list[str]]:
    out = io.StringIO()
    bar = RichProgressBar(refresh_rate=10**9, console_kwargs={"file": out, "force_terminal": True, "width": 200})
    trainer = Trainer(callbacks=[bar], **{**BAR, **RUN, "strategy": "ddp", "devices": 2, "max_epochs": 1})
    trainer.fit(Ours())
    return out.getvalue(), [] if bar.progress is None else _tasks(bar), bar.metrics_texts()


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_on_two_ranks_only_rank_zero_draws():
    from tests.helpers.dist import run_distributed

    (zero_out, zero_tasks, zero_metrics), (one_out, one_tasks, one_metrics) = run_distributed(_draw_on_a_rank)
    assert "Epoch 0/0 " in zero_out and ("Epoch 0/0 ", 4, 4, True) in zero_tasks  # each rank has 4 batches of 8
    assert zero_metrics[0] == "step: 3.000"
    assert (one_out, one_tasks, one_metrics) == ("", [], [])



class _PickleTheBar(Callback):
    """Pickles the bar in the middle of a fit, as ddp_spawn pickles the callbacks it sends to its processes."""

    def __init__(self, bar: RichProgressBar) -> None:
        self.bar, self.copies = bar, []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        import pickle

        state = {k: v for k, v in self.bar.__getstate__().items() if k != "_trainer"}
        self.copies.append(pickle.loads(pickle.dumps(state)))


def test_the_bar_pickles_while_drawing():
    bar = RichProgressBar(console_kwargs={"file": io.StringIO(), "force_terminal": True})
    spy = _PickleTheBar(bar)
    Trainer(max_steps=1, limit_val_batches=0, callbacks=[bar, spy], **BAR).fit(Ours())
    assert spy.copies[0]["progress"] is None and bar.progress is not None  # rich's Progress holds locks
