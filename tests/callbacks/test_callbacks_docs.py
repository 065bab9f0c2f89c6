"""Every ```python snippet of docs/callbacks.md runs as written: each in a fresh namespace, in a scratch working
folder. The snippets are found by their fences, so a new section is covered without a change here.

A snippet that needs something this test cannot give (a GPU, a service) is marked on the line before its fence with
`<!-- docs-test: skip REASON -->`; the reason is required, and such marks should stay rare.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

OURS = ("trainer", "callbacks", "strategies")
DOC = Path(__file__).resolve().parents[2] / "docs" / "callbacks.md"
_FENCE = re.compile(r"(?:<!-- docs-test: skip (?P<reason>[^>]*?)\s*-->\n)?^```python\n(?P<code>.*?)^```", re.S | re.M)


def _snippets() -> list[tuple[int, str, str | None]]:
    text = DOC.read_text()
    return [(text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("reason"))
            for m in _FENCE.finditer(text)]


SNIPPETS = _snippets()


def test_the_page_has_snippets_and_every_skip_gives_a_reason():
    assert len(SNIPPETS) >= 5
    assert all(reason is None or reason.strip() for _, _, reason in SNIPPETS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("line", "code", "reason"), SNIPPETS, ids=[f"line{line}" for line, _, _ in SNIPPETS])
def test_snippet_runs(line: int, code: str, reason: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if reason is not None:
        pytest.skip(f"docs/callbacks.md:{line}: {reason}")
    monkeypatch.chdir(tmp_path)  # whatever a snippet writes (logs, checkpoints, plots) lands in the scratch folder
    monkeypatch.setenv("MPLBACKEND", "Agg")
    padded = "\n" * (line - 1) + code  # tracebacks then give the line in docs/callbacks.md
    try:
        exec(compile(padded, "docs/callbacks.md", "exec"), {"__name__": "__docs__"})
    except ModuleNotFoundError as err:  # an optional package (rich, ...) this environment lacks: not the doc's fault
        top = (err.name or "").split(".")[0]
        if not top or top in OURS or importlib.util.find_spec(top) is not None:
            raise
        pytest.skip(f"docs/callbacks.md:{line} needs the optional package {top!r}")
