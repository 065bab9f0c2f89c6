"""Whether a `training_step` can return None (skip the batch), read once per run from its source.

Why: with several processes a batch that one rank skips must be skipped by every rank, and that has to be known
before backward (a rank that leaves out backward leaves the others waiting in the gradient all-reduce). Learning it
takes a round trip that nothing can overlap, so trainer/ranks/agreement.py pays it only for a step whose code can return
None; every other step gets the overlapped agreement.

The reading errs towards "can". It can when a `return` gives None (`return None`, a bare `return`, a local that is
ever set to None, `x if c else None`), when the end of the function can be reached, when it returns what one of the
module's own methods returns (`return self.shared_step(batch)`, or a local set from such a call) and that method
can (followed a few calls deep), and whenever the source cannot be read. Calls into anything else (torch, a
submodule) are taken to return a value. A step that returns None anyway is refused on the rank that sees it, with
this rule in the message.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import weakref
from collections.abc import Callable
from typing import Any

# Methods defined in these packages are the framework's or torch's: they are not followed.
_FRAMEWORK_PACKAGES = ("trainer", "callbacks", "strategies", "torch", "lightning", "pytorch_lightning")
_DEPTH = 3
_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _function_node(fn: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _walk_own(node: ast.AST) -> list[ast.AST]:
    """The nodes of one function body, without those of functions or classes defined inside it."""
    found, todo = [], list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        found.append(child)
        if not isinstance(child, _OWN_SCOPE):
            todo.extend(ast.iter_child_nodes(child))
    return found


def _terminates(body: list[ast.stmt]) -> bool:
    """Whether running `body` always ends in a return or raise (else the function can fall off its end)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.If):
        return _terminates(last.body) and _terminates(last.orelse)
    if isinstance(last, (ast.With, ast.AsyncWith)):
        return _terminates(last.body)
    if isinstance(last, ast.Try):
        if _terminates(last.finalbody):
            return True
        normal = _terminates(last.body) or _terminates(last.orelse)
        return normal and all(_terminates(handler.body) for handler in last.handlers)
    return False


class _Reader:
    """One function's reading: which values its returns can be, given its class for `self.<method>` calls."""

    def __init__(self, fn: Callable[..., Any], owner: type | None, depth: int) -> None:
        self.fn, self.owner, self.depth = fn, owner, depth

    def may_return_none(self) -> bool:
        node = _function_node(self.fn)
        if node is None or self.depth == 0:
            return True
        nodes = _walk_own(node)
        self.assigned: dict[str, list[ast.expr]] = {}
        for n in nodes:
            if isinstance(n, ast.Assign):
                for target in n.targets:
                    if isinstance(target, ast.Name):
                        self.assigned.setdefault(target.id, []).append(n.value)
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
                self.assigned.setdefault(n.target.id, []).append(n.value)
        if not _terminates(node.body):
            return True
        return any(self._can_be_none(n.value, set()) for n in nodes if isinstance(n, ast.Return))

    def _can_be_none(self, value: ast.expr | None, seen: set[str]) -> bool:
        if value is None or (isinstance(value, ast.Constant) and value.value is None):
            return True
        if isinstance(value, ast.IfExp):
            return self._can_be_none(value.body, seen) or self._can_be_none(value.orelse, seen)
        if isinstance(value, ast.BoolOp):
            return any(self._can_be_none(v, seen) for v in value.values)
        if isinstance(value, ast.Name) and value.id not in seen:
            seen.add(value.id)
            return any(self._can_be_none(v, seen) for v in self.assigned.get(value.id, []))
        if isinstance(value, ast.Call):
            return self._call_can_be_none(value.func)
        return False

    def _call_can_be_none(self, func: ast.expr) -> bool:
        """`self.m(...)` or `super().m(...)` with `m` the user's own method: whether `m` can return None."""
        if self.owner is None or not isinstance(func, ast.Attribute):
            return False
        target = func.value
        if isinstance(target, ast.Name) and target.id == "self":
            method = _own_method(self.owner.__mro__, func.attr)
        elif isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super":
            method = _own_method(_after_definer(self.owner, self.fn), func.attr)
        else:
            return False
        return method is not None and _Reader(method, self.owner, self.depth - 1).may_return_none()


def _own_method(classes: tuple[type, ...], name: str) -> Callable[..., Any] | None:
    """The first `name` in `classes` when the user's code defines it (not the framework's, not an attribute)."""
    for cls in classes:
        if name in cls.__dict__:
            if cls.__module__.split(".")[0] in _FRAMEWORK_PACKAGES:
                return None
            member = cls.__dict__[name]
            return member if inspect.isfunction(member) else None
    return None


def _after_definer(owner: type, fn: Callable[..., Any]) -> tuple[type, ...]:
    """The classes after the one that defines `fn` in `owner`'s MRO: where `super()` inside `fn` looks."""
    plain = getattr(fn, "__func__", fn)
    mro = owner.__mro__
    for i, cls in enumerate(mro):
        if any(member is plain for member in cls.__dict__.values()):
            return mro[i + 1:]
    return mro[1:]


# class -> {step function: can skip}; weak, so that classes made on the fly (tests, notebooks) are not kept alive
_READ: weakref.WeakKeyDictionary[type, dict[Callable[..., Any], bool]] = weakref.WeakKeyDictionary()


def training_step_may_skip(module: Any) -> bool:
    """Whether `module.training_step` can return None (see the module docstring for the rule). Read once per class
    and step function: reading the source costs ~0.4 ms, a tenth of a fit's set-up."""
    step = getattr(module, "training_step", None)
    if step is None:
        return True
    owner, fn = type(module), inspect.unwrap(getattr(step, "__func__", step))
    known = _READ.setdefault(owner, {})
    if fn not in known:
        known[fn] = _Reader(fn, owner, _DEPTH).may_return_none()
    return known[fn]
