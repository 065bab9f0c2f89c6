"""The Trainer's flags are defined once, in `trainer.setup.flags.FLAGS`; the constructor's signature, the frozen
`RunSpec` and docs/index.md must name the same flags, with the table's defaults."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from strategies.exceptions import ConfigError
from trainer import Trainer
from trainer.setup.flags import FLAG_NAMES, FLAGS, RunSpec, parse_flags

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


def test_the_constructor_takes_the_table_flags_with_the_table_defaults():
    trainer = _parameters(Trainer.__init__)
    assert set(trainer) - BUILT_BY_THE_TRAINER == set(FLAG_NAMES)
    assert {flag.name: trainer[flag.name].default for flag in FLAGS} == {flag.name: flag.default for flag in FLAGS}


def test_every_table_flag_is_a_field_of_the_run_spec():
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    assert fields - ONLY_IN_SPEC == set(FLAG_NAMES) - RESOLVED_INTO_DEVICES


def test_the_constructor_passes_every_flag_to_the_spec():
    """A value given to the constructor reaches the spec: none is dropped between signature and table."""
    trainer = Trainer(max_steps=7, log_every_n_steps=3, agree_every_n_steps=2, gradient_clip_algorithm="value",
                      enable_progress_bar=False, logger=False, accelerator="cpu", devices=1)
    spec = trainer.fit_state.spec
    assert (spec.max_steps, spec.log_every_n_steps, spec.agree_every_n_steps) == (7, 3, 2)
    assert (spec.gradient_clip_algorithm, spec.enable_progress_bar, spec.max_epochs) == ("value", False, -1)


def test_an_unknown_flag_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"unknown Trainer flag.*max_epoch;"):
        parse_flags(max_epoch=3)


def test_docs_index_describes_every_constructor_flag():
    assert set(_parameters(Trainer.__init__)) - _documented_flags() == set()
    assert _documented_flags() - set(_parameters(Trainer.__init__)) == set()
