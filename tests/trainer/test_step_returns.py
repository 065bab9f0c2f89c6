"""Which training_steps can return None (trainer/ranks/step_returns.py): the ones that get a synchronous agreement."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.ranks.step_returns import training_step_may_skip


class Plain(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
        self.log("loss", loss)
        return loss


class PlainDict(BoringModel):
    def training_step(self, batch, batch_idx):
        out = self.layer(batch)
        return {"loss": F.mse_loss(out, torch.zeros_like(out)), "out": out.detach()}


class Branches(BoringModel):
    def training_step(self, batch, batch_idx):
        if batch_idx % 2:
            return self.layer(batch).sum()
        else:
            return self.layer(batch).mean()


class ExplicitNone(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
        if not torch.isfinite(loss):
            return None
        return loss


class BareReturn(BoringModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 3:
            return
        return self.layer(batch).sum()


class FallsOffTheEnd(BoringModel):
    def training_step(self, batch, batch_idx):
        if batch_idx < 3:
            return self.layer(batch).sum()


class NoneLocal(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = None
        if batch_idx:
            loss = self.layer(batch).sum()
        return loss


class Conditional(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
        return loss if batch_idx else None


class SharedStep(BoringModel):
    def shared_step(self, batch):
        loss = self.layer(batch).sum()
        if loss > 1e9:
            return None
        return loss

    def training_step(self, batch, batch_idx):
        return self.shared_step(batch)


class SharedStepThroughLocal(SharedStep):
    def training_step(self, batch, batch_idx):
        self.record(batch_idx)
        loss = self.shared_step(batch)
        return loss

    def record(self, batch_idx):  # returns nothing, but its result is not what the step returns
        self.seen = batch_idx


class SharedStepWithValue(BoringModel):
    def shared_step(self, batch):
        return self.layer(batch).sum()

    def training_step(self, batch, batch_idx):
        self.record(batch_idx)
        return self.shared_step(batch)

    def record(self, batch_idx):
        self.seen = batch_idx


class SuperStep(ExplicitNone):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx)


class SuperStepOfPlain(Plain):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("module", [Plain, PlainDict, Branches, SharedStepWithValue, SuperStepOfPlain])
def test_steps_that_always_give_a_value_get_the_overlapped_agreement(module):
    assert not training_step_may_skip(module())


@pytest.mark.parametrize("module", [ExplicitNone, BareReturn, FallsOffTheEnd, NoneLocal, Conditional, SharedStep,
                                    SharedStepThroughLocal, SuperStep])
def test_steps_that_can_return_none_get_the_synchronous_agreement(module):
    assert training_step_may_skip(module())


def test_a_step_without_readable_source_counts_as_one_that_can_skip():
    namespace: dict = {}
    exec("def training_step(self, batch, batch_idx):\n    return self.layer(batch).sum()\n", namespace)
    model = type("Generated", (BoringModel,), {"training_step": namespace["training_step"]})()
    assert training_step_may_skip(model)


def test_one_process_does_not_read_the_step_source(monkeypatch: pytest.MonkeyPatch):
    # The reading only shapes the agreement between ranks; a single-process fit has none and skips its cost.
    import trainer.setup.run_start

    def refuse(module):
        raise AssertionError("training_step's source was read on one process")

    monkeypatch.setattr(trainer.setup.run_start, "training_step_may_skip", refuse)
    fitted = Trainer(max_steps=2, **QUIET)
    fitted.fit(ExplicitNone())
    assert fitted.global_step == 2
