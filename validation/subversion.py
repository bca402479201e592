"""A deterministic scan of the files the implementation changed or added since the base
revision for known ways to subvert a test process from inside it (docs/TRUTH.md, "What
the host can and cannot prove about code that runs inside a check's process").

It is a heuristic: it names forms, it proves nothing, and code written to hide them gets
past it. A finding therefore asks a person (`blocked`, "suspected tampering: …", stop
reason `suspected_tampering`) instead of failing the implementation. It looks for:

- a process ended at import time: `os._exit`, `sys.exit`, `exit`, `quit`,
  `os.kill(os.getpid(), …)` or `raise SystemExit` outside functions and outside
  `if __name__ == "__main__":` (a `__main__.py` is a program, not a module: not scanned
  for these), and `os._exit` in a file that registers an `atexit` function;
- an assignment, `del` or `setattr` into the test frameworks or the builtins (`unittest.…`,
  `pytest.…`, `_pytest.…`, `builtins.…`, `__builtins__`, `TestCase.assert… =`, through any
  import alias), and `patch("unittest.…")`-style string targets into the frameworks;
- pytest hooks that rewrite reports or decide which tests run, in a file outside the
  protected paths (`pytest_runtest_makereport`, `pytest_report_teststatus`, …), and
  `pytest_sessionfinish`/`pytest_terminal_summary`/`pytest_unconfigure` that set an exit
  status or end the process;
- an assignment, `del` or `setattr` at import time into the standard library (a module or
  class of it reached through an import: `pathlib.Path.read_text = …`, `os.path.exists = …`),
  which would change what the protected tests read; a few settings a program may set at
  start (`sys.path`, `sys.argv`, `sys.dont_write_bytecode`, `sys.tracebacklimit`) and item
  assignments (`os.environ["X"] = …`) are not findings;
- a `sitecustomize.py`, `usercustomize.py` or `*.pth` file added or changed, a compiled
  `*.pyc`/`*.pyo` file (imported instead of the source the scan reads), a Python file past
  `MAX_FILE_BYTES` or nested too deeply for `ast` (it would hide what it holds).

Python files are read with `ast` (one that does not parse is not a finding: it cannot run
either). The scan runs once per run with a run check (cached on the run's context) and
needs the mission's base revision: without one, what the implementation changed is unknown.
"""

from __future__ import annotations

import ast
import posixpath
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusion_site.runtime.redact import bounded
from validation import protect
from validation.verdict import AssertionVerdict, Evidence, escape_invisible

PREFIX = "suspected tampering: "
FRAMEWORKS = ("unittest", "pytest", "_pytest", "pluggy")
TAMPERED_MODULES = (*FRAMEWORKS, "builtins", "__builtins__")
STARTUP_FILES = {"sitecustomize.py", "usercustomize.py"}
REPORT_HOOKS = {
    "pytest_runtest_makereport",
    "pytest_report_teststatus",
    "pytest_runtest_logreport",
    "pytest_runtest_protocol",
    "pytest_runtest_call",
    "pytest_pyfunc_call",
    "pytest_runtestloop",
    "pytest_collection_modifyitems",
    "pytest_ignore_collect",
    "pytest_deselected",
    "pytest_assertion_pass",
    "pytest_assertrepr_compare",
}
END_HOOKS = {"pytest_sessionfinish", "pytest_terminal_summary", "pytest_unconfigure"}
MAX_FILE_BYTES = 2_000_000
# The standard library as the service's Python knows it (the judged code's may differ by a
# module or two); the settings of it a program may set at start are not findings.
STDLIB = frozenset(sys.stdlib_module_names) - {"__future__"}
START_SETTINGS = {"sys.path", "sys.argv", "sys.dont_write_bytecode", "sys.tracebacklimit"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def run_findings(ctx: Any) -> list[Finding]:
    """The findings in what the run's implementation changed, scanned once per run."""
    with ctx.extra.setdefault("subversion_lock", threading.Lock()):  # one run's check threads
        if "subversion" not in ctx.extra:
            ctx.extra["subversion"] = _scan_run(ctx)
        return ctx.extra["subversion"]


def _scan_run(ctx: Any) -> list[Finding]:
    protection = ctx.protection
    if not protection.base or protection.source is None or ctx.checkout is None:
        return []
    root = Path(ctx.checkout)
    found: list[Finding] = []
    for rel in protection.diff().changed:
        if rel in protection.changed or rel in protection.added:
            continue  # restored from the base, or set aside, before any check runs
        if protection.paths and protect.matches(rel, protection.paths):
            continue
        target = root / rel
        if target.is_symlink() or not target.is_file():
            continue
        if target.stat().st_size > MAX_FILE_BYTES and rel.endswith((".py", ".pth")):
            # Padding a module past what the scan reads would hide every form in it.
            found.append(Finding(rel, 1, f"larger than the {MAX_FILE_BYTES} bytes the scan reads"))
            continue
        found += scan_file(rel, target.read_bytes()[: MAX_FILE_BYTES + 1])
    return found


def scan_file(rel: str, content: bytes) -> list[Finding]:
    name = posixpath.basename(rel)
    found = []
    if name in STARTUP_FILES or name.endswith(".pth"):
        found.append(Finding(rel, 1, f"{name} runs in every Python process started here"))
    if name.endswith((".pyc", ".pyo")):
        # Compiled code is imported instead of (or without) its source, which is what the
        # scan reads: an unchecked-hash `.pyc` runs whatever the `.py` beside it says.
        found.append(Finding(rel, 1, f"{name}: compiled Python runs instead of the source the scan reads"))
    if not name.endswith(".py"):
        return found
    try:
        module = ast.parse(content)
    except (SyntaxError, ValueError):
        return found  # it cannot be imported either
    except (RecursionError, MemoryError):
        return [*found, Finding(rel, 1, "nested too deeply for the scan to read")]
    aliases = _aliases(module)
    if name != "__main__.py":
        found += [Finding(rel, line, what) for line, what in _exits_at_import(module.body, aliases)]
        found += [Finding(rel, line, what) for line, what in _stdlib_patched_at_import(module.body, aliases)]
    found += [Finding(rel, line, what) for line, what in _everywhere(module, aliases)]
    return sorted(set(found), key=lambda f: (f.line, f.what))


def _aliases(module: ast.Module) -> dict[str, str]:
    """Local name -> the dotted module path it stands for, for imports of the modules that
    matter here (`import unittest as u`, `from unittest import TestCase`, `from os import _exit`)."""
    names = {"__builtins__": "builtins"}
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str:
    """`a.b.c` with its first name resolved through the imports; '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Subscript):  # `__builtins__["x"]`
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _in(dotted: str, modules: tuple[str, ...]) -> bool:
    return any(dotted == m or dotted.startswith(m + ".") for m in modules)


def _exit_call(node: ast.AST, aliases: dict[str, str]) -> str:
    """What process exit `node` is, or ''."""
    if isinstance(node, ast.Raise) and node.exc is not None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return "raise SystemExit" if _dotted(exc, aliases) in ("SystemExit", "builtins.SystemExit") else ""
    if not isinstance(node, ast.Call):
        return ""
    called = _dotted(node.func, aliases)
    if called in ("os._exit", "sys.exit", "exit", "quit", "builtins.exit", "posix._exit"):
        return f"{called}()"
    if called == "os.kill" and node.args and "getpid" in _dotted(getattr(node.args[0], "func", node.args[0]), aliases):
        return "os.kill(os.getpid(), …)"
    return ""


def _main_guard(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _exits_at_import(body: list[ast.stmt], aliases: dict[str, str]) -> list[tuple[int, str]]:
    """Process exits in statements that run when the module is imported."""
    return [
        (_line(node), f"{what} at import time ends the test process before the tests report")
        for node in _at_import(body)
        if isinstance(node, (ast.Call, ast.Raise)) and (what := _exit_call(node, aliases))
    ]


def _at_import(body: list[ast.stmt]) -> list[ast.AST]:
    """The nodes that run when the module is imported: the module's and its class bodies,
    not functions, not the `__main__` guard."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
            isinstance(node, ast.If) and _main_guard(node)
        ):
            continue
        found.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return found


def _line(node: ast.AST) -> int:
    return int(getattr(node, "lineno", 1))


def _stdlib_target(node: ast.AST, aliases: dict[str, str]) -> str:
    """The standard-library attribute `node` (an attribute chain from an imported name)
    names, or ''."""
    if not isinstance(node, ast.Attribute):
        return ""  # a name is local; an item (`os.environ["X"]`) is data, not behaviour
    root: ast.expr = node
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name) or root.id not in aliases:
        return ""
    dotted = _dotted(node, aliases)
    if dotted.split(".")[0] not in STDLIB or dotted in START_SETTINGS or _in(dotted, TAMPERED_MODULES):
        return ""  # the frameworks and the builtins have findings of their own, wherever they are
    return dotted


def _stdlib_patched_at_import(body: list[ast.stmt], aliases: dict[str, str]) -> list[tuple[int, str]]:
    """Assignments, `del` and `setattr` into the standard library when the module is
    imported: the protected tests then read through a patched `pathlib` or `os`."""
    found = []
    for node in _at_import(body):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and node.args and _dotted(node.func, aliases) in ("setattr", "delattr"):
            first = node.args[0]
            name = node.args[1] if len(node.args) > 1 else None
            attr = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else "…"
            if dotted := _stdlib_target(ast.Attribute(value=first, attr=attr), aliases):
                found.append((_line(node), f"setattr() on {dotted} at import time changes what the tests read"))
            continue
        for target in targets:
            if dotted := _stdlib_target(target, aliases):
                found.append((_line(node), f"assignment into {dotted} at import time changes what the tests read"))
    return found


def _everywhere(module: ast.Module, aliases: dict[str, str]) -> list[tuple[int, str]]:
    found = []
    exits = []
    registers_atexit = False
    for node in ast.walk(module):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                dotted = _dotted(target, aliases)
                if _rewrites_framework(target, dotted):
                    found.append((node.lineno, f"assignment into {dotted} changes how tests run or report"))
        elif isinstance(node, ast.Call):
            called = _dotted(node.func, aliases)
            registers_atexit = registers_atexit or called == "atexit.register"
            if called in ("os._exit", "posix._exit"):
                exits.append(node.lineno)
            found += _call_finding(node, called, aliases)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _hook_finding(node, aliases)
    if registers_atexit:
        found += [(line, "os._exit() with an atexit function: the exit status is not the tests'") for line in exits]
    return found


def _rewrites_framework(target: ast.AST, dotted: str) -> bool:
    if not isinstance(target, (ast.Attribute, ast.Subscript)):
        return False  # rebinding a local name changes no module
    if _in(dotted, TAMPERED_MODULES):
        return True
    parts = dotted.split(".")
    # `SomeTestCase.assertEqual = …`: any class's assertions, not an instance's own (`self.…`).
    return len(parts) >= 2 and parts[0] not in ("self", "cls") and parts[-1].startswith(("assert", "fail"))


def _framework_target(node: ast.expr, aliases: dict[str, str], modules: tuple[str, ...]) -> str:
    """The framework part `node` names (`unittest.TestCase`, a class `…TestCase`, or a
    string `"unittest.TestCase.assertEqual"`), or ''."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if _in(node.value, FRAMEWORKS) else ""
    dotted = _dotted(node, aliases)
    return dotted if _in(dotted, modules) or dotted.endswith("TestCase") else ""


def _call_finding(node: ast.Call, called: str, aliases: dict[str, str]) -> list[tuple[int, str]]:
    if not node.args:
        return []
    if called in ("setattr", "delattr", "builtins.setattr", "builtins.delattr", "object.__setattr__"):
        target = _framework_target(node.args[0], aliases, TAMPERED_MODULES)
        name = node.args[1] if len(node.args) > 1 else None
        attr = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else ""
        if not target and attr.startswith(("assert", "fail")):
            target = f"{_dotted(node.args[0], aliases) or '…'}.{attr}"
        if target and not target.startswith(("self.", "cls.")):
            return [(node.lineno, f"{called}() on {target} changes how tests run or report")]
        return []
    # monkeypatch.setattr(…), mock.patch(…), patch.object(…): the builtins are a test's
    # ordinary business there (`input`), the frameworks are not.
    if called.split(".")[-1] in ("setattr", "delattr", "patch", "object"):
        target = _framework_target(node.args[0], aliases, FRAMEWORKS)
        if target:
            return [(node.lineno, f"{called}() replaces {target}, part of the test framework")]
    return []


def _hook_finding(node: ast.FunctionDef | ast.AsyncFunctionDef, aliases: dict[str, str]) -> list[tuple[int, str]]:
    if node.name in REPORT_HOOKS:
        return [
            (node.lineno, f"{node.name} outside the protected paths can rewrite which tests run or how they report")
        ]
    if node.name in END_HOOKS:
        for sub in ast.walk(node):
            exits = _exit_call(sub, aliases)
            sets_status = (
                isinstance(sub, ast.Attribute)
                and sub.attr in ("exitstatus", "testsfailed")
                and isinstance(sub.ctx, ast.Store)
            )
            if exits or sets_status:
                return [(node.lineno, f"{node.name} changes the session's exit status")]
    return []


def blocked_by(verdict: AssertionVerdict, findings: list[Finding]) -> AssertionVerdict:
    """A run check's verdict when the changed files hold findings: `blocked` for a person,
    whatever the check said (a process that may have been subverted proves nothing either
    way), with each finding as file:line evidence and the check's own result kept."""
    if not findings:
        return verdict
    listed = [escape_invisible(str(f)) for f in findings]
    shown = "; ".join(listed[:10]) + (f" (and {len(listed) - 10} more)" if len(listed) > 10 else "")
    result = {"pass": "passed", "fail": "failed"}.get(verdict.verdict, "was blocked")
    return AssertionVerdict(
        key=verdict.key,
        verdict="blocked",
        message=bounded(PREFIX + shown, 2000),
        expected="no known way to subvert the test process in the files the implementation changed",
        actual=f"{len(findings)} finding{'s' if len(findings) != 1 else ''}; the check itself {result}",
        evidence=[Evidence(kind="other", text=bounded("\n".join(listed), 4000)), *verdict.evidence],
    )
