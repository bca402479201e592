"""The tests pytest collects from one file, read statically (`ast`, nothing imported), as
the witness expects them (`validation.witness`): module-level `test*` functions, methods
`test*` of classes named `Test*` without `__init__` and of `unittest.TestCase` subclasses,
each named as in a pytest node id (`test_a`, `TestX::test_b`).

What this reads is a lower bound: a test it does not see (inherited, defined in a loop,
under an `if`, by a plugin) is not required. A test that may legitimately not pass is not
required either: one the file marks `skip`/`skipif`/`xfail` (on the test, its class or the
module's `pytestmark`), one whose body may skip (`pytest.skip`, `pytest.xfail`,
`pytest.importorskip`, `self.skipTest`, `SkipTest`), an `async def` (a plugin runs it, or
pytest skips it), a module that skips itself at import, or `__test__ = False`."""

from __future__ import annotations

import ast
import posixpath
from dataclasses import dataclass, field

MAY_SKIP = {"skip", "skipif", "xfail", "importorskip", "skipTest", "SkipTest", "skipUnless", "expectedFailure"}


@dataclass(frozen=True)
class TestFile:
    __test__ = False  # a record, not a test class

    required: frozenset[str] = field(default_factory=frozenset)
    # pytest's default `python_files` (`test_*.py`, `*_test.py`): collected from a folder.
    named_as_test: bool = False


def collect(path: str, source: bytes) -> TestFile:
    name = posixpath.basename(path)
    named = name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError):  # pytest fails to collect it: the check fails on its own
        return TestFile(named_as_test=named)
    if _module_may_skip(module):
        return TestFile(named_as_test=named)
    required: set[str] = set()
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and _is_test(node):
            required.add(node.name)
        elif isinstance(node, ast.ClassDef) and _collected_class(node) and not _class_may_skip(node):
            required |= {f"{node.name}::{m.name}" for m in node.body if isinstance(m, ast.FunctionDef) and _is_test(m)}
    return TestFile(required=frozenset(required), named_as_test=named)


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute used under `node`."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def _class_may_skip(node: ast.ClassDef) -> bool:
    """Skip decorators on the class, or a skip in a method that is not a test (`setUp`,
    `setUpClass`, `setup_method`: every test of the class may skip through it)."""
    if _may_skip(node.decorator_list):
        return True
    helpers = [m for m in node.body if isinstance(m, ast.FunctionDef) and not m.name.startswith("test")]
    return any(_names(m) & MAY_SKIP for m in helpers)


def _may_skip(decorators: list[ast.expr]) -> bool:
    return any(_names(d) & MAY_SKIP for d in decorators)


def _is_test(node: ast.FunctionDef) -> bool:
    if not node.name.startswith("test") or _may_skip(node.decorator_list):
        return False
    if any("fixture" in _names(d) for d in node.decorator_list):
        return False
    return not (_names(node) & MAY_SKIP)


def _dunder_test_false(body: list[ast.stmt]) -> bool:
    for stmt in body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__test__" for t in stmt.targets):
            return not (isinstance(stmt.value, ast.Constant) and stmt.value.value is True)
    return False


def _pytestmark_skips(body: list[ast.stmt]) -> bool:
    for stmt in body:
        targets = (
            stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) and _names(stmt) & MAY_SKIP:
            return True
    return False


def _module_may_skip(module: ast.Module) -> bool:
    """`__test__ = False`, a `pytestmark` that skips, or a skip at import (outside functions)."""
    if _dunder_test_false(module.body) or _pytestmark_skips(module.body):
        return True
    for stmt in module.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if _names(stmt) & MAY_SKIP:
            return True
    return False


def _collected_class(node: ast.ClassDef) -> bool:
    if _dunder_test_false(node.body) or _pytestmark_skips(node.body):
        return False
    unittest_case = any(
        (isinstance(b, ast.Name) and b.id.endswith("TestCase"))
        or (isinstance(b, ast.Attribute) and b.attr.endswith("TestCase"))
        for b in node.bases
    )
    if unittest_case:
        return True
    has_init = any(isinstance(m, ast.FunctionDef) and m.name in ("__init__", "__new__") for m in node.body)
    return node.name.startswith("Test") and not has_init
