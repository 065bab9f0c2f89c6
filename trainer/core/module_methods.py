"""The TrainModule methods and properties a user calls (Lightning's names and meaning): the loggers, `on_gpu`,
`dtype`, `print`, `all_gather`, `freeze` / `unfreeze`, `example_input_array` and `to_onnx`; and the two export
methods we refuse (`to_torchscript`, `to_tensorrt`) with the reason. Kept out of module.py, which holds the hooks."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from strategies.exceptions import MisconfigurationError


def _to_tensors(data: Any, device: torch.device) -> Any:
    """Numbers become tensors on `device`, in nested lists, tuples and dicts (what `all_gather` accepts)."""
    if isinstance(data, Tensor):
        return data.to(device)
    if isinstance(data, (int, float, bool)):
        return torch.tensor(data, device=device)
    if isinstance(data, Mapping):
        return {k: _to_tensors(v, device) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        items = [_to_tensors(v, device) for v in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    return data


def _apply(data: Any, fn: Any) -> Any:
    if isinstance(data, Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return {k: _apply(v, fn) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        items = [_apply(v, fn) for v in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    return data


class ModuleConveniences:
    """Mixed into TrainModule (an nn.Module with `_trainer`); see the module docstring."""

    _trainer: Any

    @property
    def logger(self) -> Any:
        """The Trainer's first logger (None without a Trainer or a logger); `self.logger.experiment` is the
        logger's own object (a TensorBoard `SummaryWriter`, an MLflow client, a W&B run)."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Any]:
        """All the Trainer's loggers (an empty list without a Trainer)."""
        return list(self._trainer.loggers) if self._trainer is not None else []

    @property
    def on_gpu(self) -> bool:
        """True when the module's parameters are on a CUDA device."""
        return self.device.type == "cuda"  # type: ignore[attr-defined]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's first floating-point parameter or buffer (float32 without any)."""
        module: nn.Module = self  # type: ignore[assignment]
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
        return torch.get_default_dtype()

    @property
    def example_input_array(self) -> Any:
        """An example input for `forward` (or None): ModelSummary shows in/out sizes with it, and `to_onnx`
        exports with it when no `input_sample` is given. Set it in `__init__`."""
        return self.__dict__.get("_example_input_array")

    @example_input_array.setter
    def example_input_array(self, value: Any) -> None:
        self.__dict__["_example_input_array"] = value

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on global rank 0 only (above the progress bar when one is drawn); nothing on other ranks."""
        trainer = self._trainer
        if trainer is not None and not trainer.is_global_zero:
            return
        bar = getattr(trainer, "progress_bar_callback", None) if trainer is not None else None
        (bar.print if bar is not None else print)(*args, **kwargs)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Gather a tensor (or numbers, or a nested list/tuple/dict of them) from every rank.

        Returns tensors of shape `(world_size, ...)`; with one process the data comes back without the new
        dimension, as in Lightning. Call it on every rank with the same shapes. `sync_grads=True` lets
        gradients flow back through the gather (torch.distributed.nn).

        Raises:
            MisconfigurationError: a `group` other than the default (all ranks), or no Trainer.
        """
        if self._trainer is None:
            raise MisconfigurationError("self.all_gather() needs an attached Trainer; call it during fit/validate.")
        import torch.distributed as dist

        if group is not None and not (dist.is_available() and group is dist.group.WORLD):
            raise MisconfigurationError(
                "self.all_gather(group=...) gathers over all ranks only here; leave group=None, or call "
                "torch.distributed.all_gather with your group yourself."
            )
        strategy = self._trainer.strategy
        data = _to_tensors(data, self.device)  # type: ignore[attr-defined]
        if strategy.world_size == 1:
            return data
        if sync_grads:
            from torch.distributed.nn.functional import all_gather as differentiable_gather

            return _apply(data, lambda t: torch.stack(differentiable_gather(t)))
        return _apply(data, strategy.all_gather)

    def freeze(self) -> Any:
        """Turn off gradients for every parameter and switch to eval mode; returns the module."""
        module: nn.Module = self  # type: ignore[assignment]
        for param in module.parameters():
            param.requires_grad = False
        return module.eval()

    def unfreeze(self) -> Any:
        """Turn gradients back on for every parameter and switch to train mode; returns the module."""
        module: nn.Module = self  # type: ignore[assignment]
        for param in module.parameters():
            param.requires_grad = True
        return module.train()

    def to_onnx(self, file_path: str | Path | Any = None, input_sample: Any = None, **kwargs: Any) -> Any:
        """Export the module's `forward` to ONNX with `torch.onnx.export(self, input_sample, file_path, **kwargs)`.

        `input_sample` defaults to `example_input_array`; it goes through the batch-transfer hooks as a batch would.
        The module is exported in eval mode and gets its mode back. Needs the `onnx` package (and `onnxscript` for
        torch's default exporter): `pip install "trainer[onnx]"`. Returns what torch.onnx.export returns.

        Raises:
            MisconfigurationError: onnx is not installed, or there is no input sample.
        """
        if importlib.util.find_spec("onnx") is None:
            raise MisconfigurationError(
                "to_onnx() needs the `onnx` package (and `onnxscript` for torch's exporter): "
                "pip install onnx onnxscript (or the extra: pip install 'trainer[onnx]')."
            )
        if input_sample is None:
            input_sample = self.example_input_array
        if input_sample is None:
            raise MisconfigurationError(
                "to_onnx() needs an input: pass input_sample=..., or set self.example_input_array in __init__."
            )
        module: nn.Module = self  # type: ignore[assignment]
        device = self.device  # type: ignore[attr-defined]
        input_sample = self.transfer_batch_to_device(  # type: ignore[attr-defined]
            self.on_before_batch_transfer(input_sample, 0), device, 0  # type: ignore[attr-defined]
        )
        input_sample = self.on_after_batch_transfer(input_sample, 0)  # type: ignore[attr-defined]
        args = input_sample if isinstance(input_sample, tuple) else (input_sample,)
        was_training = module.training
        module.eval()
        try:
            return torch.onnx.export(module, args, str(file_path) if isinstance(file_path, Path) else file_path,
                                     **kwargs)
        finally:
            module.train(was_training)

    def to_torchscript(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: TorchScript is deprecated in torch; use `torch.export.export(model, (x,))` or `to_onnx`."""
        raise MisconfigurationError(
            "to_torchscript() is not provided: TorchScript is deprecated in PyTorch. Export with "
            "torch.export.export(model.eval(), (example_input,)) or model.to_onnx(path, example_input)."
        )

    def to_tensorrt(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: needs torch_tensorrt and a GPU; compile with torch_tensorrt yourself."""
        raise MisconfigurationError(
            "to_tensorrt() is not provided: compile the module with torch_tensorrt.compile(model, inputs=[...]) "
            "directly."
        )
