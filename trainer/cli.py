"""`python -m trainer fit|validate|test|predict --config run.yaml [key.sub=value ...]`: YAML to a run.

The config layer stays thin: YAML (omegaconf) becomes plain kwargs for the classes it names and for
`Trainer(...)`, checked against their signatures, so there is no second list of Trainer flags to keep in
step. Every mistake in the config is reported as `CLIError` (exit code 2, no traceback) naming the file
and the key path, before any model is built or any process group starts. This is the only module that
imports omegaconf; `import trainer` does not import it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import io
import os
import random
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from callbacks.base import Callback
from strategies.exceptions import ConfigError, MisconfigurationError
from strategies.filesystem import AnyPath, join, makedirs, open_file, to_path
from trainer.datamodule import DataModule
from trainer.module import TrainModule
from trainer.seed import SEED_ENV, seed_everything
from trainer.trainer import Trainer

SUBCOMMANDS = ("fit", "validate", "test", "predict")
SECTIONS = ("model", "data", "trainer", "callbacks", "logger", "seed_everything", "ckpt_path")
CONFIG_FILENAME = "config.yaml"
COMMAND_LINE = "command line"
# Where a class name without a dot is looked up, by key path (`callbacks: [{class_path: EarlyStopping}]`).
_SHORT_NAMES = {"callbacks": "callbacks", "trainer.callbacks": "callbacks", "logger": "trainer.loggers",
                "trainer.logger": "trainer.loggers", "trainer.strategy": "strategies"}
# Annotations simple enough to check a YAML value against; anything richer is left to the callee.
_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "None": (type(None),),
    "Path": (str,), "list": (list,), "Sequence": (list,), "tuple": (list,), "dict": (dict,), "Mapping": (dict,),
}


class CLIError(ConfigError):
    """A mistake in the config or command line; `main` prints it and exits with code 2."""


@dataclass
class CLIRun:
    """What a CLI run built and returned, for callers that drive the CLI from Python (tests, notebooks)."""

    trainer: Trainer
    model: TrainModule
    datamodule: DataModule | None
    result: Any
    config: dict[str, Any]


class SaveConfig(Callback):
    """Writes the resolved config into `trainer.log_dir` at setup, on global rank 0 only, so the run can be
    repeated with `--config <log_dir>/config.yaml`; loggers that keep files with the run (MLflow, W&B) also get
    a copy through `Logger.log_artifact`."""

    def __init__(self, text: str, filename: str = CONFIG_FILENAME) -> None:
        self.text = text
        self.filename = filename
        self.path: AnyPath | None = None

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        folder = to_path(trainer.log_dir)
        makedirs(folder)
        self.path = join(folder, self.filename)
        with open_file(self.path, "w") as handle:
            handle.write(self.text)
        if trainer.loggers:
            with tempfile.TemporaryDirectory() as tmp:
                local = os.path.join(tmp, self.filename)
                Path(local).write_text(self.text)
                for logger in trainer.loggers:
                    logger.log_artifact(local)


# --- loading ---------------------------------------------------------------------------------------
class _Sources:
    """The config files and the command line, in merge order, to tell which one set a key."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []  # (source, its plain container), walked by `origin`

    def origin(self, key: str) -> str:
        """The last source that defines `key` (it wins the merge), else every source."""
        parts = re.findall(r"[^.\[\]]+", key)
        for name, raw in reversed(self.items):
            node: Any = raw
            for part in parts:
                if isinstance(node, dict) and part in node:
                    node = node[part]
                elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                    node = node[int(part)]
                else:
                    break
            else:
                return name
        return ", ".join(name for name, _ in self.items) or COMMAND_LINE

    def error(self, key: str, message: str) -> CLIError:
        return CLIError(f"{self.origin(key)}: {key}: {message}")


def _read_text(path: str) -> str:
    """The file's text; a file that is not UTF-8 (YAML's encoding here) is named with the first bad byte's place."""
    if not Path(path).is_file():
        raise CLIError(f"{path}: config file not found")
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise CLIError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise CLIError(
            f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column {column}; save the config "
            "as UTF-8 (e.g. with iconv -f latin1 -t utf-8)"
        ) from None


def _load_file(path: str) -> Any:
    """One config file as an OmegaConf mapping; malformed YAML and a top level that is not a mapping are named."""
    text = _read_text(path)
    try:
        top = yaml.safe_load(text)  # only to name what the top level is, before omegaconf reads it
        cfg = OmegaConf.load(io.StringIO(text)) if isinstance(top, dict) else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CLIError(f"{path}: malformed YAML{where}: {problem}") from None
    if top is None:
        return OmegaConf.create({})  # an empty file: the sections' checks below say what is missing
    if cfg is None or not OmegaConf.is_dict(cfg):
        raise CLIError(
            f"{path}: the top level is {type(top).__name__} {top!r}, but a config must be a mapping of sections "
            f"({', '.join(SECTIONS)}), e.g. model: {{class_path: package.module.Class}}"
        )
    return cfg


def _load(paths: list[str], overrides: list[str], sources: _Sources) -> Any:
    """Read and merge the config files in order, then apply the dotted overrides."""
    configs = []
    for path in paths:
        cfg = _load_file(path)
        configs.append(cfg)
        sources.items.append((path, OmegaConf.to_container(cfg, resolve=False)))
    for item in overrides:
        if "=" not in item or item.startswith("-"):
            raise CLIError(f"{COMMAND_LINE}: {item!r}: expected an override key.sub=value (or an option)")
        try:
            cfg = OmegaConf.from_dotlist([item])
        except (yaml.YAMLError, OmegaConfBaseException) as exc:
            raise CLIError(f"{COMMAND_LINE}: {item!r}: cannot parse: {str(exc).splitlines()[0]}") from None
        configs.append(cfg)
        sources.items.append((COMMAND_LINE, OmegaConf.to_container(cfg, resolve=False)))
    try:
        return OmegaConf.merge(*configs) if configs else OmegaConf.create({})
    except OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", "") or "")
        raise sources.error(key, f"cannot merge: {str(exc).splitlines()[0]}") from None


def _resolve(cfg: Any, sources: _Sources) -> dict[str, Any]:
    """Interpolations (`${trainer.max_epochs}`, `${oc.env:VAR,default}`) become plain values."""
    try:
        # A mapping: every file's top level was checked to be one (OmegaConf types the result as any container).
        return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    except InterpolationResolutionError as exc:
        key = str(exc.full_key or "")
        raise sources.error(key, f"cannot resolve interpolation: {str(exc).splitlines()[0]}") from None


# --- checking and building -------------------------------------------------------------------------
def _did_you_mean(name: str, choices: Any) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _type_ok(value: Any, annotation: Any) -> bool:
    """True unless `annotation` is simple (int, float | None, ...) and `value` plainly does not fit."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    allowed: list[type] = []
    for part in text.split("|"):
        name = part.strip().split("[")[0]
        if name not in _SIMPLE_TYPES:
            return True
        allowed.extend(_SIMPLE_TYPES[name])
    if isinstance(value, bool):
        return bool in allowed
    return isinstance(value, tuple(allowed))


def _is_spec(value: Any) -> bool:
    return isinstance(value, dict) and ("class_path" in value or "_target_" in value)


class _Builder:
    """Walks config values: `check` imports classes and checks their kwargs without building anything;
    `build` then instantiates class specs depth-first (init_args may hold further specs)."""

    def __init__(self, sources: _Sources) -> None:
        self.sources = sources

    def check(self, value: Any, key: str) -> None:
        self._walk(value, key, make=False)

    def build(self, value: Any, key: str) -> Any:
        return self._walk(value, key, make=True)

    def _walk(self, value: Any, key: str, make: bool) -> Any:
        if isinstance(value, list):
            return [self._walk(item, f"{key}[{i}]", make) for i, item in enumerate(value)]
        if _is_spec(value):
            return self._instantiate(value, key, make)
        if isinstance(value, dict):
            return {k: self._walk(v, f"{key}.{k}", make) for k, v in value.items()}
        return value

    def _instantiate(self, spec: dict[str, Any], key: str, make: bool) -> Any:
        if "class_path" in spec:
            for extra in spec:
                if extra not in ("class_path", "init_args"):
                    raise self.sources.error(f"{key}.{extra}", "unexpected key beside class_path; put arguments "
                                             f"under init_args{_did_you_mean(extra, ['init_args'])}")
            target, target_key = spec["class_path"], f"{key}.class_path"
            kwargs, args_key = spec.get("init_args") or {}, f"{key}.init_args"
        else:
            target, target_key = spec["_target_"], f"{key}._target_"
            kwargs, args_key = {k: v for k, v in spec.items() if k != "_target_"}, key
        if not isinstance(kwargs, dict):
            raise self.sources.error(args_key, f"must be a mapping of arguments, got {kwargs!r}")
        cls = self.import_target(target, target_key, _SHORT_NAMES.get(re.sub(r"\[\d+\]$", "", key)))
        self.check_kwargs(cls, kwargs, args_key)
        built = {k: self._walk(v, f"{args_key}.{k}", make) for k, v in kwargs.items()}
        if not make:
            return None
        try:
            return cls(**built)
        except (ConfigError, MisconfigurationError) as exc:
            raise self.sources.error(key, f"{target}: {exc}") from None

    def import_target(self, target: Any, key: str, default_module: str | None) -> Any:
        """`package.module.Name` (or a bare `Name` where the key has a default module) → the object."""
        if not isinstance(target, str) or not target:
            raise self.sources.error(key, f"must be an import path like 'package.module.Class', got {target!r}")
        module_name, _, attr = target.rpartition(".")
        if not module_name:
            if default_module is None:
                raise self.sources.error(key, f"'{target}' is not an import path; write 'package.module.{target}'")
            module_name = default_module
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            hint = " (run from the folder that holds it, or add it to PYTHONPATH)" if exc.name == module_name else ""
            raise self.sources.error(key, f"cannot import '{target}': {exc}{hint}") from None
        if not hasattr(module, attr):
            names = [n for n in dir(module) if not n.startswith("_")]
            raise self.sources.error(key, f"cannot import '{target}': module '{module_name}' has no "
                                     f"'{attr}'{_did_you_mean(attr, names)}")
        obj = getattr(module, attr)
        if not callable(obj):
            raise self.sources.error(key, f"'{target}' is not a class or function")
        return obj

    def check_kwargs(self, cls: Any, kwargs: dict[str, Any], key: str) -> None:
        """Unknown names (with a suggestion), missing required arguments and plainly wrong types."""
        try:
            params = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            return
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        named = {n: p for n, p in params.items() if p.kind in kinds}
        open_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
        label = getattr(cls, "__qualname__", repr(cls))
        for name, value in kwargs.items():
            sub = f"{key}.{name}"
            if name not in named:
                if open_kwargs:
                    continue
                raise self.sources.error(sub, f"unknown argument '{name}' of {label}{_did_you_mean(name, named)}")
            annotation = named[name].annotation
            if annotation is not inspect.Parameter.empty and not _is_spec(value) and not _type_ok(value, annotation):
                raise self.sources.error(sub, f"{label} expects {annotation}, got {type(value).__name__} {value!r}")
        for name, p in named.items():
            if p.default is inspect.Parameter.empty and name not in kwargs:
                raise self.sources.error(key, f"{label} needs the argument '{name}'")


def _check_sections(config: dict[str, Any], sources: _Sources, builder: _Builder) -> None:
    """Everything that can be checked without building an object: sections, keys, types, imports."""
    _check_layout(config, sources)
    trainer_cfg = config.get("trainer") or {}
    if not isinstance(trainer_cfg, dict):
        raise sources.error("trainer", f"must be a mapping of Trainer arguments, got {trainer_cfg!r}")
    builder.check_kwargs(Trainer, trainer_cfg, "trainer")
    if "logger" in trainer_cfg and config.get("logger") is not None:
        raise sources.error("logger", "given twice, here and as trainer.logger; keep one")
    _check_run_options(config, sources)
    for key, value in (("callbacks", config.get("callbacks")), ("trainer.callbacks", trainer_cfg.get("callbacks")),
                       ("logger", config.get("logger")), ("trainer.logger", trainer_cfg.get("logger"))):
        _check_spec_list(value, key, sources, allow_bool=key.endswith("logger"))
    for section in ("model", "data", "callbacks", "logger"):
        builder.check(config.get(section), section)
    builder.check(trainer_cfg, "trainer")


def _check_layout(config: dict[str, Any], sources: _Sources) -> None:
    """Only known sections; a model, and a model and data that name their class."""
    for section in config:
        if section not in SECTIONS:
            raise sources.error(str(section), f"unknown section '{section}'{_did_you_mean(str(section), SECTIONS)}"
                                f" (sections: {', '.join(SECTIONS)})")
    if config.get("model") is None:
        raise CLIError(f"{sources.origin('model')}: model: missing section; name the TrainModule with "
                       "model: {class_path: package.module.Class, init_args: {...}}")
    for section in ("model", "data"):
        if section in config and config[section] is not None and not _is_spec(config[section]):
            raise sources.error(section, "must name a class with class_path (and init_args) or _target_")
    if "trainer" in config and config["trainer"] is None:  # `trainer:` with every line under it commented out
        raise sources.error("trainer", "is empty (null), so every Trainer argument would silently take its "
                            "default; give the arguments (trainer: {max_epochs: 10, ...}) or remove the section")


def _check_run_options(config: dict[str, Any], sources: _Sources) -> None:
    """The top-level options of the run itself: `seed_everything` and `ckpt_path`."""
    seed = config.get("seed_everything")
    if seed is not None and not (isinstance(seed, bool) or (isinstance(seed, int) and seed >= 0)):
        raise sources.error("seed_everything", f"expected a non-negative int, true or null, got {seed!r}")
    ckpt_path = config.get("ckpt_path")
    if ckpt_path is not None and not isinstance(ckpt_path, str):
        raise sources.error("ckpt_path", f"expected a path or 'last', got {ckpt_path!r}")


def _check_spec_list(value: Any, key: str, sources: _Sources, allow_bool: bool) -> None:
    """callbacks and logger take one class spec or a list of them (logger also true/false)."""
    if value is None or (allow_bool and isinstance(value, bool)):
        return
    for i, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
        if not _is_spec(item):
            where = key if i is None else f"{key}[{i}]"
            raise sources.error(where, f"expected a class spec (class_path/init_args or _target_), got {item!r}")


def _as_list(value: Any) -> list[Any]:
    if value is None or value is False:
        return []
    return list(value) if isinstance(value, list) else [value]


def _build_trainer(config: dict[str, Any], text: str, sources: _Sources, builder: _Builder) -> Trainer:
    kwargs = builder.build(dict(config.get("trainer") or {}), "trainer")
    kwargs["callbacks"] = [*_as_list(kwargs.get("callbacks")), *_as_list(builder.build(config.get("callbacks"),
                                                                                      "callbacks")), SaveConfig(text)]
    if config.get("logger") is not None:
        kwargs["logger"] = builder.build(config["logger"], "logger")
    try:
        return Trainer(**kwargs)
    except (ConfigError, MisconfigurationError) as exc:
        match = re.match(r"(\w+)=", str(exc))
        flag = match.group(1) if match and match.group(1) in kwargs else None
        raise sources.error(f"trainer.{flag}" if flag else "trainer", str(exc)) from None


def _seed(config: dict[str, Any]) -> None:
    """`true` picks a seed (the one launched ranks inherit, if set) and records it in the saved config."""
    seed = config.get("seed_everything")
    if seed is True:
        seed = int(os.environ.get(SEED_ENV) or random.randrange(2**31))
        config["seed_everything"] = seed
    if seed is not None and seed is not False:
        seed_everything(seed, workers=True)  # as LightningCLI does: the DataLoader workers are seeded too


# --- entry points ----------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainer", description="Run fit, validate, test or predict from YAML configs (see docs/cli.md).")
    parser.add_argument("subcommand", choices=SUBCOMMANDS)
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="a YAML config; several are merged in order")
    parser.add_argument("--print_config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="dotted overrides, applied last")
    return parser


def run(argv: list[str] | None = None) -> CLIRun | None:
    """Parse, check, build and run; raise CLIError for config mistakes. Returns None for --print_config."""
    args = _parser().parse_intermixed_args(argv)
    cwd = os.getcwd()
    if cwd not in sys.path:  # class paths such as examples.digits.ConvNet resolve from the working directory
        sys.path.insert(0, cwd)
    sources = _Sources()
    config = _resolve(_load(args.config, args.overrides, sources), sources)
    builder = _Builder(sources)
    _check_sections(config, sources, builder)
    if args.print_config:
        print(OmegaConf.to_yaml(config), end="")
        return None
    _seed(config)  # before the model is built: its initial weights follow the seed
    text = OmegaConf.to_yaml(config)
    model = builder.build(config["model"], "model")
    if not isinstance(model, TrainModule):
        raise sources.error("model", f"{type(model).__name__} is not a trainer.TrainModule")
    data = builder.build(config.get("data"), "data")
    if data is not None and not isinstance(data, DataModule):
        raise sources.error("data", f"{type(data).__name__} is not a trainer.DataModule")
    trainer = _build_trainer(config, text, sources, builder)
    entry = getattr(trainer, args.subcommand)
    result = entry(model=model, datamodule=data, ckpt_path=config.get("ckpt_path"))
    return CLIRun(trainer=trainer, model=model, datamodule=data, result=result, config=config)


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`trainer ...`, `python -m trainer ...`): config mistakes exit 2, no traceback."""
    try:
        run(argv)
    except CLIError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
