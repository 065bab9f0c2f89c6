"""Golden test: the hooks a fit calls, in order, equal the pseudocode in trainer.hooks' docstring."""

from __future__ import annotations

import re
from typing import Any

import trainer.hooks
from callbacks import Callback
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, TrainModule

_FOR = re.compile(r"^for \w+ in (\w+):$")
_IF = re.compile(r"^if (\w+):$")


def _pseudocode() -> list[tuple[int, str]]:
    doc = trainer.hooks.__doc__ or ""
    block = doc.split("    fit:\n", 1)[1].split("\n\n", 1)[0]
    lines = []
    for raw in block.splitlines():
        text = raw.strip()
        if text:
            lines.append(((len(raw) - len(raw.lstrip())) // 4, text))
    return lines


def expand(lines: list[tuple[int, str]], counts: dict[str, int], flags: dict[str, bool]) -> list[str]:
    """Unroll `for x in name:` (counts[name] times) and `if name:` (flags[name]) blocks into hook names."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        depth, text = lines[i]
        j = i + 1
        while j < len(lines) and lines[j][0] > depth:
            j += 1
        body = lines[i + 1 : j]
        if m := _FOR.match(text):
            for _ in range(counts[m.group(1)]):
                out += expand(body, counts, flags)
        elif m := _IF.match(text):
            if flags[m.group(1)]:
                out += expand(body, counts, flags)
        else:
            out.append(text)
            out += expand(body, counts, flags)
        i = j
    return out


class _RecordingCallback(Callback):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls


def _recorder(name: str):  # noqa: ANN202
    def hook(self, trainer, module, *args: Any, **kwargs: Any) -> None:  # noqa: ANN001
        self.calls.append(name)

    return hook


_CALLBACK_HOOKS = [n for n in vars(Callback) if n.startswith("on_") or n in ("setup", "teardown")]
for _name in _CALLBACK_HOOKS:
    setattr(_RecordingCallback, _name, _recorder(_name))

_MODULE_HOOKS = [n for n in vars(TrainModule) if n.startswith("on_") or n in ("setup", "teardown")]
_STEPS = ["training_step", "validation_step", "configure_optimizers", "optimizer_step", "optimizer_zero_grad",
          "backward", "configure_gradient_clipping"]


class _RecordingModel(BoringModel):
    def __init__(self) -> None:
        super().__init__(batch_size=8, length=24)  # 3 train batches, 3 val batches
        self.calls: list[str] = []


def _module_recorder(name: str):  # noqa: ANN202
    parent = getattr(BoringModel, name)

    def hook(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN001
        self.calls.append(name)
        return parent(self, *args, **kwargs)

    return hook


for _name in _MODULE_HOOKS + _STEPS:
    setattr(_RecordingModel, _name, _module_recorder(_name))


def test_fit_hook_order_matches_docstring_pseudocode():
    calls: list[str] = []
    model = _RecordingModel()
    trainer = Trainer(max_epochs=2, num_sanity_val_steps=2, callbacks=[_RecordingCallback(calls)], **QUIET)
    trainer.fit(model)

    expected = expand(
        _pseudocode(),
        counts={"sanity_batches": 2, "epochs": 2, "train_batches": 3, "val_batches": 3},
        flags={"sanity_check": True, "validation": True},
    )
    assert len(expected) > 60
    assert calls == [h for h in expected if h in _CALLBACK_HOOKS]
    assert model.calls == [h for h in expected if h in _MODULE_HOOKS or h in _STEPS]


def test_every_hook_in_the_pseudocode_exists():
    names = {text for _, text in _pseudocode() if not _FOR.match(text) and not _IF.match(text)}
    unknown = names - set(_CALLBACK_HOOKS) - set(_MODULE_HOOKS) - set(_STEPS)
    assert unknown == set()


def test_monitoring_callbacks_run_after_the_module_on_train_epoch_end():
    order: list[str] = []

    class Monitor(Callback):
        is_monitoring_callback = True

        def on_train_epoch_end(self, trainer, module):  # noqa: ANN001
            order.append("monitor")

    class Plain(Callback):
        def on_train_epoch_end(self, trainer, module):  # noqa: ANN001
            order.append("plain")

    class Model(BoringModel):
        def on_train_epoch_end(self) -> None:
            order.append("module")

    Trainer(max_epochs=1, callbacks=[Monitor(), Plain()], **QUIET).fit(Model())
    assert order == ["plain", "module", "monitor"]
