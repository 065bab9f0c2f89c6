"""`LightningArgumentParser`: what a `LightningCLI` accepts, declared the way Lightning scripts declare it
(`add_argument`, `add_lightning_class_args`, `add_optimizer_args`, `set_defaults`, `link_arguments`), and the
command line turned into our omegaconf config sources.

It is not a second config system: the parser only records the declarations; config files and `--key=value`
arguments become the same merged omegaconf config that `python -m trainer` reads (trainer/cli/config.py), and
the objects are checked and built by the same `ObjectBuilder` (trainer/cli/objects.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from strategies.exceptions import ConfigError
from trainer.cli.config import CLIError

AUTOMATIC = "AUTOMATIC"
# jsonargparse options Lightning scripts pass through `parser_kwargs` that mean nothing different here.
_ACCEPTED_OPTIONS = {"parser_mode": ("yaml", "omegaconf", "omegaconf+", "jsonnet"), "exit_on_error": None,
                     "error_handler": None, "dump_header": None, "prog": None, "usage": None, "epilog": None,
                     "formatter_class": None}


@dataclass
class ClassGroup:
    """A config key that names a class's arguments (`model`, `data`, a callback added by the user...)."""

    cls: Any
    subclass_mode: bool = False
    required: bool = True
    is_callback: bool = False


@dataclass
class Link:
    source: tuple[str, ...]
    target: str
    compute_fn: Callable[..., Any] | None
    apply_on: str


@dataclass
class Argument:
    type: Any = None
    default: Any = None
    help: str | None = None
    required: bool = False


@dataclass
class Registered:
    """An optimizer or LR-scheduler key: the allowed class(es) and where its spec goes (`AUTOMATIC`: the CLI
    builds it and gives the model a `configure_optimizers`)."""

    classes: tuple[type, ...]
    link_to: str = AUTOMATIC
    fixed: type | None = None  # one class given (not a tuple): its arguments go straight under the key


@dataclass
class ParsedArgs:
    """The command line split up: the subcommand, config files in order, dotted overrides, and the flags."""

    subcommand: str | None = None
    configs: list[str] = field(default_factory=list)
    overrides: list[tuple[str, str]] = field(default_factory=list)
    print_config: bool = False
    help: bool = False


class LightningArgumentParser:
    """Lightning's parser class for `LightningCLI` (`add_arguments_to_parser(parser)` receives one)."""

    def __init__(self, description: str = "Lightning Trainer command line tool", env_prefix: str = "PL",
                 default_env: bool = False, default_config_files: list[str] | None = None, **kwargs: Any) -> None:
        if default_env:
            raise ConfigError("parser_kwargs default_env=True (configuration from PL_* environment variables) is "
                              "not supported: pass the values on the command line or in a --config file, or "
                              "interpolate ${oc.env:NAME} in the config")
        for name, value in kwargs.items():
            allowed = _ACCEPTED_OPTIONS.get(name, ())
            if name not in _ACCEPTED_OPTIONS or (allowed is not None and value not in allowed):
                raise ConfigError(f"parser_kwargs {name}={value!r} is not supported by this LightningCLI "
                                  f"(supported: description, default_config_files, {', '.join(_ACCEPTED_OPTIONS)})")
        self.description = description
        self.env_prefix = env_prefix
        self.default_config_files = list(default_config_files or [])
        self.callback_keys: list[str] = []
        self.groups: dict[str, ClassGroup] = {}
        self.arguments: dict[str, Argument] = {}
        self.defaults: dict[str, Any] = {}
        self.links: list[Link] = []
        self._optimizers: dict[str, Registered] = {}
        self._lr_schedulers: dict[str, Registered] = {}

    # --- declarations -------------------------------------------------------------------------------------
    def add_argument(self, *names: str, type: Any = None, default: Any = None, help: str | None = None,
                     required: bool = False, **kwargs: Any) -> None:
        """A plain top-level (or dotted) key, e.g. `parser.add_argument("--run_name", default="x")`."""
        long = [n for n in names if n.startswith("--")] or list(names)
        key = long[0].lstrip("-")
        if key in ("c", "config", "print_config", "h", "help"):
            return  # the CLI's own options
        unknown = set(kwargs) - {"action", "metavar", "dest", "choices", "nargs"}
        if unknown:
            raise ConfigError(f"add_argument({names[0]!r}): unsupported options {sorted(unknown)}")
        self.arguments[key] = Argument(type=type, default=default, help=help, required=required)

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        """A class's constructor arguments under `nested_key`; a Callback class is also built and added to the
        Trainer's callbacks."""
        from callbacks.base import Callback
        from trainer.core.datamodule import DataModule
        from trainer.core.module import TrainModule
        from trainer.trainer import Trainer

        is_class = isinstance(lightning_class, type)
        if is_class and not issubclass(lightning_class, (Trainer, TrainModule, DataModule, Callback)):
            raise ConfigError(f"Cannot add arguments from {lightning_class}: give a callable or a subclass of "
                              "Trainer, TrainModule, DataModule or Callback")
        if not is_class and not callable(lightning_class):
            raise ConfigError(f"Cannot add arguments from {lightning_class!r}: not a class or callable")
        is_callback = is_class and issubclass(lightning_class, Callback)
        if is_callback:
            self.callback_keys.append(nested_key)
        return self._add_group(nested_key, ClassGroup(lightning_class, subclass_mode, required, is_callback))

    def add_class_arguments(self, theclass: Any, nested_key: str, **kwargs: Any) -> list[str]:
        return self._add_group(nested_key, ClassGroup(theclass, False, True))

    def add_subclass_arguments(self, baseclass: Any, nested_key: str, required: bool = False,
                               **kwargs: Any) -> list[str]:
        return self._add_group(nested_key, ClassGroup(baseclass, True, required))

    def _add_group(self, key: str, group: ClassGroup) -> list[str]:
        self.groups[key] = group
        if group.subclass_mode:
            return [key]
        return [f"{key}.{name}" for name in signature_params(group.cls)]

    def add_optimizer_args(self, optimizer_class: Any = (torch.optim.Optimizer,), nested_key: str = "optimizer",
                           link_to: str = AUTOMATIC) -> None:
        self._optimizers[nested_key] = _registered(optimizer_class, torch.optim.Optimizer, link_to, "optimizer")

    def add_lr_scheduler_args(self, lr_scheduler_class: Any = None, nested_key: str = "lr_scheduler",
                              link_to: str = AUTOMATIC) -> None:
        bases = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        self._lr_schedulers[nested_key] = _registered(lr_scheduler_class or bases, bases, link_to, "lr scheduler")

    def set_defaults(self, *mappings: dict[str, Any], **kwargs: Any) -> None:
        """Defaults by dotted key (`{"trainer.max_epochs": 5}`); they lose to config files and the command line."""
        for mapping in (*mappings, kwargs):
            self.defaults.update(mapping)

    def link_arguments(self, source: str | tuple[str, ...], target: str, compute_fn: Callable[..., Any] | None = None,
                       apply_on: str = "parse") -> None:
        """Copy a value (or `compute_fn` of several) to `target`: at parse time from the config, or at
        `apply_on="instantiate"` from an attribute of the object built for the source's group."""
        if apply_on not in ("parse", "instantiate"):
            raise ConfigError(f"link_arguments apply_on={apply_on!r}: expected 'parse' or 'instantiate'")
        sources = (source,) if isinstance(source, str) else tuple(source)
        if len(sources) > 1 and compute_fn is None:
            raise ConfigError(f"link_arguments from several sources {sources} needs a compute_fn")
        self.links.append(Link(sources, target, compute_fn, apply_on))

    # --- what the declarations mean -----------------------------------------------------------------------
    def registered(self) -> dict[str, Registered]:
        return {**self._optimizers, **self._lr_schedulers}

    def optimizer_keys(self) -> list[str]:
        return list(self._optimizers)

    def scheduler_keys(self) -> list[str]:
        return list(self._lr_schedulers)

    def linked_targets(self) -> set[str]:
        return {link.target for link in self.links}

    def top_level_keys(self) -> set[str]:
        return ({key.split(".")[0] for key in self.arguments} | set(self.groups) | set(self.registered())
                | {"seed_everything"})


def _registered(value: Any, base: Any, link_to: str, what: str) -> Registered:
    classes = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(c, type) and issubclass(c, base) for c in classes):
        raise ConfigError(f"add_{what.replace(' ', '_')}_args: {value!r} is not a {what} class (or a tuple of them)")
    return Registered(classes=classes, link_to=link_to, fixed=None if isinstance(value, tuple) else value)


def signature_params(cls: Any, skip: tuple[str, ...] = ()) -> dict[str, inspect.Parameter]:
    """The keyword-capable parameters of a class or callable, without `self` and `skip`."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n: p for n, p in params.items() if p.kind in kinds and n not in skip}


def split_command_line(argv: list[str], subcommands: tuple[str, ...] | None) -> ParsedArgs:
    """`[--config F] SUBCOMMAND [--config F] [--key.sub=value | --key.sub value]... [--print_config]`.

    With `subcommands=None` (`run=False`) no subcommand is taken. Options may come before or after it."""
    parsed = ParsedArgs()
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token in ("-h", "--help"):
            parsed.help = True
        elif token == "--print_config" or token.startswith("--print_config="):
            parsed.print_config = True
        elif token.startswith("-") and not _is_number(token):
            name, value, i = _option(token, argv, i)
            if name in ("c", "config"):
                parsed.configs.append(value)
            else:
                parsed.overrides.append((name, value))
        elif subcommands is not None and parsed.subcommand is None:
            if token not in subcommands:
                raise CLIError(f"command line: unknown subcommand {token!r}; expected one of {', '.join(subcommands)}")
            parsed.subcommand = token
        else:
            raise CLIError(f"command line: unexpected argument {token!r}; give options as --key=value")
    if subcommands is not None and parsed.subcommand is None and not parsed.help:
        raise CLIError(f"command line: expected a subcommand, one of {{{','.join(subcommands)}}}")
    return parsed


def _option(token: str, argv: list[str], i: int) -> tuple[str, str, int]:
    """`--key=value` or `--key value`: the key, the value and where the next token is."""
    name, eq, value = token.lstrip("-").partition("=")
    if eq:
        return name, value, i
    if i >= len(argv) or (argv[i].startswith("-") and not _is_number(argv[i])):
        raise CLIError(f"command line: {token} expects a value ({token}=VALUE or {token} VALUE)")
    return name, argv[i], i + 1


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
