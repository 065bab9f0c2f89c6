"""The architecture's rules that a grep can check: strategies are split by mechanism, not by flags inside them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ROOT / "strategies"


def _lines(path: Path) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if not line.lstrip().startswith("#")]


def test_no_strategy_branches_on_its_stage():
    """A ZeRO stage picks its class at construction; no method asks `self.stage` which one it is."""
    branch = re.compile(r"\bif\b.*\bself\.stage\b|\bself\.stage\s*(==|!=|<|>|in\b|not\s+in\b)")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(STRATEGIES.rglob("*.py"))
             for n, line in _lines(path) if branch.search(line)]
    assert found == []


def test_ddp_strategy_tests_no_wrapper_type():
    """DDPStrategy always wraps with DDP, so it never asks which wrapper its model has."""
    found = [f"ddp.py:{n}: {line.strip()}" for n, line in _lines(STRATEGIES / "ddp.py") if "isinstance(" in line]
    assert found == []


def _private_reads(path: Path) -> list[tuple[int, str, str]]:
    """(line, receiver, attribute) of every `receiver._name` in a file (dunders excluded)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append((node.lineno, ast.unparse(node.value), node.attr))
    return found


def _product_files() -> list[Path]:
    return sorted(p for package in ("trainer", "callbacks", "strategies") for p in (ROOT / package).rglob("*.py"))


def _names_the_trainer(receiver: str) -> bool:
    """`trainer`, `self.trainer`, `self._trainer`, `loop.trainer`, ...: an expression that is the Trainer."""
    return receiver.rsplit(".", 1)[-1] in ("trainer", "_trainer")


def test_only_trainer_py_reads_private_attributes_of_the_trainer():
    """The loops take the FitState; what other modules need from the Trainer is public."""
    found = [f"{path.relative_to(ROOT)}:{line}: {receiver}.{attr}" for path in _product_files()
             if path != ROOT / "trainer" / "trainer.py"
             for line, receiver, attr in _private_reads(path) if _names_the_trainer(receiver)]
    # properties.py is a mixin of the Trainer: it reads public state only, so `self._x` there is the Trainer's too
    found += [f"trainer/properties.py:{line}: self.{attr}" for line, receiver, attr in
              _private_reads(ROOT / "trainer" / "properties.py") if receiver == "self"]
    assert found == []


def test_callbacks_read_no_private_attribute_of_anything_but_themselves():
    """A third-party callback can do what ours do: everything they read is public."""
    found = [f"{path.name}:{line}: {receiver}.{attr}" for path in sorted((ROOT / "callbacks").glob("*.py"))
             for line, receiver, attr in _private_reads(path) if receiver not in ("self", "cls")]
    assert found == []


def test_design_doc_maps_every_module():
    """docs/design.md has one line per file of the three packages: a new module gets its line."""
    text = (ROOT / "docs" / "design.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in _product_files() if f"| `{p.relative_to(ROOT)}` |" not in text]
    assert missing == []


def _folders() -> list[Path]:
    return sorted({p.parent for p in _product_files()})


def test_design_doc_names_every_folder_and_nothing_that_is_gone():
    """docs/design.md has one line per folder, and no line for a file or folder that no longer exists."""
    text = (ROOT / "docs" / "design.md").read_text()
    missing = [f"{f.relative_to(ROOT)}/" for f in _folders() if f"| `{f.relative_to(ROOT)}/` |" not in text]
    named = re.findall(r"^\| `((?:trainer|strategies|callbacks)[^`]*)` \|", text, re.M)
    gone = [name for name in named if not (ROOT / name).exists()]
    assert (missing, gone) == ([], [])


def test_no_folder_of_trainer_or_strategies_holds_more_than_15_modules():
    """One concern per folder: past about a dozen modules a folder holds several (callbacks/ is one file per
    callback family, as Lightning's, and is not counted)."""
    crowded = {str(f.relative_to(ROOT)): n for f in _folders() if f.relative_to(ROOT).parts[0] != "callbacks"
               if (n := len(list(f.glob("*.py")))) > 15}
    assert crowded == {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, modules: set[str], name: str) -> set[str]:
    """The project modules `path` imports when it runs: module-level or inside a function, not under
    TYPE_CHECKING (those never run). `from pkg import name` counts `pkg.name` when that is a module, else `pkg`."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(node.test) for n in ast.walk(node)}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found: set[str | None] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(owner(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(owner(f"{node.module}.{alias.name}") or owner(node.module) for alias in node.names)
    return {m for m in found if m is not None} - {name}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other through imports (the strongly connected components of more
    than one module), each sorted."""
    reach = {node: _reachable(graph, node) for node in graph}
    circles = {tuple(sorted(n for n in reach[node] if node in reach[n])) for node in graph if node in reach[node]}
    return sorted(list(c) for c in circles)


def test_no_import_circles():
    """No two modules of the three packages import each other, directly or through others, at module level or
    inside a function: a circle is broken by moving the shared piece down, not by importing late."""
    files = _product_files()
    modules = {_module_name(p) for p in files}
    graph = {_module_name(p): _runtime_imports(p, modules, _module_name(p)) for p in files}
    assert _circles(graph) == []


def test_the_circle_check_finds_a_circle_through_a_function_local_import(tmp_path):
    """The check above can fail: an import inside a function counts, one under TYPE_CHECKING does not, and a
    three-module loop is found."""
    source = tmp_path / "c.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n"
                      "def f():\n    from pkg.a import thing\n")
    found = _runtime_imports(source, {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"}, "pkg.c")
    graph = {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": found, "pkg.d": {"pkg.a"}}
    assert (found, _circles(graph)) == ({"pkg.a"}, [["pkg.a", "pkg.b", "pkg.c"]])
