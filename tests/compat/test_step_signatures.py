"""Step methods called by their signature, as Lightning does: `training_step(self, batch)` without `batch_idx`;
`validation_step`, `test_step` and `predict_step` with or without `batch_idx`; `dataloader_idx` passed with several
loaders only, where the step and its batch hooks must take it. The signatures are read once per run."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pytest
from torch.utils.data import DataLoader

import trainer.setup.step_signature as step_signature
from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import Trainer


class BatchOnly(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []

    def training_step(self, batch: Any) -> Any:  # no batch_idx
        self.steps.append("training_step")
        return self(batch).sum()

    def validation_step(self, batch: Any) -> None:
        self.steps.append("validation_step")

    def test_step(self, batch: Any) -> None:
        self.steps.append("test_step")

    def predict_step(self, batch: Any) -> Any:
        self.steps.append("predict_step")
        return self(batch)


def test_training_step_without_batch_idx():
    model = BatchOnly()
    Trainer(max_epochs=1, limit_val_batches=0, **QUIET).fit(model)
    assert model.steps.count("training_step") == 8


@pytest.mark.parametrize("entry", ["validate", "test", "predict"])
def test_evaluation_steps_without_batch_idx(entry: str):
    model = BatchOnly()
    getattr(Trainer(**QUIET), entry)(model)
    assert len(model.steps) == 8


def test_steps_with_args_get_batch_idx():
    class Varargs(BoringModel):
        seen: list[int] = []

        def training_step(self, batch: Any, *args: Any) -> Any:
            Varargs.seen.append(args[0])
            return self(batch).sum()

    Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, **QUIET).fit(Varargs())
    assert Varargs.seen == [0, 1]


class TwoLoaders(BoringModel):
    def val_dataloader(self) -> Any:
        return [DataLoader(RandomDataset(32, 8), batch_size=4), DataLoader(RandomDataset(32, 8), batch_size=4)]


def test_several_loaders_need_dataloader_idx_in_the_step():
    class NoIdx(TwoLoaders):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            return None

    with pytest.raises(MisconfigurationError, match="no `dataloader_idx` parameter"):
        Trainer(**QUIET).validate(NoIdx())


def test_several_loaders_pass_dataloader_idx():
    class WithIdx(TwoLoaders):
        seen: list[int] = []

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            WithIdx.seen.append(dataloader_idx)

    Trainer(**QUIET).validate(WithIdx())
    assert WithIdx.seen == [0, 0, 1, 1]


def test_one_loader_and_a_required_dataloader_idx_is_an_error():
    class Required(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
            return None

    with pytest.raises(MisconfigurationError, match="give it a default"):
        Trainer(**QUIET).validate(Required())


def test_signatures_are_read_once_per_run_not_per_step(monkeypatch: pytest.MonkeyPatch):
    reads: list[str] = []
    original = step_signature.takes_batch_idx

    def counting(fn: Any) -> bool:
        reads.append(fn.__name__)
        return original(fn)

    monkeypatch.setattr(step_signature, "takes_batch_idx", counting)
    Trainer(max_epochs=2, **QUIET).fit(BoringModel())  # 16 training and 18 validation steps
    assert sorted(reads) == sorted(step_signature.STEP_NAMES)


class Shapes:
    """Step signatures of every shape, to compare the code-object reading with inspect's."""

    def batch_only(self, batch): ...
    def with_idx(self, batch, batch_idx): ...
    def star_args(self, *args): ...
    def keyword_only_idx(self, batch, *, batch_idx=0): ...
    def positional_only(self, batch, /, idx): ...
    def with_loader_idx(self, batch, idx, dataloader_idx=0): ...
    def star_kwargs(self, batch, **kwargs): ...

    @staticmethod
    def static(batch, batch_idx): ...

    @functools.wraps(batch_only)
    def wrapped(self, *args, **kwargs): ...


class WithSignature:
    __signature__ = inspect.Signature([inspect.Parameter("batch", inspect.Parameter.POSITIONAL_OR_KEYWORD)])

    def __call__(self, batch, batch_idx): ...


@pytest.mark.parametrize("fn", [*(getattr(Shapes(), name) for name in vars(Shapes) if not name.startswith("_")),
                                functools.partial(Shapes.with_idx, Shapes()), WithSignature()],
                         ids=lambda fn: getattr(fn, "__name__", type(fn).__name__))
def test_the_fast_reading_agrees_with_getfullargspec(fn: Any):
    spec = inspect.getfullargspec(getattr(fn, "__wrapped__", fn))
    assert step_signature._positional(fn) == (spec.args, spec.varargs is not None)


def test_a_wrong_dataloader_idx_is_a_runtime_error_as_in_lightning():
    class Required(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
            pass

    with pytest.raises(RuntimeError, match="requires `dataloader_idx`"):
        Trainer(**QUIET).validate(Required(), verbose=False)


def test_a_step_asking_for_the_loader_iterator_is_refused_by_name():
    class Iterating(BoringModel):
        def training_step(self, dataloader_iter: Any) -> Any:
            return super().training_step(next(dataloader_iter), 0)

    with pytest.raises(MisconfigurationError, match=r"training_step\(dataloader_iter\)"):
        Trainer(max_epochs=1, **QUIET).fit(Iterating())
