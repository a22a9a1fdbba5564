"""The fast manager stays a facade (docs/architecture.md, "The fast manager").

Why a test: the parts own their state and the manager only checks
arguments and delegates. Two regressions creep in unseen: a manager method
that grows into an operation again, and a part that reads another part
through a third (``self.appends.store``), so that the owner of a piece of
state is no longer the only code that knows where it lives."""

from __future__ import annotations

import ast
from pathlib import Path

FAST = Path(__file__).resolve().parents[1] / "fast"
MAX_METHOD_LINES = 16  # a body (docstring aside) that a reader takes in at a glance
# The manager's parts, by the attribute names they are held under.
PARTS = {"store", "rows", "key_space", "tracker", "sync", "allocations", "appends", "swaps", "batch", "row_api"}


def _body_lines(function: ast.FunctionDef) -> int:
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_manager_methods_are_short():
    tree = ast.parse((FAST / "manager.py").read_text())
    manager = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "FastBlockSpaceManager"
    )
    long = {
        node.name: _body_lines(node)
        for node in manager.body
        if isinstance(node, ast.FunctionDef) and _body_lines(node) > MAX_METHOD_LINES
    }
    assert not long, f"fast/manager.py methods longer than {MAX_METHOD_LINES} lines (move the work into a part): {long}"


def _reaches_through(node: ast.AST) -> bool:
    """``<x>.<part>.<part>``: a part read through another part (the
    store's own fields, such as its ``tracker`` arrays, are state, not parts)."""
    if not isinstance(node, ast.Attribute) or node.attr not in PARTS:
        return False
    holder = node.value  # ``appends.store`` or ``self.appends.store``
    name = holder.attr if isinstance(holder, ast.Attribute) else holder.id if isinstance(holder, ast.Name) else None
    return name in PARTS - {"store"}


def test_no_part_is_read_through_another():
    found = []
    for path in sorted(FAST.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if _reaches_through(node):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert not found, f"parts read through another part (hand the part over instead): {found}"


def test_the_check_finds_a_part_read_through_another():
    """The check above can fail: it flags the shape it forbids."""
    assert _reaches_through(ast.parse("self.appends.store").body[0].value)
    assert _reaches_through(ast.parse("appends.rows").body[0].value)
    assert not _reaches_through(ast.parse("self.store.tracker").body[0].value)
