"""Every Lightning Callback hook is called with `(trainer, pl_module, ...)` and the arguments Lightning's docs give
it; `state_key`, `state_dict` and `load_state_dict` carry a callback's state through checkpoints. One recorded run
(fit with validation, a checkpoint, a resumed fit, validate, test, predict, and a failing fit for on_exception)
serves every hook's test. The order of the hooks is tests/trainer/test_hook_order.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import Callback
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, TrainModule
from trainer.setup.lightning_names import CALLBACK_NAMES, HOOK, SUPPORTED

CALLBACK_HOOKS = sorted(n for n, e in CALLBACK_NAMES.items()
                        if e.kind == HOOK and e.status == SUPPORTED and n not in ("state_dict", "load_state_dict"))


def _recording(name: str) -> Any:
    def hook(self: Any, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        assert isinstance(trainer, Trainer) and isinstance(pl_module, TrainModule)
        self.calls.setdefault(name, []).append((*args, *kwargs.values()))
        self.keywords.setdefault(name, []).append(tuple(kwargs))

    return hook


class Recorder(Callback):
    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[Any, ...]]] = {}
        self.keywords: dict[str, list[tuple[str, ...]]] = {}  # the names of the arguments passed by keyword
        self.loaded: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"hooks_seen": len(self.calls)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loaded = dict(state_dict)


for _name in CALLBACK_HOOKS:
    setattr(Recorder, _name, _recording(_name))


class FailsInStep(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        raise ValueError("stop here")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorder:
    folder: Path = tmp_path_factory.mktemp("callback_hooks")
    recorder = Recorder()
    model = BoringModel()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2, **{**QUIET, "callbacks": [recorder]})
    trainer.fit(model)
    trainer.save_checkpoint(folder / "saved.ckpt")
    resumed = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=2, **{**QUIET, "callbacks": [recorder]})
    resumed.fit(model, ckpt_path=folder / "saved.ckpt")
    for entry in ("validate", "test", "predict"):
        getattr(trainer, entry)(model)
    with pytest.raises(ValueError, match="stop here"):
        Trainer(max_epochs=1, **{**QUIET, "callbacks": [recorder]}).fit(FailsInStep())
    return recorder


_ARGS: dict[str, Any] = {
    "setup": lambda a: a[0] in ("fit", "validate", "test", "predict"),
    "teardown": lambda a: a[0] in ("fit", "validate", "test", "predict"),
    "on_exception": lambda a: isinstance(a[0], ValueError),
    "on_save_checkpoint": lambda a: isinstance(a[0], dict),
    "on_load_checkpoint": lambda a: isinstance(a[0], dict),
    "on_before_backward": lambda a: isinstance(a[0], torch.Tensor),
    "on_before_optimizer_step": lambda a: isinstance(a[0], torch.optim.Optimizer),
    "on_before_zero_grad": lambda a: isinstance(a[0], torch.optim.Optimizer),
    "on_train_batch_start": lambda a: len(a) == 2,
    "on_train_batch_end": lambda a: len(a) == 3 and "loss" in a[0],
}


@pytest.mark.parametrize("name", CALLBACK_HOOKS)
def test_callback_hook_is_called_with_lightnings_arguments(name: str, recorded: Recorder):
    assert name in recorded.calls, f"{name} was never called"
    check = _ARGS.get(name)
    assert check is None or all(check(args) for args in recorded.calls[name])


@pytest.mark.parametrize("name", ["setup", "teardown"])
def test_setup_and_teardown_get_the_stage_by_keyword(name: str, recorded: Recorder):
    """Lightning calls `setup(trainer, pl_module, stage=...)`: a callback whose third parameter has another name
    fails there, and so here."""
    assert set(recorded.keywords[name]) == {("stage",)}


def test_callback_state_dict_goes_through_the_checkpoint_under_its_state_key(recorded: Recorder):
    assert recorded.state_key == "Recorder" and recorded.loaded["hooks_seen"] > 0
