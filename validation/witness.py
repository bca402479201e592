"""The witness of a pytest check (docs/TRUTH.md, "What the host can and cannot prove about
code that runs inside a check's process"): evidence, read by the host, that the protected
tests a `run` check selects actually ran and passed, instead of the process's exit code
alone, which the implementation the tests import can forge (an `os._exit(0)` at import).

The tests expected are read statically (`ast`) from the protected test files at the base
revision (`validation.pytest_static`). The result channel is a tiny pytest plugin
(`witness_plugin/fusion_witness.py`), copied for each check into a folder the host creates
outside the check's copy and loaded with `-p` through `PYTEST_ADDOPTS` and `PYTHONPATH`;
it writes each test report as it happens into a file of that folder. The host then
requires every expected test to have reported `passed`, and the session to have reached
its end with the status the process exited with.

Which commands are recognized: an argv (or a shell command that is one plain command:
no operators, redirections, substitutions or variable assignments) whose program is
`pytest`, `py.test`, or `python`/`python3`/`python3.N` directly followed by `-m pytest`,
also inside `sh -c "…"`/`bash -c "…"`. Anything else (`cd x && pytest`, `tox`, `make
test`, `python -I -m pytest`, which ignores `PYTHONPATH`) is not witnessed; the scan of the
changed files (`validation.subversion`) still applies to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import secrets
import shlex
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validation import base_tree, protect
from validation.pytest_static import TestFile, collect

PLUGIN = Path(__file__).with_name("witness_plugin") / "fusion_witness.py"
PYTHON = re.compile(r"^python(?:\d+(?:\.\d+)?)?$")
SHELLS = {"sh", "bash", "dash", "zsh"}
SHELL_SYNTAX = re.compile(r"[|&;<>()$`\\\n*?\[\]{}~]")
# Options that take a value in the next argument (or after `=`); the rest are flags.
VALUE_OPTIONS = {
    "-k", "-m", "-p", "-c", "-o", "-W", "-r", "-n", "--tb", "--maxfail", "--junitxml", "--junit-xml",
    "--junit-prefix", "--rootdir", "--basetemp", "--confcutdir", "--deselect", "--ignore", "--ignore-glob",
    "--durations", "--durations-min", "--import-mode", "--log-level", "--log-format", "--log-date-format",
    "--log-file", "--log-file-level", "--log-file-format", "--log-cli-level", "--log-cli-format", "--capture",
    "--cov", "--cov-report", "--cov-config", "--cov-fail-under", "--dist", "--numprocesses", "--max-worker-restart",
    "--timeout", "--color", "--code-highlight", "--show-capture", "--override-ini", "--config-file", "--inifile",
    "--assert", "--doctest-glob", "--doctest-report", "--verbosity", "--lfnf", "--last-failed-no-failures",
    "--report-log", "--html", "--junit-family", "--reruns", "--random-order-seed", "--count", "--benchmark-json",
    "--keyword", "--markers-expr", "--pdbcls", "--debug-file", "--rsyncdir", "--tx",
}  # fmt: skip
SHORT_VALUES = "kmpcoWrn"
# Selections the host does not evaluate: only the expected tests that reported are required.
SUBSET = {"-k", "-m", "--keyword", "--deselect", "--lf", "--last-failed", "--sw", "--stepwise", "--sw-skip",
          "--stepwise-skip", "--pyargs", "--ignore", "--ignore-glob"}  # fmt: skip
# Invocations that run no test at all.
NO_RUN = {"--co", "--collect-only", "--setup-plan", "--setup-only", "--fixtures", "--funcargs", "--fixtures-per-test",
          "--markers", "--help", "-h", "--version", "-V", "--cache-show", "--cache-clear-only"}  # fmt: skip


def pytest_args(spec: dict[str, Any]) -> list[str] | None:
    """The arguments given to pytest by the run check `spec`, or None when it is not a
    recognized pytest invocation."""
    command = spec["run"]
    if spec.get("shell") is True:
        text = command if isinstance(command, str) else shlex.join(command)
        return _from_shell(text)
    try:
        argv = command if isinstance(command, list) else shlex.split(command)
    except ValueError:
        return None
    return _from_argv([str(a) for a in argv])


def _from_shell(text: str) -> list[str] | None:
    if SHELL_SYNTAX.search(text):
        return None
    try:
        argv = shlex.split(text)
    except ValueError:
        return None
    if argv and "=" in argv[0]:  # `VAR=value pytest`: an environment of its own
        return None
    return _from_argv(argv)


def _from_argv(argv: list[str]) -> list[str] | None:
    if not argv:
        return None
    program = posixpath.basename(argv[0])
    if program in SHELLS and len(argv) == 3 and argv[1] == "-c":
        return _from_shell(argv[2])
    if program in ("pytest", "py.test"):
        return argv[1:]
    if PYTHON.match(program) and argv[1:3] == ["-m", "pytest"]:
        return argv[3:]
    return None


@dataclass
class Selection:
    """What the arguments select: paths and node ids relative to the check's folder, and
    how far the host reads the selection (`mode`)."""

    targets: list[tuple[str, str]] = field(default_factory=list)  # (path, "Class::test" or "")
    mode: str = "all"  # all: as the targets say | subset: only what reported | none: no test runs


def selection(args: list[str]) -> Selection:
    chosen = Selection()
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positional += args[i:]
            break
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            _note(chosen, name)
            if name in VALUE_OPTIONS and "=" not in arg:
                i += 1
        elif arg.startswith("-") and len(arg) > 1:
            for j, letter in enumerate(arg[1:], 1):
                _note(chosen, "-" + letter)
                if letter in SHORT_VALUES:
                    i += 0 if arg[j + 1 :] else 1
                    break
        else:
            positional.append(arg)
    for arg in positional:
        path, _sep, node = arg.partition("::")
        chosen.targets.append((posixpath.normpath(path.replace(os.sep, "/")), node))
    return chosen


def _note(chosen: Selection, option: str) -> None:
    if option in NO_RUN:
        chosen.mode = "none"
    elif option in SUBSET and chosen.mode != "none":
        chosen.mode = "subset"


@dataclass
class Expected:
    """The protected tests one check selects, by test file (relative to the check's folder)."""

    files: dict[str, TestFile]
    selection: Selection
    patterns: tuple[str, ...]

    def required_in(self, rel: str, reported: set[str], collected: bool) -> set[str]:
        """The tests of file `rel` that must report `passed`: all of a file named in the
        arguments (narrowed by its node ids); of a file found in a folder, all once pytest
        collected it (the project's configuration decides which files a folder yields);
        with a selection the host does not evaluate (`-k`), those that reported."""
        tests = set(self.files[rel].required)
        if self.selection.mode == "subset":
            return tests & reported
        nodes = [node for path, node in self.selection.targets if path == rel]
        if not nodes:
            return tests if collected else set()
        if "" in nodes:
            return tests
        return {t for t in tests if any(_selects(node, t) for node in nodes)}


def _selects(node: str, test: str) -> bool:
    node = re.sub(r"\[.*\]$", "", node)
    return test == node or test.startswith(node + "::")


def plan(ctx: Any, spec: dict[str, Any]) -> Expected | None:
    """What the witness expects of the check `spec`, or None when it does not watch it."""
    if "run" not in spec:
        return None
    args = pytest_args(spec)
    return None if args is None else expected(ctx, spec, args)


def expected(ctx: Any, spec: dict[str, Any], args: list[str]) -> Expected | None:
    """The protected tests `spec` selects; None when the witness does not apply (no
    protection, not an exit-0 check, nothing protected and expected selected)."""
    protection = ctx.protection
    patterns = (*protection.paths, *(spec.get("protect") or ()))
    if not protection.base or not patterns or spec.get("expect_exit", 0) != 0:
        return None
    chosen = selection(args)
    if chosen.mode == "none":
        return None
    files = {rel: test for rel, test in protected_tests(ctx, patterns).items() if _in_selection(rel, test, chosen)}
    if not any(test.required for test in files.values()):
        return None
    # A skip raised in a restored runner configuration file (a protected conftest.py) is
    # the base's own, as legitimate as one raised in a protected test.
    skips_from = (*patterns, *protect.RUNNER_CONFIG) if protection.runner_config else patterns
    return Expected(files, chosen, skips_from)


def _in_selection(rel: str, test: TestFile, chosen: Selection) -> bool:
    if not chosen.targets:
        return test.named_as_test
    for path, node in chosen.targets:
        if path == rel:
            return True
        if not node and (path == "." or rel.startswith(path + "/")) and test.named_as_test:
            return True
    return False


def protected_tests(ctx: Any, patterns: tuple[str, ...]) -> dict[str, TestFile]:
    """The protected Python files at the base with the tests read from each, once per run
    and set of patterns (the check's own `protect` adds some)."""
    with ctx.extra.setdefault("witness_lock", threading.Lock()):  # one run's check threads
        cache = ctx.extra.setdefault("witness_files", {})
        if patterns not in cache:
            diff = ctx.protection.diff()
            rx = protect.compile_patterns(patterns)
            paths = [p for p, e in diff.base.items() if e.kind == "blob" and p.endswith(".py") and rx and rx.match(p)]
            contents = base_tree.base_contents(diff, paths)
            cache[patterns] = {p: collect(p, contents.get(p, b"")) for p in paths}
        return cache[patterns]


@dataclass
class Watch:
    """One witnessed run of a check: the environment to start it with, then what the
    plugin wrote."""

    folder: Path
    token: str
    root: Path

    @property
    def path(self) -> Path:
        return self.folder / "reports.jsonl"

    def env(self) -> dict[str, str]:
        return {
            "PYTEST_ADDOPTS": "-p fusion_witness",
            "PYTHONPATH": str(self.folder / "plugin"),
            "FUSION_WITNESS_FILE": str(self.path),
            "FUSION_WITNESS_TOKEN": self.token,
        }

    def records(self) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_bytes().decode("utf-8", errors="replace").splitlines()
        except OSError:
            return []
        found = []
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("token") == self.token:
                    found.append(record)
        return found


@contextlib.contextmanager
def watching(root: Path) -> Iterator[Watch]:
    """A folder of the host's, outside the check's copy, holding the plugin and the
    reports file (created empty, the host's alone), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="fusion-witness-"))
    try:
        (folder / "plugin").mkdir()
        shutil.copyfile(PLUGIN, folder / "plugin" / PLUGIN.name)
        watch = Watch(folder=folder, token=secrets.token_hex(16), root=root)
        os.close(os.open(watch.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        yield watch
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def mismatch(expected: Expected, watch: Watch) -> tuple[str, str] | None:
    """(expected, actual) when the reports do not show every required test passed and the
    session ended with exit status 0; None when they do."""
    records = watch.records()
    finished = [r["finished"] for r in records if isinstance(r.get("finished"), int)]
    missing, total = _missing(expected, _reports(expected, records, os.path.realpath(watch.root)))
    problems = []
    if not finished:
        problems.append("the pytest session never reached its end (the process ended first)")
    elif finished[-1] != 0:
        problems.append(f"pytest ended with status {finished[-1]}, yet the process exited 0")
    if missing:
        shown = "; ".join(missing[:20]) + (f" (and {len(missing) - 20} more)" if len(missing) > 20 else "")
        problems.append(f"{len(missing)} of {total} did not report passed: {shown}")
    if not problems:
        return None
    files = ", ".join(sorted(expected.files)[:10]) + (" …" if len(expected.files) > 10 else "")
    how = "" if expected.selection.mode == "all" else " (those pytest selected)"
    return f"the protected tests from {files}{how} run and pass", "; ".join(problems)


@dataclass
class _Reports:
    """What the reports say of the expected files."""

    outcomes: dict[str, dict[str, str]] = field(default_factory=dict)  # file -> test -> status
    collected: set[str] = field(default_factory=set)
    module_skips: set[str] = field(default_factory=set)


def _reports(expected: Expected, records: list[dict[str, Any]], root: str) -> _Reports:
    reports = _Reports()
    for record in records:
        nodeid = record.get("nodeid")
        if not isinstance(nodeid, str):
            continue
        rel = _relative(root, str(record.get("root", "")), nodeid.split("::", 1)[0])
        if rel not in expected.files:
            continue
        reports.collected.add(rel)
        legit_skip = _protected(root, str(record.get("skipped_at") or ""), expected.patterns)
        if record.get("when") == "collect":
            if record.get("outcome") == "skipped" and legit_skip:
                reports.module_skips.add(rel)
            continue
        test = re.sub(r"\[.*\]$", "", nodeid.split("::", 1)[1] if "::" in nodeid else "")
        statuses = reports.outcomes.setdefault(rel, {})
        statuses[test] = _combine(statuses.get(test), record, legit_skip)
    return reports


def _missing(expected: Expected, reports: _Reports) -> tuple[list[str], int]:
    """The required tests that did not pass, each with its status, and how many were required."""
    missing: list[str] = []
    total = 0
    for rel in sorted(expected.files):
        if rel in reports.module_skips:
            continue
        reported = reports.outcomes.get(rel, {})
        required = expected.required_in(rel, set(reported), rel in reports.collected)
        total += len(required)
        for test in sorted(required):
            status = reported.get(test, "did not run")
            if status not in ("passed", "skipped here"):
                missing.append(f"{rel}::{test} ({status})")
    return missing, total


def _combine(before: str | None, record: dict[str, Any], legit_skip: bool) -> str:
    outcome = record.get("outcome")
    if before == "failed" or outcome == "failed":
        return "failed"
    if outcome == "skipped":
        return "skipped here" if legit_skip and before != "skipped" else "skipped"
    if record.get("when") == "call" and outcome == "passed":
        return before if before in ("skipped", "skipped here") else "passed"
    return before or "did not run"


def _relative(root: str, rootdir: str, path: str) -> str:
    full = os.path.realpath(os.path.join(rootdir or root, path))
    rel = os.path.relpath(full, root)
    return "" if rel.startswith("..") else rel.replace(os.sep, "/")


def _protected(root: str, location: str, patterns: tuple[str, ...]) -> bool:
    """Whether a skip was raised in a protected file (the test itself, a protected conftest):
    a skip raised by the implementation is no pass."""
    if not location:
        return False
    rel = _relative(root, root, location)
    return bool(rel) and protect.matches(rel, patterns)
