"""Several loaders, with Lightning 2.x as the oracle: `CombinedLoader` yields what Lightning's yields in every mode,
a list or dict of training loaders trains on exactly the batches Lightning's Trainer passes to training_step (and to
the same weights), several validation loaders (list or dict) log under the same `/dataloader_idx_N` names, and the
modes Lightning refuses are refused."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies.exceptions import MisconfigurationError
from trainer import CombinedLoader

_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
          "enable_model_summary": False, "accelerator": "cpu", "devices": 1, "num_sanity_val_steps": 0}


def _ids(n: int, offset: int = 0) -> TensorDataset:
    """Samples that carry their own id, so the batches a step saw can be compared."""
    gen = torch.Generator().manual_seed(offset)
    return TensorDataset(torch.arange(offset, offset + n), torch.randn(n, 4, generator=gen))


def _loaders(shuffle: bool = True) -> dict[str, DataLoader]:
    return {"a": DataLoader(_ids(12), batch_size=4, shuffle=shuffle),
            "b": DataLoader(_ids(6, offset=100), batch_size=3, shuffle=False)}


def _lightning() -> Any:
    return pytest.importorskip("lightning.pytorch", reason="Lightning (the [dev] extra) is not installed")


def _flatten(value: Any) -> Any:
    """Batches as plain lists of ids, for comparing structures of tensors."""
    if isinstance(value, dict):
        return {k: _flatten(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_flatten(v) for v in value]
    return value.tolist() if isinstance(value, torch.Tensor) else value


@pytest.mark.parametrize("mode", ["min_size", "max_size_cycle", "max_size", "sequential"])
@pytest.mark.parametrize("as_dict", [True, False])
@pytest.mark.parametrize("limits", [None, [2, 1]])
def test_combined_loader_yields_what_lightnings_does(mode: str, as_dict: bool, limits: Any) -> None:
    pl = _lightning()
    from lightning.pytorch.utilities import CombinedLoader as TheirCombinedLoader

    outputs = []
    for cls in (CombinedLoader, TheirCombinedLoader):
        loaders = _loaders(shuffle=False)
        combined = cls(loaders if as_dict else list(loaders.values()), mode)
        if limits is not None:
            combined.limits = limits
        iter(combined)
        outputs.append((len(combined), [(_flatten(b), i, d) for b, i, d in combined]))
    assert outputs[0] == outputs[1]
    assert pl is not None


def _recording_module(base: type) -> type:
    class Recorder(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            self.seen: list[Any] = []
            self.val_seen: list[Any] = []

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.seen.append((batch_idx, _flatten(_ids_of(batch))))
            parts = batch.values() if isinstance(batch, dict) else batch
            return sum(self.layer(x).pow(2).mean() for _, x in (p for p in parts if p is not None))

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            ids, x = batch
            self.val_seen.append((dataloader_idx, batch_idx, ids.tolist()))
            self.log("val_loss", self.layer(x).pow(2).mean())

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Recorder


def _ids_of(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: None if v is None else v[0] for k, v in batch.items()}
    return [None if v is None else v[0] for v in batch]


def _fit_both(train: Any, val: Any = None, **flags: Any) -> list[Any]:
    """Fit a Recorder under Lightning and ours on fresh copies of the same loaders; returns both modules."""
    pl = _lightning()
    import trainer

    results = []
    for module_base, trainer_cls in ((pl.LightningModule, pl.Trainer), (trainer.TrainModule, trainer.Trainer)):
        torch.manual_seed(1)
        model = _recording_module(module_base)()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer_cls(max_epochs=2, **_QUIET, **flags).fit(model, train_dataloaders=train(),
                                                             val_dataloaders=val() if val else None)
        results.append(model)
    return results


@pytest.mark.parametrize("kind", ["dict", "list", "min_size", "max_size"])
def test_several_training_loaders_see_lightnings_batches(kind: str) -> None:
    def train() -> Any:
        loaders = _loaders()
        if kind == "dict":
            return loaders
        if kind == "list":
            return list(loaders.values())
        return CombinedLoader(loaders, kind) if _is_ours[0] else _their_combined()(loaders, kind)

    _is_ours = [False]

    def flip() -> Any:  # first call builds Lightning's CombinedLoader, the second ours
        value = train()
        _is_ours[0] = True
        return value

    theirs, ours = _fit_both(flip)
    assert ours.seen == theirs.seen and len(ours.seen) > 0
    assert torch.equal(ours.layer.weight, theirs.layer.weight)


def _their_combined() -> Any:
    from lightning.pytorch.utilities import CombinedLoader as TheirCombinedLoader

    return TheirCombinedLoader


def test_limit_train_batches_applies_per_loader_as_lightning() -> None:
    theirs, ours = _fit_both(lambda: _loaders(), limit_train_batches=2)
    assert ours.seen == theirs.seen and len(ours.seen) == 4  # 2 batches x 2 epochs


def test_several_validation_loaders_as_dict_and_list() -> None:
    pl = _lightning()
    for val in (lambda: _loaders(shuffle=False), lambda: list(_loaders(shuffle=False).values())):
        theirs, ours = _fit_both(lambda: {"a": DataLoader(_ids(8), batch_size=4)}, val)
        assert ours.val_seen == theirs.val_seen and {d for d, _, _ in ours.val_seen} == {0, 1}
    assert pl is not None


def test_sequential_mode_is_refused_for_training() -> None:
    import trainer

    model = _recording_module(trainer.TrainModule)()
    with pytest.raises(MisconfigurationError, match="sequential"):
        trainer.Trainer(max_epochs=1, **_QUIET).fit(model, CombinedLoader(_loaders(), "sequential"))


@pytest.mark.parametrize("mode", ["min_size", "max_size_cycle", "max_size"])
def test_validation_and_test_read_a_combined_loader_as_lightning(mode: str) -> None:
    """A CombinedLoader in another mode than "sequential" is one stream of combined batches for validate and test
    (each step gets the dict of batches and no dataloader_idx), and `num_val_batches` counts each iterable."""
    pl = _lightning()
    import trainer

    seen = []
    for base, trainer_cls, combined_cls in ((pl.LightningModule, pl.Trainer, _their_combined()),
                                            (trainer.TrainModule, trainer.Trainer, CombinedLoader)):
        class Reader(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.layer = torch.nn.Linear(4, 1)
                self.batches: list[Any] = []

            def validation_step(self, batch: Any, batch_idx: int) -> None:
                self.batches.append((batch_idx, _flatten(_ids_of(batch))))

            test_step = validation_step

        model = Reader()
        runner = trainer_cls(**_QUIET)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runner.validate(model, combined_cls(_loaders(shuffle=False), mode), verbose=False)
            runner.test(model, combined_cls(_loaders(shuffle=False), mode), verbose=False)
        seen.append((model.batches, runner.num_val_batches, runner.num_test_batches))
    assert seen[0] == seen[1] and seen[1][0]
