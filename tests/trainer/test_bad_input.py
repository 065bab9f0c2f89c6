"""Bad input fails early (at Trainer(...) or at the start of fit) with a message naming the fix."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, TrainModule
from trainer.exceptions import ConfigError, MisconfigurationError


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"accelerator": "tpu"}, r"accelerator='tpu'.*Accepted values: auto, cpu, gpu, cuda, mps"),
        ({"strategy": "ddpp"}, r"strategy='ddpp' is not a known strategy. Accepted values: 'auto', 'ddp', "
                               r"'ddp_find_unused_parameters_false', .*'ddp_spawn', .*'dp', .*'single'"),
        ({"precision": "17"}, r"precision='17' is not a known precision. Accepted values: .*'32-true'"),
        ({"precision": 17}, r"precision=17 is not a known precision"),
        ({"devices": 0}, r"devices=0 is not valid: it must be an int >= 1"),
        ({"devices": -3}, r"devices=-3 is not valid: it must be an int >= 1"),
        ({"max_epochs": -2}, r"max_epochs=-2 is not valid: it must be an int >= -1 \(-1 means no limit\)"),
        ({"limit_train_batches": 1.5}, r"limit_train_batches=1.5 is not valid: a float must be in \[0.0, 1.0\]"),
        ({"limit_val_batches": -1}, r"limit_val_batches=-1 is not valid: an int must be >= 0"),
        ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches=0 is not valid"),
        ({"gradient_clip_algorithm": "l3"}, r"gradient_clip_algorithm='l3' is not valid: use 'norm' or 'value'"),
        ({"val_check_interval": 1.5}, r"val_check_interval=1.5 is not valid"),
        ({"max_time": "ten minutes"}, r"max_time='ten minutes' is not valid: use a string in the format DD:HH:MM:SS"),
        ({"deterministic": "yes"}, r"deterministic='yes' is not valid"),
        ({"agree_every_n_steps": 0}, r"agree_every_n_steps=0 is not valid: it must be an int >= 1"),
    ],
)
def test_bad_flags_raise_config_error_at_construction(kwargs: dict, match: str):
    with pytest.raises(ConfigError, match=match):
        Trainer(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_gpu_without_cuda_names_what_is_missing():
    needs_cuda = r"accelerator=.gpu. \(or gpus=N\) needs a CUDA GPU.*accelerator=.cpu., devices=N"
    with pytest.raises(ConfigError, match=needs_cuda):
        Trainer(accelerator="gpu")
    with pytest.raises(ConfigError, match=r"needs a CUDA GPU"):
        Trainer(gpus=1)


def test_single_strategy_refuses_several_devices():
    with pytest.raises(ConfigError, match=r"strategy='single' runs on exactly one device"):
        Trainer(accelerator="cpu", devices=2, strategy="single")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_dp_without_cuda_points_at_ddp_on_cpu():
    with pytest.raises(ConfigError, match=r"strategy='dp' .* needs CUDA GPUs.*strategy='ddp' with accelerator='cpu'"):
        Trainer(strategy="dp")


class NoTrainingStep(TrainModule):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class NoOptimizers(BoringModel):
    configure_optimizers = TrainModule.configure_optimizers


def test_module_without_training_step():
    with pytest.raises(MisconfigurationError, match=r"NoTrainingStep must define training_step\(batch, batch_idx\)"):
        Trainer(max_epochs=1, **QUIET).fit(NoTrainingStep(), BoringModel().train_dataloader())


def test_module_without_configure_optimizers():
    with pytest.raises(MisconfigurationError, match=r"NoOptimizers must define configure_optimizers\(\)"):
        Trainer(max_epochs=1, **QUIET).fit(NoOptimizers())


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        ("adam", r"returned str: unsupported type"),
        ({"optim": 1}, r"a dict must hold an Optimizer under 'optimizer'"),
        ([1, 2], r"a list must hold only Optimizers or only optimizer dicts"),
    ],
)
def test_configure_optimizers_with_unsupported_return(returned: Any, match: str):
    class Bad(BoringModel):
        def configure_optimizers(self) -> Any:
            return returned

    with pytest.raises(MisconfigurationError, match=match) as info:
        Trainer(max_epochs=1, **QUIET).fit(Bad())
    assert "Accepted return values: an Optimizer" in str(info.value)


def test_bad_scheduler_interval():
    class Bad(BoringModel):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.StepLR(opt, 1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "batch"}}

    with pytest.raises(MisconfigurationError, match=r"scheduler interval 'batch' must be 'epoch' or 'step'"):
        Trainer(max_epochs=1, **QUIET).fit(Bad())


@pytest.mark.parametrize(
    ("output", "match"),
    [
        ("vector", r"training_step returned a loss tensor of shape \(8, 2\); it must be a scalar"),
        ("dict", r"training_step returned a dict without a 'loss' key \(keys: \['value'\]\)"),
        ("string", r"training_step returned str; return a scalar loss tensor, a dict with a 'loss' tensor, or None"),
        ("detached", r"training_step returned a loss that does not require grad"),
    ],
)
def test_training_step_with_bad_output(output: str, match: str):
    class Bad(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = self(batch)
            return {"vector": out, "dict": {"value": out.sum()}, "string": "loss",
                    "detached": out.sum().detach()}[output]

    with pytest.raises(MisconfigurationError, match=match):
        Trainer(max_epochs=1, **QUIET).fit(Bad())


def test_fit_without_data():
    class NoData(BoringModel):
        train_dataloader = TrainModule.train_dataloader

    with pytest.raises(MisconfigurationError, match=r"fit\(\) found no training data"):
        Trainer(max_epochs=1, **QUIET).fit(NoData())


def test_fit_with_something_that_is_not_a_train_module():
    with pytest.raises(MisconfigurationError, match=r"fit\(\) needs a TrainModule, got Linear"):
        Trainer(max_epochs=1, **QUIET).fit(torch.nn.Linear(2, 2))


def test_two_optimizers_need_manual_optimization():
    class Two(BoringModel):
        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]

    with pytest.raises(MisconfigurationError, match=r"automatic optimization supports one"):
        Trainer(max_epochs=1, **QUIET).fit(Two())


_BOOL_FLAGS = [name for name, p in inspect.signature(Trainer.__init__).parameters.items()
               if p.annotation in ("bool", "bool | None")]
_NONE_ALLOWED = {name for name, p in inspect.signature(Trainer.__init__).parameters.items()
                 if p.annotation == "bool | None"}  # None means the default (Lightning's signature takes it)


def test_the_bool_flags_are_found():
    assert {"use_distributed_sampler", "enable_checkpointing", "checkpoint_on_interrupt"} <= set(_BOOL_FLAGS)


@pytest.mark.parametrize("name", _BOOL_FLAGS)
@pytest.mark.parametrize("value", ["false", "True", 1, None])
def test_every_bool_flag_refuses_what_is_not_a_bool(name: str, value: Any):
    """bool('false') is True: a string from a config would silently mean the opposite of what it says."""
    if value is None and name in _NONE_ALLOWED:
        pytest.skip(f"{name}=None means its default, as in Lightning")
    with pytest.raises(ConfigError, match=rf"^{name}={value!r} is not valid: use True or False\."):
        Trainer(**{name: value})


def test_a_string_bool_names_the_fix():
    with pytest.raises(ConfigError, match=r"use_distributed_sampler='false' .*bool\('false'\) is True.*unquoted"):
        Trainer(use_distributed_sampler="false")


@pytest.mark.parametrize("value", [123, 1.5, ["runs"], b"runs"])
def test_default_root_dir_refuses_what_is_not_a_path(value: Any):
    with pytest.raises(ConfigError, match=rf"default_root_dir={re.escape(repr(value))} is not valid: use a path"):
        Trainer(default_root_dir=value)


def test_default_root_dir_takes_str_and_pathlike(tmp_path: Any):
    assert Trainer(default_root_dir=str(tmp_path), **QUIET).default_root_dir == str(tmp_path)
    assert Trainer(default_root_dir=tmp_path, **QUIET).default_root_dir == str(tmp_path)
