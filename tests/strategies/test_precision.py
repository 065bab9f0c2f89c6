"""Precision through the Trainer: what each precision does to params, activations, inputs, steps and checkpoints.

16-mixed runs real fp16 autocast with a GradScaler on CPU (see docs/precision.md), so the scaler's skip logic
is tested here in every CI run; the `cuda` variants run the same checks where a GPU is present.
"""

from __future__ import annotations

import math
import pickle
import threading
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from callbacks import Callback
from strategies import SingleDeviceStrategy, Strategy
from strategies.exceptions import ConfigError
from strategies.precision import (
    PRECISIONS,
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    canonical_precision,
    precision_from_flag,
)
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.runif import run_if
from trainer import Trainer, TrainModule, seed_everything

INF_AT = 2  # the batch whose loss is multiplied by inf
BATCHES = 8  # 64 samples / batch 8
CPU_OR_CUDA = ["cpu", pytest.param("cuda", marks=run_if(min_cuda_gpus=1))]
CPU_OR_BF16_CUDA = ["cpu", pytest.param("cuda", marks=run_if(min_cuda_gpus=1, bf16_cuda=True))]


def _net() -> nn.Sequential:
    """The same initial weights every time, without touching the global RNG (which drives shuffling)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _loader(shuffle: bool = False) -> DataLoader:
    return DataLoader(regression_data(n=64, features=8), batch_size=8, shuffle=shuffle)


class Regressor(TrainModule):
    """Records, inside training_step, the dtypes the precision produced; can poison one batch with inf."""

    def __init__(self, lr: float = 0.05, inf_at: int | None = None, step_scheduler: bool = False) -> None:
        super().__init__()
        self.net = _net()
        self.lr, self.inf_at, self.step_scheduler = lr, inf_at, step_scheduler
        self.losses: list[float] = []
        self.seen: dict[str, torch.dtype] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        hidden = self.net[0](x)
        self.seen = {"input": x.dtype, "activation": hidden.dtype, "param": self.net[0].weight.dtype,
                     "new_tensor": torch.zeros(1).dtype}
        loss = F.mse_loss(self.net[2](self.net[1](hidden)).float(), y.float())
        self.losses.append(loss.item())
        if self.current_epoch == 0 and batch_idx == self.inf_at:
            loss = loss * math.inf
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        if not self.step_scheduler:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.99)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class StepSpy(Callback):
    """Per batch of the first epoch: did the parameters change, and the loss scale before and after."""

    def __init__(self) -> None:
        self.changed: list[bool] = []
        self.scale: list[tuple[float, float]] = []
        self._params: list[torch.Tensor] = []
        self._scale = 0.0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._params = [p.detach().clone() for p in pl_module.parameters()]
        self._scale = trainer.strategy.precision.scaler.get_scale()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 0:
            now = list(pl_module.parameters())
            self.changed.append(not all(torch.equal(a, b) for a, b in zip(self._params, now, strict=True)))
            self.scale.append((self._scale, trainer.strategy.precision.scaler.get_scale()))


def _fit(precision: Any, module: TrainModule | None = None, accelerator: str = "cpu", epochs: int = 1,
         **kwargs: Any) -> tuple[Trainer, Regressor]:
    seed_everything(0)
    model = module or Regressor()
    flags = {**QUIET, "accelerator": accelerator}
    trainer = Trainer(precision=precision, max_epochs=epochs, num_sanity_val_steps=0, **flags, **kwargs)
    trainer.fit(model, _loader())
    return trainer, model  # type: ignore[return-value]


def _first_vs_last_epoch_loss(model: Regressor, epochs: int) -> tuple[float, float]:
    per_epoch = len(model.losses) // epochs
    return sum(model.losses[:per_epoch]), sum(model.losses[-per_epoch:])


# --- the alias table -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("flag", "cls", "name", "dtype"), [
    (32, Precision, "32-true", None), ("32", Precision, "32-true", None), ("32-true", Precision, "32-true", None),
    (16, MixedPrecision, "16-mixed", torch.float16), ("16", MixedPrecision, "16-mixed", torch.float16),
    ("16-mixed", MixedPrecision, "16-mixed", torch.float16),
    ("bf16", MixedPrecision, "bf16-mixed", torch.bfloat16),
    ("bf16-mixed", MixedPrecision, "bf16-mixed", torch.bfloat16),
    ("bf16-true", HalfPrecision, "bf16-true", torch.bfloat16), ("16-true", HalfPrecision, "16-true", torch.float16),
    (64, DoublePrecision, "64-true", torch.float64), ("64", DoublePrecision, "64-true", torch.float64),
    ("64-true", DoublePrecision, "64-true", torch.float64), (" BF16-True ", HalfPrecision, "bf16-true", torch.bfloat16),
])
def test_every_alias_builds_the_right_precision(flag: Any, cls: type, name: str, dtype: torch.dtype | None):
    precision = precision_from_flag(flag)
    assert (type(precision), precision.name, precision.param_dtype) == (cls, name, dtype)


@pytest.mark.parametrize("flag", PRECISIONS)
def test_every_precision_survives_pickling_and_still_works(flag: str):
    """ddp_spawn pickles the strategy with its precision for the ranks: nothing in it may refuse to travel."""
    precision = pickle.loads(pickle.dumps(precision_from_flag(flag)))
    with precision.forward_context():
        out = nn.Linear(2, 2)(precision.convert_input(torch.ones(1, 2)))
    expected = {"32-true": torch.float32, "64-true": torch.float64, "16-mixed": torch.float16,
                "bf16-mixed": torch.bfloat16, "16-true": torch.float16, "bf16-true": torch.bfloat16}
    assert (precision.name, out.dtype) == (flag, expected[flag])


def test_the_reused_autocast_nests_and_is_per_thread():
    """One autocast object per thread and depth: a step inside a step, or DataParallel's threads, each enter
    their own, and leaving restores what was there before."""
    context = precision_from_flag("bf16-mixed").forward_context()
    seen: list[Any] = []

    def other_thread() -> None:
        with context:
            seen.append(torch.is_autocast_enabled("cpu"))
        seen.append(torch.is_autocast_enabled("cpu"))

    with context:
        with context:
            assert torch.is_autocast_enabled("cpu")
        assert torch.is_autocast_enabled("cpu")  # the inner exit restored the outer state, not the initial one
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert not torch.is_autocast_enabled("cpu")
    assert seen == [True, False]
    with context:  # entered again after use: the same objects serve the next step
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16


@pytest.mark.parametrize("flag", ["8", "fp8", 17, True, "16-bf", "float32", None])
def test_unknown_precision_lists_the_valid_ones(flag: Any):
    with pytest.raises(ConfigError, match=r"is not a known precision. Accepted values: .*'16-mixed'.*'bf16-true'"):
        precision_from_flag(flag)


@pytest.mark.parametrize(("flag", "param_dtype", "reduce_dtype"), [
    ("32-true", None, None), ("bf16-mixed", torch.bfloat16, torch.float32), ("bf16-true", None, None),
])
def test_precision_gives_fsdp_its_mixed_precision_policy(flag: str, param_dtype: Any, reduce_dtype: Any):
    policy = precision_from_flag(flag).fsdp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (param_dtype, reduce_dtype)


def test_only_16_mixed_gets_a_scaler():
    names = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true")
    assert [n for n in names if getattr(precision_from_flag(n), "scaler", None) is not None] == ["16-mixed"]


def test_only_a_precision_with_a_scaler_has_gradients_to_unscale_each_step():
    """The loop skips unscale_gradients per step where it does nothing: without a scaler, and without an override."""
    names = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true")
    assert [n for n in names if precision_from_flag(n).unscales()] == ["16-mixed"]

    class Unscaling(MixedPrecision):
        def unscale_gradients(self, optimizer: Any) -> None:
            pass

    strategy = SingleDeviceStrategy("cpu", precision=Unscaling("bf16-mixed", "cpu"))
    strategy.setup_module(nn.Linear(2, 2))
    assert strategy.unscales_gradients


def test_mixed_precision_on_an_unknown_device_type_is_refused():
    with pytest.raises(ConfigError, match="needs torch.autocast on 'warp-drive'"):
        precision_from_flag("bf16-mixed", "warp-drive")


def test_bf16_mixed_refuses_a_scaler():
    with pytest.raises(ConfigError, match="uses no GradScaler"):
        MixedPrecision("bf16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))


# --- bf16-mixed ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("accelerator", CPU_OR_BF16_CUDA)
def test_bf16_mixed_runs_activations_in_bf16(accelerator: str):
    _, model = _fit("bf16-mixed", accelerator=accelerator)
    assert model.seen["activation"] == torch.bfloat16


@pytest.mark.parametrize("accelerator", CPU_OR_BF16_CUDA)
def test_bf16_mixed_keeps_fp32_params_inside_the_step(accelerator: str):
    _, model = _fit("bf16-mixed", accelerator=accelerator)
    assert (model.seen["param"], model.seen["input"]) == (torch.float32, torch.float32)


def test_bf16_mixed_loss_decreases():
    _, model = _fit("bf16-mixed", epochs=4)
    first, last = _first_vs_last_epoch_loss(model, 4)
    assert last < 0.5 * first


# --- bf16-true / 16-true / 64-true -------------------------------------------------------------------------
@pytest.mark.parametrize(("flag", "dtype"), [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_half_precision_casts_every_parameter(flag: str, dtype: torch.dtype):
    _, model = _fit(flag)
    assert {p.dtype for p in model.parameters()} == {dtype}


@pytest.mark.parametrize("flag", ["bf16-true", "16-true"])
def test_half_precision_trains(flag: str):
    _, model = _fit(flag, epochs=4)
    first, last = _first_vs_last_epoch_loss(model, 4)
    assert last < 0.5 * first


def test_bf16_true_casts_inputs_and_new_tensors_inside_the_step():
    _, model = _fit("bf16-true")
    assert (model.seen["input"], model.seen["new_tensor"]) == (torch.bfloat16, torch.bfloat16)


def test_true_precision_restores_the_default_dtype_even_when_the_step_raises():
    class Boom(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        _fit("bf16-true", Boom())
    assert torch.get_default_dtype() == torch.float32


def test_convert_input_casts_only_floating_tensors_in_nested_batches():
    Pair = namedtuple("Pair", "x label")
    batch = {"a": [torch.ones(2), (torch.zeros(1, dtype=torch.float64), "text")],
             "p": Pair(torch.ones(1), torch.ones(1).long())}
    out = HalfPrecision("bf16-true").convert_input(batch)
    got = (out["a"][0].dtype, out["a"][1][0].dtype, out["a"][1][1], type(out["p"]), out["p"].label.dtype)
    assert got == (torch.bfloat16, torch.bfloat16, "text", Pair, torch.int64)


def _raw_float64_loop(epochs: int) -> list[torch.Tensor]:
    seed_everything(3)
    net = _net().double()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loader = _loader(shuffle=True)
    for _ in range(epochs):
        for x, y in loader:
            F.mse_loss(net(x.double()), y.double()).backward()
            torch.nn.utils.clip_grad_norm_(list(net.parameters()), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        sched.step()
    return [p.detach().clone() for p in net.parameters()]


class AdamWModule(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


def _trainer_float64(precision: str, epochs: int) -> list[torch.Tensor]:
    seed_everything(3)
    model = AdamWModule()
    Trainer(precision=precision, max_epochs=epochs, gradient_clip_val=1.0, **QUIET).fit(model, _loader(shuffle=True))
    return [p.detach() for p in model.parameters()]


def test_64_true_matches_a_raw_float64_loop_bit_for_bit():
    expected, got = _raw_float64_loop(epochs=3), _trainer_float64("64-true", epochs=3)
    assert all(e.dtype == g.dtype == torch.float64 and torch.equal(e, g) for e, g in zip(expected, got, strict=True))


def test_64_true_parity_is_sensitive_to_dtype():
    """The comparison above can fail: the same run in float32 does not match the float64 loop."""
    expected, got = _raw_float64_loop(epochs=3), _trainer_float64("32-true", epochs=3)
    assert not all(torch.equal(e, g.double()) for e, g in zip(expected, got, strict=True))


# --- 16-mixed and its scaler -------------------------------------------------------------------------------
@pytest.mark.parametrize("accelerator", CPU_OR_CUDA)
def test_16_mixed_runs_activations_in_fp16_with_fp32_params(accelerator: str):
    trainer, model = _fit("16-mixed", accelerator=accelerator)
    assert (model.seen["activation"], model.seen["param"], trainer.strategy.precision.device_type) == (
        torch.float16, torch.float32, accelerator)


@pytest.mark.parametrize("accelerator", CPU_OR_CUDA)
def test_16_mixed_skips_the_step_on_inf_gradients(accelerator: str):
    spy = StepSpy()
    _fit("16-mixed", Regressor(inf_at=INF_AT), accelerator=accelerator, callbacks=[spy])
    assert spy.changed[INF_AT] is False


def test_16_mixed_steps_on_finite_gradients():
    """The check above can fail: fp16 steps do change the parameters (a few early ones may overflow)."""
    spy = StepSpy()
    _fit("16-mixed", Regressor(), callbacks=[spy])
    assert sum(spy.changed) >= BATCHES - 2


@pytest.mark.parametrize("accelerator", CPU_OR_CUDA)
def test_16_mixed_backs_off_the_scale_on_inf_gradients(accelerator: str):
    spy = StepSpy()
    _fit("16-mixed", Regressor(inf_at=INF_AT), accelerator=accelerator, callbacks=[spy])
    before, after = spy.scale[INF_AT]
    assert after == before * 0.5


@pytest.mark.parametrize("accelerator", CPU_OR_CUDA)
def test_skipped_steps_do_not_step_the_scheduler(accelerator: str):
    """The scheduler steps once per optimizer step that really ran (the poisoned one, and any fp16 overflow)."""
    spy = StepSpy()
    trainer, _ = _fit("16-mixed", Regressor(inf_at=INF_AT, step_scheduler=True), accelerator=accelerator,
                      callbacks=[spy])
    ran = sum(spy.changed)
    assert (trainer.global_step, trainer.lr_scheduler_configs[0].scheduler.last_epoch, ran < BATCHES) == (
        BATCHES, ran, True)


def test_16_mixed_trains_with_gradient_clipping():
    """Were clipping to see scaled gradients, every update would shrink by the scale and the loss would stall."""
    _, model = _fit("16-mixed", epochs=4, gradient_clip_val=1.0)
    first, last = _first_vs_last_epoch_loss(model, 4)
    assert last < 0.5 * first


def _scaled_grads(clip: bool) -> tuple[Tensor | None, list[torch.Tensor], bool]:
    seed_everything(0)
    strategy = SingleDeviceStrategy("cpu", precision=MixedPrecision("16-mixed", "cpu"))
    net = _net()
    strategy.setup_module(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = regression_data(n=8, features=8).tensors
    strategy.backward(F.mse_loss(net(x), y))
    strategy.precision.unscale_gradients(opt)
    norm = strategy.clip_gradients(opt, max_norm=1e9) if clip else None  # unscale asked twice: no error
    grads = [p.grad.clone() for p in net.parameters()]  # type: ignore[union-attr]
    return norm, grads, strategy.optimizer_step(opt)


def test_gradients_are_unscaled_once_before_clipping():
    seed_everything(0)
    reference = _net()
    x, y = regression_data(n=8, features=8).tensors
    F.mse_loss(reference(x), y).backward()
    norm, grads, _ = _scaled_grads(clip=True)
    expected = torch.stack([p.grad.norm() for p in reference.parameters()]).norm()  # type: ignore[union-attr]
    assert norm is not None and torch.allclose(norm, expected, rtol=1e-5)


def test_optimizer_step_after_unscaling_reports_a_real_step():
    assert _scaled_grads(clip=True)[2] is True


class ManualClosure(Regressor):
    """Manual optimization with a closure (the LBFGS-style call GradScaler.step itself refuses)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()

        def closure() -> torch.Tensor:
            loss = super(ManualClosure, self).training_step(batch, batch_idx)
            opt.zero_grad()
            self.manual_backward(loss)
            return loss

        opt.step(closure=closure)


def test_16_mixed_manual_optimization_with_a_closure_trains():
    _, model = _fit("16-mixed", ManualClosure(), epochs=4)
    first, last = _first_vs_last_epoch_loss(model, 4)
    assert last < 0.5 * first


# --- scaler state in checkpoints ---------------------------------------------------------------------------
@pytest.fixture
def poisoned_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A 16-mixed checkpoint after one skipped and several good steps (scale and growth tracker both moved)."""
    trainer, _ = _fit("16-mixed", Regressor(inf_at=INF_AT))
    path = tmp_path / "mixed.ckpt"
    trainer.save_checkpoint(path)
    return path, trainer.strategy.precision.state_dict()


def test_scaler_state_is_readable_with_weights_only(poisoned_checkpoint: tuple[Path, dict[str, Any]]):
    path, state = poisoned_checkpoint
    saved = torch.load(path, weights_only=True)["precision"]
    assert saved == state and saved["scaler"]["scale"] < 65536.0 and saved["scaler"]["_growth_tracker"] > 0


class PrecisionStateAtStart(Callback):
    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.state = trainer.strategy.precision.state_dict()


def test_scaler_state_is_restored_on_resume(poisoned_checkpoint: tuple[Path, dict[str, Any]]):
    path, state = poisoned_checkpoint
    spy = PrecisionStateAtStart()
    seed_everything(0)
    Trainer(precision="16-mixed", max_epochs=2, callbacks=[spy], **QUIET).fit(Regressor(), _loader(), ckpt_path=path)
    assert spy.state == state


def test_resumed_16_mixed_run_matches_an_uninterrupted_one(poisoned_checkpoint: tuple[Path, dict[str, Any]]):
    path, _ = poisoned_checkpoint
    straight, straight_model = _fit("16-mixed", Regressor(inf_at=INF_AT), epochs=2)
    seed_everything(0)
    resumed_model = Regressor(inf_at=INF_AT)
    resumed = Trainer(precision="16-mixed", max_epochs=2, **QUIET)
    resumed.fit(resumed_model, _loader(), ckpt_path=path)
    same_weights = all(torch.equal(a, b) for a, b in zip(straight_model.parameters(), resumed_model.parameters(),
                                                          strict=True))
    assert same_weights and resumed.strategy.precision.state_dict() == straight.strategy.precision.state_dict()


def test_loading_a_checkpoint_without_scaler_state_keeps_the_fresh_scaler():
    precision = MixedPrecision("16-mixed", "cpu")
    precision.load_state_dict({})
    assert precision.state_dict()["scaler"]["scale"] == 65536.0


class GradNormAtHook(Callback):
    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.norms.append(float(torch.stack([p.grad.norm() for p in pl_module.parameters()]).norm()))


def test_on_before_optimizer_step_sees_unscaled_gradients_under_16_mixed():
    """Scaled gradients would be ~65536x the fp32 ones; unscaled they agree to fp16 accuracy (as in Lightning)."""
    spies = {p: GradNormAtHook() for p in ("32-true", "16-mixed")}
    for precision, spy in spies.items():
        _fit(precision, callbacks=[spy], limit_train_batches=1)
    assert math.isclose(spies["16-mixed"].norms[0], spies["32-true"].norms[0], rel_tol=1e-2)


def test_one_table_holds_every_precision_and_its_spellings():
    """A precision is one entry of PRECISIONS: its spellings resolve to it, it builds, and strategies accept it."""
    for name, entry in PRECISIONS.items():
        assert {canonical_precision(spelling) for spelling in (name, *entry.spellings)} == {name}
        assert precision_from_flag(name).name == name
    assert Strategy.supported_precisions(SingleDeviceStrategy()) == tuple(PRECISIONS)
