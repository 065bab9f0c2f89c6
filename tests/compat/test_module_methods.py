"""The TrainModule methods and properties a user calls, with Lightning's meaning: `logger`, `loggers`, `on_gpu`,
`dtype`, `print` (rank 0 only), `all_gather`, `freeze` / `unfreeze`, `example_input_array`, `to_onnx`, the refused
exports; and `Trainer.model`, the rank-zero helpers, `DataModule.from_datasets` and `DataModule.name`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from tests.helpers.dist import run_distributed
from trainer import DataModule, Trainer


class Seen(BoringModel):
    """Records what a property returns while fit runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}

    def on_train_start(self) -> None:
        self.seen.update(logger=self.logger, loggers=self.loggers, on_gpu=self.on_gpu, dtype=self.dtype,
                         model=self.trainer.model)


def test_logger_and_loggers_are_the_trainers(tmp_path: Path):
    from trainer.loggers import CSVLogger

    first, second = CSVLogger(tmp_path / "a"), CSVLogger(tmp_path / "b")
    model = Seen()
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **{**QUIET, "logger": [first, second]}).fit(model)
    assert model.seen["logger"] is first and model.seen["loggers"] == [first, second]


def test_logger_without_a_trainer_is_none():
    assert BoringModel().logger is None and BoringModel().loggers == []


def test_on_gpu_is_false_on_cpu():
    model = Seen()
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(model)
    assert model.seen["on_gpu"] is False


def test_dtype_follows_the_parameters():
    model = Seen()
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, precision="64-true", **QUIET).fit(model)
    assert model.seen["dtype"] == torch.float64 and BoringModel().dtype == torch.float32


def test_trainer_model_is_the_module_on_one_device():
    model = Seen()
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(model)
    assert model.seen["model"] is model


def test_print_prints_on_rank_zero(capsys: pytest.CaptureFixture[str]):
    class Prints(BoringModel):
        def on_train_start(self) -> None:
            self.print("hello", 42)

    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(Prints())
    assert "hello 42" in capsys.readouterr().out


def test_all_gather_with_one_process_adds_no_dimension():
    class Gathers(BoringModel):
        def on_train_start(self) -> None:
            self.gathered = self.all_gather({"t": torch.ones(3), "n": 2.0})

    model = Gathers()
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(model)
    assert model.gathered["t"].shape == (3,) and float(model.gathered["n"]) == 2.0


def test_all_gather_refuses_another_group():
    class Gathers(BoringModel):
        def on_train_start(self) -> None:
            self.all_gather(torch.ones(1), group=object())

    with pytest.raises(MisconfigurationError, match="group"):
        Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(Gathers())


class GathersOnRanks(BoringModel):
    def on_train_start(self) -> None:
        value = torch.full((2,), float(self.global_rank), requires_grad=True)
        gathered = self.all_gather(value, sync_grads=True)
        gathered.sum().backward()
        self.result = (tuple(gathered.shape), gathered[:, 0].tolist(), value.grad.tolist(),
                       type(self.trainer.model).__name__)
        self.print(f"printed by rank {self.global_rank}")


def _gather_rank(rank: int) -> Any:
    model = GathersOnRanks()
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, strategy="ddp",
            **{**QUIET, "devices": 2}).fit(model)
    return model.result


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_all_gather_on_two_ranks_stacks_by_rank_and_passes_gradients_back(capfd: pytest.CaptureFixture[str]):
    results = run_distributed(_gather_rank)
    assert results[0][:2] == results[1][:2] == ((2, 2), [0.0, 1.0])
    assert results[0][2] == [2.0, 2.0]  # the gradient of a sum over both ranks' copies, summed back (sync_grads)
    assert results[0][3] == "DistributedDataParallel"  # Trainer.model is the wrapped module
    out = capfd.readouterr().out
    assert "printed by rank 0" in out and "printed by rank 1" not in out


def test_freeze_and_unfreeze():
    model = BoringModel()
    model.freeze()
    frozen = (not model.training, [p.requires_grad for p in model.parameters()])
    model.unfreeze()
    assert frozen == (True, [False, False]) and model.training and all(p.requires_grad for p in model.parameters())


def test_example_input_array_is_a_settable_property():
    model = BoringModel()
    assert model.example_input_array is None
    model.example_input_array = torch.zeros(2, 32)
    assert model.example_input_array.shape == (2, 32)


def test_example_input_array_adds_layer_sizes_to_the_model_summary(capsys: pytest.CaptureFixture[str]):
    model = BoringModel()
    model.example_input_array = torch.zeros(4, 32)
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0,
            **{**QUIET, "enable_model_summary": True}).fit(model)
    table = capsys.readouterr().out
    assert "In sizes" in table and "| [4, 32]  | [4, 2]" in table and model.training


def test_to_onnx_exports_with_the_example_input(tmp_path: Path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    model = BoringModel()
    model.example_input_array = torch.zeros(4, 32)
    model.to_onnx(tmp_path / "model.onnx")
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    assert len(graph.input) == 1 and model.training


def test_to_onnx_without_an_input_names_the_fix():
    pytest.importorskip("onnx")
    with pytest.raises(MisconfigurationError, match="example_input_array"):
        BoringModel().to_onnx("unused.onnx")


def test_to_onnx_names_the_missing_package(monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a))
    with pytest.raises(MisconfigurationError, match="pip install onnx"):
        BoringModel().to_onnx("unused.onnx", torch.zeros(1, 32))


@pytest.mark.parametrize(("method", "match"), [("to_torchscript", "torch.export"), ("to_tensorrt", "torch_tensorrt")])
def test_refused_exports_say_what_to_use(method: str, match: str):
    with pytest.raises(MisconfigurationError, match=match):
        getattr(BoringModel(), method)()


@pytest.mark.parametrize("name", ["fabric"])
def test_refused_properties_are_not_there(name: str):
    with pytest.raises(AttributeError, match=name):
        getattr(BoringModel(), name)


class MeshSeen(BoringModel):
    def configure_model(self) -> None:
        mesh = self.device_mesh
        self.mesh_seen = None if mesh is None else (mesh.mesh_dim_names, tuple(mesh.shape))


def _mesh_rank(rank: int) -> Any:
    from strategies import ModelParallelStrategy

    model = MeshSeen()
    Trainer(max_steps=1, **{**QUIET, "strategy": ModelParallelStrategy()}).fit(model)
    return model.mesh_seen


@pytest.mark.timeout(60)
def test_device_mesh_is_the_model_parallel_mesh_in_configure_model_and_none_elsewhere():
    """Lightning's `device_mesh`: ModelParallelStrategy's (data_parallel, tensor_parallel) mesh, None otherwise."""
    assert BoringModel().device_mesh is None
    plain = MeshSeen()
    Trainer(max_steps=1, **QUIET).fit(plain)
    assert plain.mesh_seen is None
    assert run_distributed(_mesh_rank, world_size=1) == [(("data_parallel", "tensor_parallel"), (1, 1))]


def test_rank_zero_helpers_are_importable_from_trainer(caplog: pytest.LogCaptureFixture,
                                                       capsys: pytest.CaptureFixture[str]):
    import logging

    from trainer import rank_zero_debug, rank_zero_info, rank_zero_warn

    rank_zero_info("an info")
    with pytest.warns(UserWarning, match="a warning"):
        rank_zero_warn("a warning")
    with caplog.at_level(logging.DEBUG, logger="trainer"):
        rank_zero_debug("a debug line")
    assert "an info" in capsys.readouterr().out and "a debug line" in caplog.text


def test_rank_zero_helpers_are_importable_from_trainer_rank_zero():
    import trainer
    import trainer.rank_zero as rank_zero

    assert all(getattr(rank_zero, name) is getattr(trainer, name) for name in rank_zero.__all__)


def test_datamodule_from_datasets_builds_the_loaders():
    data = DataModule.from_datasets(RandomDataset(32, 16), [RandomDataset(32, 8), RandomDataset(32, 4)],
                                    batch_size=4)
    class TakesLoaderIndex(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            return None

    trainer = Trainer(max_epochs=1, **QUIET)
    model = TakesLoaderIndex()
    trainer.fit(model, datamodule=data)
    assert model.global_step == 4 and trainer.num_val_batches == [2, 1]


def test_datamodule_name_defaults_to_none():
    class Named(DataModule):
        name = "digits"

    assert DataModule().name is None and Named().name == "digits"


def test_trainer_model_before_a_run_is_the_attached_module():
    assert Trainer(**QUIET).model is None


