"""The Trainer's flags are written in three places (the constructor, `parse_flags`, the frozen `RunSpec`) and
described in docs/index.md: they must name the same flags with the same defaults."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from trainer import Trainer
from trainer.flags import RunSpec, parse_flags

INDEX = Path(__file__).resolve().parents[2] / "docs" / "index.md"
BUILT_BY_THE_TRAINER = {"callbacks", "logger", "profiler"}  # objects the Trainer builds itself, not spec values
RESOLVED_INTO_DEVICES = {"accelerator", "gpus"}  # become RunSpec.device_type and RunSpec.devices
ONLY_IN_SPEC = {"device_type"}


def _parameters(fn: object) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(fn).parameters.items() if name != "self"}  # type: ignore[arg-type]


def _documented_flags() -> set[str]:
    """The backquoted names in the first column of the flag table, `limit_{a,b}_batches` expanded."""
    text = INDEX.read_text()
    table = text[text.index("| flag | meaning |"):]
    names: set[str] = set()
    for row in table.splitlines()[2:]:
        if not row.startswith("|"):
            break
        for name in re.findall(r"`([^`]+)`", row.split("|")[1]):
            if match := re.fullmatch(r"(\w*)\{([\w,]+)\}(\w*)", name):
                names.update(match[1] + part + match[3] for part in match[2].split(","))
            else:
                names.add(name)
    return names


def test_constructor_and_parse_flags_take_the_same_flags_with_the_same_defaults():
    trainer = _parameters(Trainer.__init__)
    parsed = {name: p for name, p in _parameters(parse_flags).items() if name != "hardware"}
    assert set(trainer) - BUILT_BY_THE_TRAINER == set(parsed)
    assert {name: trainer[name].default for name in parsed} == {name: p.default for name, p in parsed.items()}


def test_every_parsed_flag_is_a_field_of_the_run_spec():
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    flags = set(_parameters(parse_flags)) - {"hardware"}
    assert fields - ONLY_IN_SPEC == flags - RESOLVED_INTO_DEVICES


def test_docs_index_describes_every_constructor_flag():
    assert set(_parameters(Trainer.__init__)) - _documented_flags() == set()
    assert _documented_flags() - set(_parameters(Trainer.__init__)) == set()
