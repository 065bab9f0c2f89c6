"""From a `LightningCLI` command line to objects: the config assembled (declared defaults, config files, overrides,
parse-time links), checked against the signatures before anything is built, and then built in link order."""

from __future__ import annotations

import importlib
import inspect
import os
import re
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf

from strategies.checkpoint_io.safe_load import safe_load
from trainer.cli.config import CLIError, ConfigSources, load_config, resolve_config
from trainer.cli.lightning_parser import AUTOMATIC, LightningArgumentParser, ParsedArgs, signature_params
from trainer.cli.objects import ObjectBuilder, did_you_mean, is_class_spec
from trainer.cli.slots import trainer_slots
from trainer.core.module import TrainModule

_SPEC_KEYS = ("class_path", "init_args", "dict_kwargs")
_CLASS_NAME = re.compile(r"([A-Za-z_]\w*\.)*[A-Z]\w*")  # `CSVLogger`, `torch.optim.Adam`: a class, not a value
_TRAINER_CLASS_KEYS = ("trainer.logger", "trainer.callbacks", "trainer.strategy", "trainer.profiler")


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau with the metric it watches (`monitor`), so a config can name it."""

    def __init__(self, optimizer: torch.optim.Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


def _yaml_able(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_yaml_able(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _yaml_able(v) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float, str))


def _set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = config
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _get_dotted(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def _short_class(name: str, bases: tuple[type, ...], modules: tuple[str, ...]) -> type | None:
    """A bare class name: a loaded subclass of `bases` with that name, else one from `modules`."""
    seen: list[type] = list(bases)
    while seen:
        cls = seen.pop()
        if cls.__name__ == name:
            return cls
        seen.extend(cls.__subclasses__())
    for module in modules:
        found = getattr(importlib.import_module(module), name, None)
        if isinstance(found, type) and issubclass(found, bases):
            return found
    return None


class ConfigAssembler:
    """Builds one subcommand's config dict, records which keys may be given, and dumps it in full."""

    def __init__(self, parser: LightningArgumentParser, trainer_class: Any, trainer_defaults: dict[str, Any],
                 method: Callable[..., Any] | None, skip: set[str], sources: ConfigSources) -> None:
        self.parser, self.trainer_class, self.sources = parser, trainer_class, sources
        self.method_args = {n: p for n, p in signature_params(method, ("self", *skip)).items()} if method else {}
        self.object_defaults = {f"trainer.{k}": v for k, v in trainer_defaults.items()
                                if k != "callbacks" and not _yaml_able(v)}
        self.found: dict[str, type] = {}  # classes found by a bare name, by the import path written for them

    # --- assembling -----------------------------------------------------------------------------------------
    def defaults(self) -> dict[str, Any]:
        config: dict[str, Any] = {"trainer": {}}
        for key, group in self.parser.groups.items():
            config.setdefault(key, None if group.subclass_mode else {})
        for key, argument in self.parser.arguments.items():
            _set_dotted(config, key, argument.default)
        for key in self.parser.registered():
            config[key] = None
        for name, param in self.method_args.items():
            config[name] = param.default if param.default is not inspect.Parameter.empty else None
        for key, value in self.parser.defaults.items():
            if _yaml_able(value):
                _set_dotted(config, key, value)
            else:
                self.object_defaults[key] = value
        return config

    def assemble(self, parsed: ParsedArgs, structured: dict[str, Any] | None) -> dict[str, Any]:
        base = OmegaConf.create(self.defaults())
        self.sources.items.append(("defaults", OmegaConf.to_container(base)))
        files = OmegaConf.merge(*[load_config([path], [], self.sources)
                                  for path in [*self.parser.default_config_files, *parsed.configs]] or [{}])
        layers = [base, files]
        if structured:
            layers.append(OmegaConf.create(structured))
            self.sources.items.append(("args", structured))
        merged = OmegaConf.merge(*[self._normalize_layer(OmegaConf.to_container(layer)) for layer in layers])
        for name, value in parsed.overrides:
            merged = self._override(merged, name, value)
        config = resolve_config(merged, self.sources)
        self._hparams_from_checkpoint(config)
        self._check_top_level(config)
        self._resolve_classes(config)
        self._apply_parse_links(config)
        self.check(config)
        return config

    def _override(self, merged: Any, name: str, value: str) -> Any:
        """One `--key=value`, read as Lightning's parser reads it: `--model=Name` names a class (class_path) and
        `--model.lr=0.1` / `--trainer.logger.save_dir=x` set init_args of the class named there."""
        if name.endswith("+"):
            raise CLIError(f"command line: --{name}=...: appending with += is not supported; give the whole list")
        parts = name.split(".")
        i = 1
        while i < len(parts):
            node = OmegaConf.select(merged, ".".join(parts[:i]), default=None)
            if isinstance(node, str) and _CLASS_NAME.fullmatch(node) and parts[i] not in _SPEC_KEYS:
                merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([f"{'.'.join(parts[:i])}.class_path={node}"]))
                node = {"class_path": node}
            if (is_class_spec(node) or ".".join(parts[:i]) in self._class_keys()) and parts[i] not in _SPEC_KEYS:
                parts.insert(i, "init_args")
            i += 1
        key = ".".join(parts)
        current = OmegaConf.select(merged, key, default=None)
        if _CLASS_NAME.fullmatch(value) and (key in self._class_keys() or is_class_spec(current) or
                                             key in _TRAINER_CLASS_KEYS):
            value = f"[{{class_path: {value}}}]" if key == "trainer.callbacks" else f"{{class_path: {value}}}"
            OmegaConf.update(merged, key, None, merge=False)  # a new class: the previous one's init_args do not carry
        return OmegaConf.merge(merged, load_config([], [f"{key}={value}"], self.sources))

    def _hparams_from_checkpoint(self, config: dict[str, Any]) -> None:
        """As in Lightning: with `ckpt_path` naming a file, the model is built with the hyperparameters saved in it
        (they win over the config), so that the weights fit the model they are loaded into."""
        path, group = config.get("ckpt_path"), self.parser.groups.get("model")
        if not isinstance(path, str) or not os.path.isfile(path) or group is None:
            return
        try:  # the safe load's checks (CRCs, record sizes), as every load of a checkpoint
            checkpoint = safe_load(path)
        except Exception:  # noqa: BLE001 - not readable here: the run's own load of ckpt_path names what is wrong
            return
        hparams = dict(checkpoint.get(TrainModule.CHECKPOINT_HYPER_PARAMS_KEY) or
                       checkpoint.get("hyper_parameters") or {})
        for name in ("_instantiator", *self.instantiate_link_targets().get("model", ())):
            hparams.pop(name, None)  # a linked argument comes from its link, as when the checkpoint was written
        class_path = hparams.pop("_class_path", None)
        if not hparams and class_path is None:
            return
        model = config.get("model")
        if group.subclass_mode:
            spec = dict(model) if isinstance(model, dict) else {}
            spec["class_path"] = class_path or spec.get("class_path")
            spec["init_args"] = {**(spec.get("init_args") or {}), **hparams}
            config["model"] = spec
        else:
            config["model"] = {**(model if isinstance(model, dict) else {}), **hparams}

    def _class_keys(self) -> set[str]:
        """The keys that always hold a class spec: subclass-mode groups and optimizer/scheduler keys."""
        return ({k for k, g in self.parser.groups.items() if g.subclass_mode}
                | {k for k, r in self.parser.registered().items() if r.fixed is None})

    def _normalize_layer(self, layer: Any) -> Any:
        """A subclass-mode key given as a bare class name becomes a spec."""
        if isinstance(layer, dict):
            for key in [k for k, g in self.parser.groups.items() if g.subclass_mode] + list(self.parser.registered()):
                if isinstance(layer.get(key), str):
                    layer[key] = {"class_path": layer[key]}
        return OmegaConf.create(layer)

    def _check_top_level(self, config: dict[str, Any]) -> None:
        allowed = self.parser.top_level_keys() | set(self.method_args) | {"trainer"}
        for key in config:
            if key not in allowed:
                raise self.sources.error(key, f"unknown key '{key}'{did_you_mean(key, allowed)} (known: "
                                              f"{', '.join(sorted(allowed))})")
        for key, argument in self.parser.arguments.items():
            try:
                value = _get_dotted(config, key)
            except KeyError:
                value = None
            if argument.required and value is None:
                raise self.sources.error(key, "is required")
            if value is not None and argument.type in (int, float, str, bool) and not isinstance(value, argument.type):
                try:
                    _set_dotted(config, key, argument.type(value))
                except (TypeError, ValueError):
                    raise self.sources.error(key, f"expected {argument.type.__name__}, got {value!r}") from None

    def _resolve_classes(self, config: dict[str, Any]) -> None:
        """Subclass-mode specs get a full import path (a bare name is looked up among loaded subclasses)."""
        for key, group in self.parser.groups.items():
            value = config.get(key)
            if not group.subclass_mode:
                if value is None:  # `model:` with nothing under it: the defaults
                    config[key] = value = {}
                if not isinstance(value, dict) or "class_path" in value or "init_args" in value:
                    name = getattr(group.cls, "__name__", group.cls)
                    raise self.sources.error(key, f"the class is fixed to {name}: give its arguments directly "
                                                  f"({key}: {{arg: value}}), or pass subclass_mode_{key}=True")
                continue
            if value is None or value == {}:
                if group.required:
                    raise self.sources.error(key, f"required: name a {group.cls.__name__} subclass with "
                                                  f"--{key}=package.module.Class or {key}: {{class_path: ...}}")
                config[key] = None
                continue
            self._resolve_spec(config, key, (group.cls,), ())
        for key, registered in self.parser.registered().items():
            value = config.get(key)
            if value is None:
                continue
            if registered.fixed is not None:
                config[key] = {"class_path": _path(registered.fixed), "init_args": dict(value)}
                continue
            modules = ("torch.optim",) if key in self.parser.optimizer_keys() else ("trainer.cli.lightning_build",
                                                                                "torch.optim.lr_scheduler")
            self._resolve_spec(config, key, registered.classes, modules)

    def _resolve_spec(self, config: dict[str, Any], key: str, bases: tuple[type, ...],
                      modules: tuple[str, ...]) -> None:
        spec = config[key]
        if not isinstance(spec, dict) or "class_path" not in spec:
            raise self.sources.error(key, f"needs class_path (and init_args), e.g. --{key}=Name or {key}: "
                                          "{class_path: package.module.Name, init_args: {...}}")
        extra = set(spec) - set(_SPEC_KEYS)
        if extra:
            raise self.sources.error(f"{key}.{sorted(extra)[0]}", "unexpected beside class_path; put arguments "
                                                                  "under init_args")
        name = spec["class_path"]
        if isinstance(name, str) and "." not in name:
            found = _short_class(name, bases, modules)
            if found is None:
                raise self.sources.error(f"{key}.class_path", f"no {bases[0].__name__} subclass named '{name}' is "
                                                              "loaded; give its import path")
            spec["class_path"] = _path(found)
            self.found[spec["class_path"]] = found
        cls = self.class_of(spec, key)
        if not (isinstance(cls, type) and issubclass(cls, bases)):
            raise self.sources.error(f"{key}.class_path", f"{spec['class_path']} is not a {bases[0].__name__}")
        spec["init_args"] = {**(spec.get("dict_kwargs") or {}), **(spec.get("init_args") or {})}
        spec.pop("dict_kwargs", None)

    def _apply_parse_links(self, config: dict[str, Any]) -> None:
        for key, registered in self.parser.registered().items():
            if registered.link_to != AUTOMATIC and config.get(key) is not None:
                _set_dotted(config, registered.link_to, config[key])
        for link in self.parser.links:
            if link.apply_on != "parse":
                continue
            try:
                values = [_get_dotted(config, self.arg_path(config, source)) for source in link.source]
            except KeyError as exc:
                raise CLIError(f"link_arguments: source {exc.args[0]!r} is not in the config") from None
            value = link.compute_fn(*values) if link.compute_fn else values[0]
            _set_dotted(config, self.arg_path(config, link.target), value)

    def class_of(self, spec: dict[str, Any], key: str) -> Any:
        path = spec["class_path"]
        return self.found.get(path) or ObjectBuilder(self.sources).import_target(path, f"{key}.class_path", None)

    def arg_path(self, config: dict[str, Any], key: str) -> str:
        """`model.lr` of a subclass-mode group lives at `model.init_args.lr`."""
        head, _, rest = key.partition(".")
        if rest and is_class_spec(config.get(head)) and rest.split(".")[0] not in _SPEC_KEYS:
            return f"{head}.init_args.{rest}"
        return key

    # --- checking -------------------------------------------------------------------------------------------
    def check(self, config: dict[str, Any]) -> None:
        builder = ObjectBuilder(self.sources)
        trainer_cfg = config.get("trainer") or {}
        if not isinstance(trainer_cfg, dict):
            raise self.sources.error("trainer", f"must be a mapping of Trainer arguments, got {trainer_cfg!r}")
        builder.check_kwargs(self.trainer_class, {**trainer_cfg, **self.objects_for("trainer")}, "trainer")
        builder.arguments(self.trainer_class, trainer_cfg, "trainer", make=False, slots=trainer_slots())
        instantiated = self.instantiate_link_targets()
        for key in self.parser.groups:
            if key == "trainer" or config.get(key) is None:
                continue
            cls, kwargs, args_key = self.class_and_args(config, key)
            extra = {name: None for name in instantiated.get(key, ())}
            builder.construct(cls, kwargs, args_key, make=False, label=key, extra=extra)
        for key, registered in self.parser.registered().items():
            spec = config.get(key)
            if spec is not None and registered.link_to == AUTOMATIC:
                cls = self.class_of(spec, key)
                first = "params" if key in self.parser.optimizer_keys() else "optimizer"
                builder.check_kwargs(cls, {first: None, **spec["init_args"]}, f"{key}.init_args")

    def class_and_args(self, config: dict[str, Any], key: str) -> tuple[Any, dict[str, Any], str]:
        group = self.parser.groups[key]
        if group.subclass_mode:
            spec = config[key]
            return self.class_of(spec, key), dict(spec.get("init_args") or {}), f"{key}.init_args"
        return group.cls, dict(config.get(key) or {}), key

    def instantiate_link_targets(self) -> dict[str, list[str]]:
        targets: dict[str, list[str]] = {}
        for link in self.parser.links:
            if link.apply_on == "instantiate":
                head, _, rest = link.target.partition(".")
                targets.setdefault(head, []).append(rest.removeprefix("init_args."))
        return targets

    def objects_for(self, section: str) -> dict[str, Any]:
        prefix = f"{section}."
        return {k[len(prefix):]: v for k, v in self.object_defaults.items() if k.startswith(prefix)}

    # --- showing --------------------------------------------------------------------------------------------
    def full_dump(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config as Lightning's `--print_config` shows it: every Trainer argument and fixed-class argument with
        a plain default filled in, in signature order, without the targets of instantiation links (they are not
        settable); re-running the dump gives the same run."""
        linked = self.instantiate_link_targets()
        dump: dict[str, Any] = {"seed_everything": config.get("seed_everything"),
                                "trainer": _in_signature_order(self.trainer_class, config.get("trainer") or {})}
        for key, group in self.parser.groups.items():
            if key == "trainer" or key not in config:
                continue
            value = config[key]
            if not group.subclass_mode and value is not None:
                value = _in_signature_order(group.cls, value)
            elif isinstance(value, dict):
                value = self._full_spec(value, key, ())
            if isinstance(value, dict):
                args = value.get("init_args", value) if group.subclass_mode else value
                for name in linked.get(key, ()):
                    args.pop(name, None)
            dump[key] = value
        for key in self.parser.registered():
            if isinstance(config.get(key), dict):
                first = "params" if key in self.parser.optimizer_keys() else "optimizer"
                dump[key] = self._full_spec(config[key], key, (first,))
        return {**dump, **{k: v for k, v in config.items() if k not in dump}}

    def _full_spec(self, spec: dict[str, Any], key: str, skip: tuple[str, ...]) -> dict[str, Any]:
        cls = self.class_of(spec, key)
        init_args = _in_signature_order(cls, dict(spec.get("init_args") or {}), skip)
        return {**spec, "init_args": init_args}

    def help_text(self, subcommand: str | None, subcommands: tuple[str, ...] | None) -> str:
        lines = [f"usage: {'SCRIPT ' + (subcommand or '{' + ','.join(subcommands) + '}') if subcommands else 'SCRIPT'}"
                 " [-c CONFIG] [--print_config] [--KEY=VALUE ...]", "", self.parser.description, "",
                 "  -c, --config CONFIG   a YAML config file (several merge in order)",
                 "  --print_config        print the full config and exit"]
        for key, argument in self.parser.arguments.items():
            lines.append(f"  --{key}  (default: {argument.default!r}){'  ' + argument.help if argument.help else ''}")
        for key, group in self.parser.groups.items():
            if group.subclass_mode:
                lines.append(f"  --{key}=CLASS, --{key}.ARG=VALUE   a {group.cls.__name__} subclass and its arguments")
                continue
            for name, param in signature_params(group.cls, ("self",)).items():
                default = "required" if param.default is inspect.Parameter.empty else f"default: {param.default!r}"
                lines.append(f"  --{key}.{name}  ({default})")
        for key in self.parser.registered():
            lines.append(f"  --{key}=CLASS, --{key}.ARG=VALUE")
        for name, param in self.method_args.items():
            lines.append(f"  --{name}  (default: {param.default!r})")
        return "\n".join(lines)


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _in_signature_order(cls: Any, given: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every argument of `cls` that is given or has a plain default, in signature order, then any others."""
    ordered = {n: given.get(n, p.default) for n, p in signature_params(cls, ("self", *skip)).items()
               if n in given or (p.default is not inspect.Parameter.empty and _yaml_able(p.default))}
    return {**ordered, **given}
