"""The hyperparameters a logger receives, as a plain dict, and the `hparams.yaml` CSVLogger and TensorBoardLogger
write beside their run (Lightning's file: nested mappings stay nested, so `yaml.safe_load` reads back the dict)."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from enum import Enum
from typing import Any

from strategies.checkpoint_io.filesystem import AnyPath, makedirs, open_file, parent


def params_dict(params: Any) -> dict[str, Any]:
    """`params` (a dict, an `argparse.Namespace`, an omegaconf config, an AttributeDict, or None) as a plain dict."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        return dict(vars(params))
    if type(params).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        container = OmegaConf.to_container(params, resolve=True)
        return {str(k): v for k, v in container.items()} if isinstance(container, Mapping) else {"value": container}
    return dict(params)


def yaml_ready(value: Any) -> Any:
    """`value` as YAML's safe dumper takes it: mappings and sequences kept, a Namespace as a mapping, an enum by its
    name, a 0-d tensor or numpy scalar as its number, a class or function by its import path, anything else as its
    text (a logger's file is for reading, not for rebuilding objects)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (Namespace, Mapping)) or type(value).__module__.startswith("omegaconf"):
        return {str(k) if not isinstance(k, (int, float, bool)) else k: yaml_ready(v)
                for k, v in params_dict(value).items()}
    if isinstance(value, (list, tuple)):
        return [yaml_ready(v) for v in value]
    if hasattr(value, "ndim") and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return yaml_ready(value.item())
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}".lstrip(".")
    return str(value)


def write_hparams_yaml(path: AnyPath, params: Mapping[str, Any]) -> None:
    """Write `params` to `path` (local or a URL) as YAML, its folder created if needed."""
    import yaml  # PyYAML, installed with omegaconf; imported here to keep `import trainer` light

    makedirs(parent(path))
    with open_file(path, "w") as handle:
        yaml.safe_dump(yaml_ready(dict(params)), handle, sort_keys=False)
