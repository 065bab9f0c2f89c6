"""ModelSummary with Lightning 2.6 as the oracle: for the same model, our table (rows, columns) and totals equal
those of Lightning's `summarize`, at every depth, with and without `example_input_array` (In/Out sizes, FLOPs), with
frozen and eval-mode layers and parameters outside any layer; and inside a fit, under the run's precision."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

from callbacks import ModelSummary
from callbacks.model_summary import human_count, summarize, summary_of
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, TrainModule


def _parse(text: str) -> tuple[list[list[str]], list[tuple[str, str]]]:
    """A summary's text as (rows of cells, header first; totals as (value, label))."""
    lines = text.strip("\n").splitlines()
    rules = [i for i, line in enumerate(lines) if set(line) == {"-"}]
    table = [[cell.strip() for cell in line.split(" | ")] for line in lines[:rules[-1]] if set(line) != {"-"}]
    totals = [(line[:10].strip(), line[10:]) for line in lines[rules[-1] + 1:]]
    return table, totals


class _Net:
    """Layers of every kind the summary distinguishes (nested, frozen, eval mode, a bare parameter)."""

    def build(self, example: Any) -> None:
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.Sequential(nn.Linear(64, 3), nn.ReLU()))
        self.head = nn.Linear(3, 2)
        self.head.requires_grad_(False)
        self.head.eval()
        self.unused = nn.Linear(2, 2)
        self.scale = nn.Parameter(torch.ones(1))
        if example is not None:
            self.example_input_array = example

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        out = self.head(self.net(x)) * self.scale
        return out if y is None else out + y.sum()


class Ours(_Net, TrainModule):
    def __init__(self, example: Any = None) -> None:
        super().__init__()
        self.build(example)


def _lightning(example: Any) -> Any:
    pl = pytest.importorskip("lightning.pytorch")

    class Lit(_Net, pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.build(example)

    return Lit()


EXAMPLES = {"none": None, "tensor": torch.zeros(4, 32), "tuple": (torch.zeros(4, 32), torch.ones(2)),
            "dict": {"x": torch.zeros(4, 32), "y": torch.ones(3)}}


@pytest.mark.parametrize("depth", [1, 2, 3, -1, 0])
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_table_and_totals_equal_lightnings(depth: int, example: str):
    pytest.importorskip("lightning.pytorch", reason="Lightning (the [dev] extra) is not installed")
    from lightning.pytorch.utilities.model_summary import summarize as lightning_summarize

    theirs = str(lightning_summarize(_lightning(EXAMPLES[example]), max_depth=depth))
    model = Ours(EXAMPLES[example])
    ours = summarize(model, depth, model.example_input_array)
    assert _parse(ours) == _parse(theirs)
    assert ours == theirs  # the layout too, character for character


def test_the_example_forward_leaves_modes_and_gradients_alone():
    model = Ours(torch.zeros(4, 32))
    data = summary_of(model, -1, model.example_input_array)
    assert model.training and not model.head.training and model.net[1].running_mean.abs().sum() == 0
    assert dict(data.columns)["In sizes"][:2] == ["[4, 32]", "[4, 32]"] and "?" in dict(data.columns)["In sizes"]
    assert all(p.grad is None for p in model.parameters())


def test_model_size_follows_the_parameters_dtype():
    model = Ours().double()
    assert summary_of(model).model_size == pytest.approx(sum(p.numel() for p in model.parameters()) * 8 / 1e6)


@pytest.mark.parametrize("precision", ["32-true", "64-true", "bf16-true"])
def test_the_summary_printed_at_fit_start_equals_lightnings(precision: str, capsys: pytest.CaptureFixture[str],
                                                            caplog: pytest.LogCaptureFixture):
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader

    from tests.helpers.boring import RandomDataset

    dtype = {"32-true": torch.float32, "64-true": torch.float64, "bf16-true": torch.bfloat16}[precision]

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(32, 2)
            self.example_input_array = torch.zeros(4, 32, dtype=dtype)  # Lightning does not cast it

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self(batch).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    from lightning.pytorch.callbacks import ModelSummary as LitSummary  # with rich installed, Lightning's default
                                                                         # would be its RichModelSummary
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.callbacks.model_summary"):
        pl.Trainer(max_steps=1, precision=precision, callbacks=[LitSummary()], logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, accelerator="cpu", devices=1).fit(
            Lit(), DataLoader(RandomDataset(32, 8), batch_size=4))
    theirs = next(r.getMessage() for r in caplog.records if "Total params" in r.getMessage())
    model = BoringModel()
    model.example_input_array = torch.zeros(4, 32)  # float32: cast to the run's precision here
    capsys.readouterr()
    Trainer(max_steps=1, precision=precision, callbacks=[ModelSummary()], **{**QUIET, "enable_model_summary": True,
                                                                              "num_sanity_val_steps": 0}).fit(model)
    ours = capsys.readouterr().out
    assert _parse(ours) == _parse(theirs)


def test_max_depth_zero_prints_nothing_and_a_bad_depth_is_refused(capsys: pytest.CaptureFixture[str]):
    Trainer(max_steps=1, callbacks=[ModelSummary(max_depth=0)], **{**QUIET, "enable_model_summary": True}).fit(
        BoringModel())
    assert "Total params" not in capsys.readouterr().out
    with pytest.raises(ValueError, match="max_depth=-2"):
        summary_of(BoringModel(), -2)


@pytest.mark.parametrize("number", [0, 7, 66, 999, 1000, 1234, 99_999, 100_000, 2_000_000, 3e9, 4e14, 5e15])
def test_counts_are_written_as_lightning_writes_them(number: float):
    model_summary = pytest.importorskip("lightning.pytorch.utilities.model_summary")
    assert human_count(number) == model_summary.get_human_readable_count(number)
