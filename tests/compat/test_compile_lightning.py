"""`trainer.fit(torch.compile(module))` beside Lightning 2.x (the oracle, when installed): both accept the compiled
module, end with the same weights, log the same values and save checkpoints with the same (plain) keys; the compiled
module stays usable afterwards. Skipped without Lightning."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
          "enable_model_summary": False, "accelerator": "cpu", "devices": 1}


class _Body:
    """The module body, mixed into either framework's module class."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _loader() -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=gen)
    return DataLoader(TensorDataset(x, x[:, :1] - x[:, 1:2]), batch_size=8)


def _run(name: str, folder: Path) -> dict[str, Any]:
    if name == "lightning":
        pl = pytest.importorskip("lightning.pytorch")
        module_base, trainer_cls = pl.LightningModule, pl.Trainer
    else:
        import trainer

        module_base, trainer_cls = trainer.TrainModule, trainer.Trainer
    module = type("Net", (_Body, module_base), {})()
    compiled = torch.compile(module, backend="aot_eager")
    run = trainer_cls(max_epochs=2, **_QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.fit(compiled, _loader(), _loader())
    run.save_checkpoint(folder / f"{name}.ckpt")
    saved = torch.load(folder / f"{name}.ckpt", weights_only=False)["state_dict"]
    return {"weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
            "metrics": {k: float(v) for k, v in run.callback_metrics.items()},
            "keys": sorted(saved), "after": compiled(torch.ones(2, 8)).detach()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("compile")
    return {name: _run(name, folder) for name in ("lightning", "ours")}


def test_weights_after_a_compiled_fit_match_lightning(runs: dict[str, Any]):
    for key, value in runs["lightning"]["weights"].items():
        torch.testing.assert_close(runs["ours"]["weights"][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_logged_values_match_lightning(runs: dict[str, Any]):
    assert runs["ours"]["metrics"] == pytest.approx(runs["lightning"]["metrics"], rel=1e-5)


def test_checkpoint_keys_match_lightning(runs: dict[str, Any]):
    assert runs["ours"]["keys"] == runs["lightning"]["keys"] == ["net.0.bias", "net.0.weight", "net.2.bias",
                                                                 "net.2.weight"]


def test_the_compiled_module_still_runs_after_fit(runs: dict[str, Any]):
    torch.testing.assert_close(runs["ours"]["after"], runs["lightning"]["after"], rtol=1e-5, atol=1e-6)
