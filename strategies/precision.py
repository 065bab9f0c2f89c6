"""The Precision object: owns autocast, input/parameter casting, backward, the optimizer step and
the loss scaler's state, so that every strategy gets precision handling without knowing its kind.

`PRECISIONS` is the one table of precisions (canonical name, the other spellings, the builder) behind the
Trainer's `precision=` flag and `precision_from_flag`. What each precision does, and why 16-mixed really runs
fp16 on CPU, is in docs/precision.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from strategies.exceptions import ConfigError
from strategies.model.step_contexts import DefaultDtype, ReusedAutocast

_DTYPES = {"16": torch.float16, "bf16": torch.bfloat16}


def canonical_precision(flag: str | int) -> str:
    """Map any accepted spelling of the precision flag to its canonical name, or raise ConfigError."""
    key = flag.strip().lower() if isinstance(flag, str) else flag
    if isinstance(key, bool) or key not in _ALIASES:
        accepted = ", ".join(repr(a) for a in _ALIASES)
        raise ConfigError(f"precision={flag!r} is not a known precision. Accepted values: {accepted}.")
    return _ALIASES[key]


_NULL_CONTEXT = nullcontext()  # reusable: one per step would be wasted work


class Precision:
    """'32-true': full float32, no autocast. Subclasses override only what differs.

    `param_dtype` is the dtype parameters are computed in (None: as stored, float32). A sharding strategy
    asks `fsdp_policy()` for FSDP2's MixedPrecisionPolicy instead of reading the precision's name.
    """

    name: str = "32-true"
    param_dtype: torch.dtype | None = None

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast parameters for *-true precisions; identity here."""
        return module

    def forward_context(self) -> AbstractContextManager:
        """Entered around every step inside the step router (autocast for *-mixed)."""
        return _NULL_CONTEXT

    def module_init_context(self) -> AbstractContextManager:
        """Entered while `trainer.init_module()` / `configure_model()` build layers: the default dtype for *-true."""
        return _NULL_CONTEXT

    def convert_input(self, batch: Any) -> Any:
        """Cast floating-point inputs for *-true precisions; identity here."""
        return batch

    def fsdp_policy(self) -> Any:
        """FSDP2's `MixedPrecisionPolicy` for this precision: torch's default here (parameters gathered and
        gradients reduced in their stored dtype; *-true precisions cast the parameters before sharding)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy  # heavy: imported only by a sharding strategy

        return MixedPrecisionPolicy()

    def backward(self, loss: Tensor, backward: Callable[..., None] | None = None, *args: Any, **kwargs: Any) -> None:
        """Backward on the (scaled) loss: through `backward(loss, *args, **kwargs)` (the module's hook) when given,
        else `loss.backward(*args, **kwargs)`."""
        (backward or Tensor.backward)(loss, *args, **kwargs)

    def check_optimizer(self, optimizer: Optimizer) -> None:
        """Refuse, at the start of fit, an optimizer this precision cannot step; every optimizer steps here."""

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling before gradients are read (clipping); nothing to undo here."""

    def unscales(self) -> bool:
        """Whether `unscale_gradients` does anything; asked once per run, so the loop can skip the call per step."""
        return type(self).unscale_gradients is not Precision.unscale_gradients

    def gradients_as_backward_left_them(self, optimizer: Optimizer, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        """`grads` (read from `optimizer`'s parameters) as backward left them, for a checkpoint taken between
        unscaling and the optimizer step: the resumed step unscales them again. Unchanged here."""
        return grads

    def prepare_resumed_step(self, optimizer: Optimizer) -> None:
        """Make ready for an optimizer step on restored gradients, before any backward of this process."""

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> bool:
        """Step the optimizer (it calls `closure`, LBFGS several times); return False when the step was skipped
        (so schedulers do not step)."""
        optimizer.step(**kwargs) if closure is None else optimizer.step(closure=closure, **kwargs)  # as Lightning
        return True

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore for full precision."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class MixedPrecision(Precision):
    """'16-mixed' / 'bf16-mixed': float32 parameters, the step's math under `torch.autocast`.

    fp16 has a narrow range, so 16-mixed scales the loss with a `torch.amp.GradScaler`: backward scales,
    `unscale_gradients` unscales (once per step, however often it is asked), and `optimizer_step` returns
    False when the scaler skipped the step because a gradient was inf/NaN. bf16 has fp32's range and needs
    no scaler.

    Example::

        precision = MixedPrecision("16-mixed", device_type="cuda")
        with precision.forward_context():
            loss = model(x).float().pow(2).mean()
        precision.backward(loss)
        stepped = precision.optimizer_step(optimizer)
    """

    def __init__(self, precision: str, device_type: str, scaler: torch.amp.GradScaler | None = None) -> None:
        if precision not in ("16-mixed", "bf16-mixed"):
            raise ConfigError(f"MixedPrecision({precision!r}) is not valid: use '16-mixed' or 'bf16-mixed'.")
        if not _autocast_available(device_type):
            raise ConfigError(
                f"precision={precision!r} needs torch.autocast on {device_type!r}, which this torch does not "
                "provide; use precision='32-true'."
            )
        if scaler is not None and precision == "bf16-mixed":
            raise ConfigError("precision='bf16-mixed' uses no GradScaler (bf16 has fp32's range); drop scaler=.")
        self.name = precision
        self.device_type = device_type
        self.param_dtype = _DTYPES[precision.split("-")[0]]
        if scaler is None and precision == "16-mixed":
            scaler = torch.amp.GradScaler(device_type)
        self._scaler = scaler
        self._unscaled: set[int] = set()  # ids of optimizers unscaled since their last step
        self._last_scale: float | None = None  # scale after the last update; saves a device sync per step
        self._autocast = ReusedAutocast(device_type, self.param_dtype)

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler (16-mixed), or None."""
        return self._scaler

    def forward_context(self) -> AbstractContextManager:
        return self._autocast

    def fsdp_policy(self) -> Any:
        """FSDP2 gathers the parameters in the autocast dtype and reduces gradients in fp32 (autocast still runs)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)

    def backward(self, loss: Tensor, backward: Callable[..., None] | None = None, *args: Any, **kwargs: Any) -> None:
        # the base class's backward on the scaled loss, without a second call per step
        (backward or Tensor.backward)(self._scaler.scale(loss) if self._scaler is not None else loss, *args, **kwargs)

    def check_optimizer(self, optimizer: Optimizer) -> None:
        if self._scaler is not None and isinstance(optimizer, torch.optim.LBFGS):
            raise ConfigError(
                f"precision={self.name!r} cannot step torch.optim.LBFGS: its GradScaler steps on gradients computed "
                "once, and LBFGS re-evaluates its closure during the step. Use precision='32-true' or 'bf16-mixed'."
            )

    def unscales(self) -> bool:
        return self._scaler is not None or type(self).unscale_gradients is not MixedPrecision.unscale_gradients

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        # GradScaler raises on a second unscale_ before step(); clipping and a user's call may both ask.
        if self._scaler is None or id(optimizer) in self._unscaled:
            return
        self._scaler.unscale_(optimizer)
        self._unscaled.add(id(optimizer))

    def gradients_as_backward_left_them(self, optimizer: Optimizer, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        if self._scaler is None or id(optimizer) not in self._unscaled:
            return grads
        scale = self._scaler.get_scale()  # a power of two: scaling back undoes unscale_ exactly
        return {name: grad * scale for name, grad in grads.items()}

    def prepare_resumed_step(self, optimizer: Optimizer) -> None:
        # GradScaler creates its scale tensor (from the loaded state) in its first scale(); a step needs it.
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if self._scaler is not None and grads:
            self._scaler.scale(torch.zeros((), device=grads[0].device))

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> bool:
        """scaler.step + scaler.update; the step was skipped exactly when the update lowered the scale.

        NOTE: update() runs after every optimizer's step, as in Lightning. With several optimizers, run
        backward and step for one before the next (a GAN's usual order), not one backward for all.
        """
        scaler = self._scaler
        if scaler is None:  # bf16: the base class's step, without a second call per step
            optimizer.step(**kwargs) if closure is None else optimizer.step(closure=closure, **kwargs)
            return True
        try:
            # GradScaler.step refuses closures: evaluate it once, then step on its (scaled) gradients.
            if closure is not None and closure() is None and not _has_gradients(optimizer):
                return False  # every batch of the window was skipped: nothing to step (the scaler would refuse)
            before = self._last_scale if self._last_scale is not None else scaler.get_scale()
            scaler.step(optimizer, **kwargs)  # unscales first if unscale_gradients has not
            scaler.update()  # backs the scale off after inf/NaN gradients, grows it after a run of good steps
        finally:
            self._unscaled.discard(id(optimizer))
        self._last_scale = scaler.get_scale()
        return self._last_scale >= before

    def state_dict(self) -> dict[str, Any]:
        # GradScaler.state_dict holds floats and ints only, so torch.load(weights_only=True) reads it.
        return {"scaler": self._scaler.state_dict()} if self._scaler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the scaler; a checkpoint from a precision without one leaves the fresh scaler as it is."""
        if self._scaler is not None and state_dict.get("scaler"):
            self._scaler.load_state_dict(state_dict["scaler"])
            self._last_scale = None

    def __repr__(self) -> str:
        return f"MixedPrecision({self.name!r}, device_type={self.device_type!r})"


def _has_gradients(optimizer: Optimizer) -> bool:
    return any(p.grad is not None for group in optimizer.param_groups for p in group["params"])


def _cast_floats(data: Any, dtype: torch.dtype) -> Any:
    """Cast floating-point tensors in (nested) lists, tuples, namedtuples and dicts; leave the rest alone."""
    if isinstance(data, Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if isinstance(data, (list, tuple)):
        cast = [_cast_floats(item, dtype) for item in data]
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*cast)
        return cast if isinstance(data, list) else tuple(cast)
    if isinstance(data, Mapping):
        return {key: _cast_floats(value, dtype) for key, value in data.items()}
    return data


class _TruePrecision(Precision):
    """Parameters, floating-point inputs and the step's default dtype all in one dtype: no autocast, no scaler."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name = name
        self.param_dtype = self._dtype = dtype
        self._default_dtype = DefaultDtype(dtype)

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(self._dtype)

    def forward_context(self) -> AbstractContextManager:
        return self._default_dtype

    def module_init_context(self) -> AbstractContextManager:
        return DefaultDtype(self._dtype)  # its own instance: init_module may be entered inside a step

    def convert_input(self, batch: Any) -> Any:
        return _cast_floats(batch, self._dtype)


class HalfPrecision(_TruePrecision):
    """'bf16-true' / '16-true': parameters (and optimizer state) in bf16 or fp16; half the memory of fp32.

    Example::

        trainer = Trainer(precision="bf16-true")   # params, float inputs and new tensors in the step: bf16
    """

    def __init__(self, precision: str = "bf16-true") -> None:
        if precision not in ("bf16-true", "16-true"):
            raise ConfigError(f"HalfPrecision({precision!r}) is not valid: use 'bf16-true' or '16-true'.")
        super().__init__(precision, _DTYPES[precision.split("-")[0]])


class DoublePrecision(_TruePrecision):
    """'64-true': parameters and floating-point inputs in float64, for numerics checks."""

    def __init__(self) -> None:
        super().__init__("64-true", torch.float64)


def _autocast_available(device_type: str) -> bool:
    try:
        return torch.amp.is_autocast_available(device_type)
    except RuntimeError:  # not a device type torch knows
        return False


class _Entry(NamedTuple):
    spellings: tuple[str | int, ...]  # what users may write besides the canonical name (Lightning's aliases)
    build: Callable[[str, str], Precision]  # (canonical name, device type) -> the Precision object


# The one table of precisions: a new precision is one entry here (and its class above).
PRECISIONS: dict[str, _Entry] = {
    "32-true": _Entry(("32", 32), lambda name, device_type: Precision()),
    "64-true": _Entry(("64", 64), lambda name, device_type: DoublePrecision()),
    "16-mixed": _Entry(("16", 16), MixedPrecision),
    "bf16-mixed": _Entry(("bf16",), MixedPrecision),
    "bf16-true": _Entry((), lambda name, device_type: HalfPrecision(name)),
    "16-true": _Entry((), lambda name, device_type: HalfPrecision(name)),
}
CANONICAL_PRECISIONS = tuple(PRECISIONS)
_ALIASES: dict[str | int, str] = {spelling: name for name, entry in PRECISIONS.items()
                                  for spelling in (name, *entry.spellings)}


def precision_from_flag(flag: str | int, device_type: str = "cpu") -> Precision:
    """Build the Precision object for a `precision=` flag value on a device type ("cpu", "cuda", ...).

    Raises:
        ConfigError: unknown flag (the message lists the accepted ones), or a precision the device lacks.

    Example::

        precision_from_flag("bf16", "cuda")    # MixedPrecision('bf16-mixed', device_type='cuda')
        precision_from_flag(64)                # DoublePrecision('64-true')
    """
    name = canonical_precision(flag)
    if name.startswith("bf16") and device_type == "cuda" and torch.cuda.is_available() \
            and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"precision={flag!r} needs a GPU with bf16 support, and this one has none; use precision='16-mixed'."
        )
    return PRECISIONS[name].build(name, device_type)
