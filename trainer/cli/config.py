"""Reading a run's config: YAML files merged in order, then dotted command-line overrides (omegaconf), with
every mistake reported as `CLIError` naming the file (or the command line) and the key path."""

from __future__ import annotations

import io
import os
import random
import re
import stat
from typing import Any, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from strategies.exceptions import ConfigError
from trainer.seed import SEED_ENV, seed_everything

SECTIONS = ("model", "data", "trainer", "callbacks", "logger", "seed_everything", "ckpt_path")
MAX_CONFIG_BYTES = 8 << 20  # configs are kilobytes; a larger file is a mistake (or an attack), not a config
MAX_ALIAS_NODES = 10_000  # values YAML aliases may add to a config (omegaconf 2.4's own default bound, ours too)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: fast, and it refuses 1,000+ nesting levels
COMMAND_LINE = "command line"


class CLIError(ConfigError):
    """A mistake in the config or command line; `trainer.cli.main` prints it and exits with code 2."""


class ConfigSources:
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


def read_text(path: str) -> str:
    """The file's text; a file that is not UTF-8 (YAML's encoding here) is named with the first bad byte's place.
    Only a regular file of at most MAX_CONFIG_BYTES is read (a FIFO or /dev/zero would block or never end)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise CLIError(f"{path}: config file not found") from None
    except OSError as exc:
        raise CLIError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a FIFO, device or socket)"
        raise CLIError(f"{path}: is {kind}; --config takes a YAML file")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise CLIError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise CLIError(f"{path}: is {max(info.st_size, len(raw))} bytes; a config may hold at most "
                       f"{MAX_CONFIG_BYTES >> 20} MiB (is it the right file? data belongs in files the config names)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise CLIError(
            f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column {column}; save the config "
            "as UTF-8 (e.g. with iconv -f latin1 -t utf-8)"
        ) from None


def check_yaml(text: str, where: str) -> None:
    """Refuse YAML whose aliases expand to more than MAX_ALIAS_NODES extra values (a "billion laughs": 1 KB that
    omegaconf would expand for minutes), or refer to themselves, before anything expands them. Our own bound,
    whatever omegaconf's version or its OMEGACONF_MAX_YAML_EXPANDED_NODES setting."""
    try:
        root = yaml.compose(text, Loader=_LOADER)  # the node graph: an alias is one shared node, nothing expanded
    except yaml.YAMLError as exc:
        raise _malformed(where, exc) from None
    except RecursionError:
        raise CLIError(f"{where}: malformed YAML: nested too deeply to read") from None
    if root is None:
        return
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        kids = _children(node)
        if done:
            active.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(kid)] for kid in kids)
        elif id(node) in active:
            raise CLIError(f"{where}: a YAML alias refers to the value that holds it (line {node.start_mark.line + 1})"
                           "; such a value would never end")
        elif id(node) not in sizes:
            active.add(id(node))
            stack.append((node, True))
            stack.extend((kid, False) for kid in kids if id(kid) not in sizes)
    extra = sizes[id(root)] - len(sizes)
    if extra > MAX_ALIAS_NODES:
        raise CLIError(f"{where}: its YAML aliases (*name) expand to {extra} more values, over the limit of "
                       f"{MAX_ALIAS_NODES}; write the values out, or refer to them with ${{...}} interpolation")


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _malformed(where: str, exc: yaml.YAMLError) -> CLIError:
    mark = getattr(exc, "problem_mark", None)
    place = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return CLIError(f"{where}: malformed YAML{place}: {problem}")


def load_file(path: str) -> Any:
    """One config file as an OmegaConf mapping; malformed YAML and a top level that is not a mapping are named."""
    text = read_text(path)
    check_yaml(text, path)
    try:
        top = yaml.load(text, Loader=_LOADER)  # only to name what the top level is, before omegaconf reads it
        cfg = OmegaConf.load(io.StringIO(text)) if isinstance(top, dict) else None
    except yaml.YAMLError as exc:
        raise _malformed(path, exc) from None
    except (ValueError, RecursionError, OmegaConfBaseException) as exc:  # a 100k-digit int, ...
        raise CLIError(f"{path}: a value cannot be read: {str(exc).splitlines()[0][:300]}") from None
    if top is None:
        return OmegaConf.create({})  # an empty file: the sections' checks below say what is missing
    if cfg is None or not OmegaConf.is_dict(cfg):
        raise CLIError(
            f"{path}: the top level is {type(top).__name__} {top!r}, but a config must be a mapping of sections "
            f"({', '.join(SECTIONS)}), e.g. model: {{class_path: package.module.Class}}"
        )
    return cfg


def load_config(paths: list[str], overrides: list[str], sources: ConfigSources) -> Any:
    """Read and merge the config files in order, then apply the dotted overrides."""
    configs = []
    for path in paths:
        cfg = load_file(path)
        configs.append(cfg)
        sources.items.append((path, OmegaConf.to_container(cfg, resolve=False)))
    for item in overrides:
        if "=" not in item or item.startswith("-"):
            raise CLIError(f"{COMMAND_LINE}: {item!r}: expected an override key.sub=value (or an option)")
        check_yaml(item.split("=", 1)[1], f"{COMMAND_LINE}: {item[:80]!r}")
        try:
            cfg = OmegaConf.from_dotlist([item])
        except (yaml.YAMLError, OmegaConfBaseException, ValueError, RecursionError) as exc:
            raise CLIError(f"{COMMAND_LINE}: {item[:200]!r}: cannot parse: {str(exc).splitlines()[0][:300]}") \
                from None
        configs.append(cfg)
        sources.items.append((COMMAND_LINE, OmegaConf.to_container(cfg, resolve=False)))
    try:
        return OmegaConf.merge(*configs) if configs else OmegaConf.create({})
    except OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", "") or "")
        raise sources.error(key, f"cannot merge: {str(exc).splitlines()[0]}") from None


def resolve_config(cfg: Any, sources: ConfigSources) -> dict[str, Any]:
    """Interpolations (`${trainer.max_epochs}`, `${oc.env:VAR,default}`) become plain values."""
    try:
        # A mapping: every file's top level was checked to be one (OmegaConf types the result as any container).
        return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    except InterpolationResolutionError as exc:
        key = str(exc.full_key or "")
        raise sources.error(key, f"cannot resolve interpolation: {str(exc).splitlines()[0]}") from None


def apply_seed(value: Any) -> Any:
    """`seed_everything` of a config: an int seeds (workers too, as LightningCLI does); `true` picks a seed (the one
    launched ranks inherit, if set) and returns it, to be recorded in the saved config; null/false seed nothing."""
    if value is True:
        value = int(os.environ.get(SEED_ENV) or random.randrange(2**31))
    if value is not None and value is not False:
        seed_everything(value, workers=True)
    return value
