"""Building what a `LightningCLI` config names: the class groups in link order (instantiation links take an
attribute of an object built before), the automatic optimizer and scheduler, and the Trainer."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from functools import partial, update_wrapper
from types import MethodType
from typing import Any

from trainer.cli.config import CLIError
from trainer.cli.lightning_build import ConfigAssembler
from trainer.cli.lightning_parser import AUTOMATIC, LightningArgumentParser
from trainer.cli.objects import ObjectBuilder
from trainer.cli.slots import trainer_slots
from trainer.core.module import TrainModule


class Instantiator:
    """Builds the class groups in link order, the automatic optimizers and the Trainer."""

    def __init__(self, parser: LightningArgumentParser, trainer_class: Any, builder: ObjectBuilder,
                 assembler: ConfigAssembler) -> None:
        self.parser, self.trainer_class, self.builder, self.assembler = parser, trainer_class, builder, assembler

    def build_groups(self, config: dict[str, Any]) -> dict[str, Any]:
        built: dict[str, Any] = {k: v for k, v in config.items() if k not in self.parser.groups or k == "trainer"}
        built["trainer"] = self.builder.arguments(self.trainer_class, dict(config.get("trainer") or {}), "trainer",
                                                  make=True, slots=trainer_slots())
        pending = [k for k in self.parser.groups if k != "trainer"]
        links = [link for link in self.parser.links if link.apply_on == "instantiate"]
        while pending:
            ready = [k for k in pending if not any(link.target.split(".")[0] == k and
                                                   link.source[0].split(".")[0] in pending for link in links)]
            if not ready:
                raise CLIError(f"link_arguments: the links between {pending} form a cycle")
            for key in ready:
                pending.remove(key)
                built[key] = self._build_group(config, key, built, links)
        return built

    def _build_group(self, config: dict[str, Any], key: str, built: dict[str, Any], links: list[Any]) -> Any:
        if config.get(key) is None:
            return None
        cls, kwargs, args_key = self.assembler.class_and_args(config, key)
        extra = {}
        for link in links:
            head, _, rest = link.target.partition(".")
            if head != key:
                continue
            values = [_attribute(built, source) for source in link.source]
            extra[rest.removeprefix("init_args.")] = link.compute_fn(*values) if link.compute_fn else values[0]
        return self.builder.construct(cls, kwargs, args_key, label=key, extra=extra)

    def attach_optimizers(self, model: Any, built: dict[str, Any], configure: Callable[..., Any]) -> None:
        """With one AUTOMATIC optimizer given in the config, the model's `configure_optimizers` becomes the CLI's."""
        automatic = {k: r for k, r in self.parser.registered().items() if r.link_to == AUTOMATIC}
        optimizers = [k for k in automatic if k in self.parser.optimizer_keys()]
        schedulers = [k for k in automatic if k in self.parser.scheduler_keys()]
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise CLIError(f"expected at most one AUTOMATIC optimizer and lr_scheduler, found {optimizers + schedulers}"
                           "; link the argument groups to the model and write configure_optimizers yourself")
        if not optimizers or built.get(optimizers[0]) is None or model is None:
            return
        if type(model).configure_optimizers is not TrainModule.configure_optimizers:
            warnings.warn(f"`{type(model).__name__}.configure_optimizers` will be overridden by "
                          "`LightningCLI.configure_optimizers` (an optimizer was given in the config)", stacklevel=2)
        spec = built[optimizers[0]]
        optimizer = self._make(spec, optimizers[0], model.parameters())
        scheduler_spec = built.get(schedulers[0]) if schedulers else None
        scheduler = self._make(scheduler_spec, schedulers[0], optimizer) if scheduler_spec else None
        fn = partial(configure, optimizer=optimizer, lr_scheduler=scheduler)
        update_wrapper(fn, configure)
        model.configure_optimizers = MethodType(fn, model)

    def _make(self, spec: dict[str, Any], key: str, first: Any) -> Any:
        cls = self.assembler.class_of(spec, key)
        return cls(first, **spec["init_args"])

    def make_trainer(self, config: dict[str, Any]) -> Any:
        kwargs = {**self.assembler.objects_for("trainer"), **config}
        return self.trainer_class(**kwargs)


def _attribute(built: dict[str, Any], source: str) -> Any:
    head, _, rest = source.partition(".")
    value = built[head]
    for part in rest.removeprefix("init_args.").split(".") if rest else ():
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """Build `init["class_path"]` with `args` first (a tuple: several positional arguments) and `init["init_args"]` as
    keywords, as Lightning's helper does for `configure_optimizers` under the CLI:
    `instantiate_class(self.parameters(), self.hparams.optimizer)`."""
    module_name, _, name = str(init.get("class_path", "")).rpartition(".")
    if not module_name:
        raise ValueError(f"instantiate_class: init needs a 'class_path' such as 'torch.optim.Adam', got {init!r}.")
    cls = getattr(importlib.import_module(module_name), name)
    return cls(*(args if isinstance(args, tuple) else (args,)), **init.get("init_args", {}))
