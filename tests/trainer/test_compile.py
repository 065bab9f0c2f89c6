"""`fit/validate/test/predict(torch.compile(module))` on one CPU device: the module trains with its forward compiled by
the user's own compile context (inductor here), ends with the eager run's weights, compiles once per mode instead of
once per step, and saves checkpoints with the plain module's keys."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.model.compiled import compile_forward, restore_forward, unwrap_compiled
from tests.helpers.boring import QUIET
from tests.helpers.runif import run_if
from trainer import Trainer, TrainModule, seed_everything
from trainer.exceptions import MisconfigurationError

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                       reason="inductor on CPU needs a C++ compiler"),
]


class Net(TrainModule):
    """Its forward is the tensor work; the step methods log, as a real module does."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        self.steps += 1
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def _loader(n: int = 64, batch_size: int = 8) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=gen)
    return DataLoader(TensorDataset(x, x[:, :1] - 0.5 * x[:, 1:2]), batch_size=batch_size)


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Graph counts start from an empty dynamo cache (it is per function, shared by every compile of `Net`)."""
    torch._dynamo.reset()


def _counter(backend: str = "inductor") -> Any:
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend(backend)


def _fit(model: Any, ckpt_path: Path | None = None, **flags: Any) -> Trainer:
    trainer = Trainer(**{**QUIET, "max_epochs": 3, "val_check_interval": 0.5, **flags})
    trainer.fit(model, _loader(), _loader(32), ckpt_path=ckpt_path)
    return trainer


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    """One eager and one inductor-compiled fit of the same module (3 epochs, validation twice per epoch)."""
    seed_everything(0)
    eager = Net()
    eager_trainer = _fit(eager)
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    seed_everything(0)
    module, counter = Net(), _counter()
    with inductor_config.patch(compile_threads=1):  # two small graphs: a pool of compile workers costs more
        compiled_trainer = _fit(torch.compile(module, backend=counter))
    return {"eager": eager, "eager_trainer": eager_trainer, "module": module, "counter": counter,
            "trainer": compiled_trainer}


def test_compiled_fit_ends_with_the_eager_weights(runs: dict[str, Any]):
    eager, compiled = _weights(runs["eager"]), _weights(runs["module"])
    for key, value in eager.items():
        torch.testing.assert_close(compiled[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_the_user_compile_context_compiles_the_forward(runs: dict[str, Any]):
    assert runs["counter"].frame_count > 0  # the user's backend (here a counting one around inductor) was used


def test_no_recompilation_per_step(runs: dict[str, Any]):
    # 24 training steps, 6 validations and the sanity check: one graph for training, one for validation (no_grad,
    # eval mode), not one per step or per switch between them
    assert runs["counter"].frame_count <= 2


def test_a_short_last_batch_recompiles_once_per_mode():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    trainer = Trainer(**{**QUIET, "max_epochs": 3, "val_check_interval": 0.5})
    trainer.fit(torch.compile(Net(), backend=counter), _loader(60), _loader(30))  # last batches of 4 and 6
    assert counter.frame_count == 4  # train and validation, each static and then with a dynamic batch size


def test_step_hooks_still_run_and_log(runs: dict[str, Any]):
    module, trainer = runs["module"], runs["trainer"]
    assert (module.steps, sorted(trainer.callback_metrics)) == (24, ["train_loss", "val_loss"])


def test_the_module_is_left_as_given(runs: dict[str, Any]):
    assert "forward" not in vars(runs["module"])  # the compiled forward was taken off when the run ended


def test_validate_test_predict_accept_a_compiled_module(runs: dict[str, Any]):
    eager, module = runs["eager"], runs["module"]
    counter = _counter()
    trainer = Trainer(**QUIET)
    compiled = torch.compile(module, backend=counter)
    got = (trainer.validate(compiled, _loader(32), verbose=False), trainer.test(compiled, _loader(32), verbose=False),
           torch.cat(trainer.predict(compiled, _loader(32))))
    plain = Trainer(**QUIET)
    want = (plain.validate(eager, _loader(32), verbose=False), plain.test(eager, _loader(32), verbose=False),
            torch.cat(plain.predict(eager, _loader(32))))
    assert counter.frame_count > 0
    assert [r["val_loss"] for r in got[0]] == pytest.approx([r["val_loss"] for r in want[0]], rel=1e-4)
    assert [r["test_loss"] for r in got[1]] == pytest.approx([r["test_loss"] for r in want[1]], rel=1e-4)
    torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5)


def test_a_run_without_a_model_keeps_the_compilation(tmp_path: Path):
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    trainer = Trainer(**{**QUIET, "max_epochs": 1, "enable_checkpointing": True, "default_root_dir": tmp_path})
    trainer.fit(torch.compile(Net(), backend=counter), _loader(), _loader(32))
    after_fit = counter.frame_count
    trainer.validate(dataloaders=_loader(32), ckpt_path="best", verbose=False)  # the fit's module
    assert counter.frame_count == after_fit + 1  # compiled again: a graph for inference_mode


def test_compile_arguments_are_kept():
    class Breaks(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch._dynamo.graph_break()
            return self.net(x)

    with pytest.raises(Exception, match="graph_break"):  # fullgraph=True refuses the graph break, as torch does
        _fit(torch.compile(Breaks(), backend="eager", fullgraph=True), max_epochs=1)


def test_checkpoint_of_a_compiled_module_has_the_plain_keys(tmp_path: Path):
    seed_everything(0)
    module = Net()
    trainer = _fit(torch.compile(module, backend="eager"), max_epochs=1)
    trainer.save_checkpoint(tmp_path / "compiled.ckpt")
    saved = torch.load(tmp_path / "compiled.ckpt", weights_only=True)["state_dict"]
    assert sorted(saved) == sorted(Net().state_dict())


def test_checkpoints_move_between_compiled_and_uncompiled_modules(tmp_path: Path):
    seed_everything(0)
    compiled_run = _fit(torch.compile(Net(), backend="eager"), max_epochs=1)
    compiled_run.save_checkpoint(tmp_path / "compiled.ckpt")
    plain = Net.load_from_checkpoint(tmp_path / "compiled.ckpt")  # into an uncompiled module
    seed_everything(0)
    plain_run = _fit(Net(), max_epochs=1)
    plain_run.save_checkpoint(tmp_path / "plain.ckpt")
    resumed = Net()  # and an uncompiled module's checkpoint resumes a compiled fit
    _fit(torch.compile(resumed, backend="eager"), max_epochs=2, ckpt_path=tmp_path / "plain.ckpt")
    seed_everything(0)
    straight = Net()
    _fit(straight, max_epochs=2)
    for key, value in _weights(straight).items():
        torch.testing.assert_close(_weights(resumed)[key], value, rtol=1e-4, atol=1e-5, msg=key)
    for key, value in _weights(compiled_run.lightning_module).items():
        torch.testing.assert_close(_weights(plain)[key], value, rtol=0, atol=0, msg=key)


def test_a_compiled_module_that_is_not_a_train_module_is_refused():
    with pytest.raises(MisconfigurationError, match="needs a TrainModule.*Linear inside torch.compile"):
        Trainer(**QUIET).fit(torch.compile(nn.Linear(8, 1)), _loader())


def test_a_deep_copy_runs_its_own_compiled_forward():
    module = Net()
    compile_forward(module, torch.compile(nn.Identity(), backend="eager").dynamo_ctx)
    twin = copy.deepcopy(module)  # what an averaged model does
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    x = torch.randn(2, 8)
    assert (torch.count_nonzero(twin(x)), torch.count_nonzero(module(x)) > 0) == (0, True)
    restore_forward(module)
    assert "forward" not in vars(module)


def test_unwrap_leaves_other_objects_alone():
    module = Net()
    assert unwrap_compiled(module) == (module, None)


@run_if(min_cuda_gpus=1)
@pytest.mark.gpu
def test_dataparallel_refuses_a_compiled_module():
    from trainer.exceptions import ConfigError

    with pytest.raises(ConfigError, match="strategy='dp'"):
        Trainer(**{**QUIET, "accelerator": "gpu", "strategy": "dp"}).fit(torch.compile(Net()), _loader())
