"""The test's own model for `test_truth_property`: what each commit of the example's git
repository really contains, and therefore whether a check truly holds there, computed
without the code under test (no snapshot, no validator, no subprocess).

Every assertion key `k` has five possible checks, all about the file `k.txt`:

- `file`:      `{"file": "k.txt", "contains": "done k"}`
- `file_v2`:   `{"file": "k.txt", "contains": "done k v2"}` (an edit that a `done k` file fails)
- `run`:       `python check_k.py`, a script committed in the base that exits 0 iff `k.txt` says `done k`
- `protected`: `python tests/check_k.py`, the same script under the mission's protected `tests/**`
- `pytest`:    `python -m pytest … tests/test_k.py`, a protected test that imports the
               implementation's module `k_impl.py` and asserts that `k.txt` says `done k`

The mission protects `tests/**` with `on_protected_change = fail` (the default), and with it
the runner configuration the base holds (`pytest.ini`, docs/TRUTH.md): every check of a run
fails when the judged commit modified or deleted one of those files since the base, so a
commit that rewrites a test script is truly wrong for every assertion. A file the
implementation adds (its own tests under `tests/`, a root `conftest.py`) is no change of
what the base holds: it is set aside before the checks and never counts against it.

A `pytest` check holds only when the implementation is honest as well as right: a module
`k_impl.py` that ends the process, rewrites the test framework's reports or patches the
standard library the test reads, at import (`SUBVERSIONS`) makes the tests it serves untrue whatever `k.txt` says.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import GIT_ENV, Repo

# Feature-scoped assertion keys a1..a8, a spare one (linked to nothing at the start) and
# the milestone-scoped one. Single digits: `done a1` never matches inside `done a10`.
ASSERTION_KEYS = tuple(f"a{i}" for i in range(1, 10))
MILESTONE_KEY = "m1"
ALL_KEYS = ASSERTION_KEYS + (MILESTONE_KEY,)
VARIANTS = ("file", "file_v2", "run", "protected", "pytest")
HEX40 = re.compile(r"^[0-9a-f]{40}$")

SCRIPT = """import pathlib
import sys

target = pathlib.Path("{key}.txt")
sys.exit(0 if target.is_file() and "done {key}" in target.read_text() else 1)
"""
ALWAYS_PASSES = "import sys\nsys.exit(0)\n"
# The protected pytest test of `key`: it imports the implementation's module, as a real
# project's tests do, which is what lets an implementation act inside the test process.
PYTEST_TEST = """import pathlib

import {key}_impl  # noqa: F401 — the implementation under test


def test_done():
    assert "done {key}" in pathlib.Path("{key}.txt").read_text()
"""
IMPL = '"""The implementation of {key}."""\n'
# The runner configuration at the base: it makes the repository's top pytest's rootdir (so
# a root `conftest.py` would govern the tests), and is protected with them.
PYTEST_INI = "[pytest]\n"
RUNNER_CONFIG = {"pytest.ini": PYTEST_INI}
# An implementation module that subverts the test process from inside, by form.
SUBVERSIONS = {
    # Ends the process with exit 0 while pytest collects, before any test runs.
    "exit": "import os\n\nos._exit(0)\n",
    # Rewrites every report of the test framework to `passed`.
    "report": """import _pytest.reports

_init = _pytest.reports.TestReport.__init__


def _passed(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.outcome = "passed"
    self.longrepr = None


_pytest.reports.TestReport.__init__ = _passed
""",
    # Makes the standard library answer what the test reads: the test runs and passes.
    "stdlib": """import pathlib

pathlib.Path.read_text = lambda self, *args, **kwargs: f"done {self.stem}"
""",
}
# Runner configuration an implementation writes to make every test pass, by form: a root
# `conftest.py` it adds (a hook that marks every report passed), or the base's
# `pytest.ini` modified to only collect.
ROOT_CONFTEST = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""
RUNNER_SUBVERSIONS = {
    "conftest": {"conftest.py": ROOT_CONFTEST},
    "ini": {"pytest.ini": "[pytest]\naddopts = --collect-only\n"},
}
# An honest implementation's own test, added under the protected folder.
OWN_TEST = "def test_mine():\n    assert True\n"


def check_spec(key: str, variant: str) -> dict[str, Any]:
    if variant == "file":
        return {"file": f"{key}.txt", "contains": f"done {key}"}
    if variant == "file_v2":
        return {"file": f"{key}.txt", "contains": f"done {key} v2"}
    if variant == "run":
        return {"run": f"python check_{key}.py", "timeout": 30}
    if variant == "protected":
        return {"run": f"python tests/check_{key}.py", "timeout": 30}
    if variant == "pytest":
        # No plugin autoloading: the service's environment has heavy ones (a second a run).
        return {
            "run": f"python -m pytest -q -p no:cacheprovider --disable-plugin-autoload tests/test_{key}.py",
            "timeout": 60,
        }
    raise ValueError(variant)


def variant_of(spec: dict[str, Any] | None) -> str:
    for variant in VARIANTS:
        for key in ALL_KEYS:
            if spec == check_spec(key, variant):
                return variant
    raise AssertionError(f"a check the model does not know: {spec!r}")


def key_of(spec: dict[str, Any]) -> str:
    for variant in VARIANTS:
        for key in ALL_KEYS:
            if spec == check_spec(key, variant):
                return key
    raise AssertionError(f"a check the model does not know: {spec!r}")


def base_files() -> dict[str, str]:
    files = {"README.md": "# project\n", **RUNNER_CONFIG}
    for key in ALL_KEYS:
        # Tracked from the start (empty: no check holds), so that every later commit is
        # one `git commit -a`.
        files[f"{key}.txt"] = ""
        files[f"check_{key}.py"] = SCRIPT.format(key=key)
        files[f"tests/check_{key}.py"] = SCRIPT.format(key=key)
        files[f"tests/test_{key}.py"] = PYTEST_TEST.format(key=key)
        files[f"{key}_impl.py"] = IMPL.format(key=key)
    return files


BASE_FILES = base_files()
PROTECTED = {p: t for p, t in BASE_FILES.items() if p.startswith("tests/")}
IMPLEMENTATIONS = {f"{key}_impl.py": IMPL.format(key=key) for key in ALL_KEYS}
# What an implementation that does not tamper leaves as the base had it: the tests, the
# runner configuration, the implementation modules (it keeps its own tests).
HONEST = {**PROTECTED, **RUNNER_CONFIG, **IMPLEMENTATIONS}


def correct_text(key: str, variant: str) -> str:
    """What a correct implementation writes into `key.txt` for the current check."""
    return f"done {key} v2\n" if variant == "file_v2" else f"done {key}\n"


def wrong_text(key: str) -> str:
    return f"not yet {key}\n"


def protected_changed(tree: dict[str, str | None]) -> bool:
    """Whether the commit modified or deleted a protected file the base holds (a test
    under `tests/` or the runner configuration); files it added do not count."""
    return any(tree.get(p) != t for p, t in {**PROTECTED, **RUNNER_CONFIG}.items())


def subverted(tree: dict[str, str], key: str) -> bool:
    """Whether the implementation module the protected test of `key` imports is not the
    honest one (it ends the process or rewrites reports at import)."""
    return tree.get(f"{key}_impl.py") != IMPLEMENTATIONS[f"{key}_impl.py"]


def check_holds(spec: dict[str, Any] | None, tree: dict[str, str]) -> bool:
    """Whether the check truly holds at a commit whose files are `tree` (the mission's
    protection rule included)."""
    if spec is None or protected_changed(tree):
        return False
    key, variant = key_of(spec), variant_of(spec)
    text = tree.get(f"{key}.txt")
    if text is None:
        return False
    if variant in ("file", "file_v2"):
        return re.search(spec["contains"], text, re.M) is not None
    # Both scripts are the base ones when judged: the root one is never changed by an
    # implementation here, the protected one is restored from the base.
    assert tree.get(f"check_{key}.py") == BASE_FILES[f"check_{key}.py"]
    if variant == "pytest" and subverted(tree, key):
        return False
    return f"done {key}" in text


@dataclass
class History:
    """The example's repository and the files of every commit made in it."""

    repo: Repo
    trees: dict[str, dict[str, str]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def head(self) -> str:
        return self.order[-1]

    def commit(self, changes: dict[str, str | None], message: str) -> str:
        """A commit of `changes` (path -> text; None deletes the file) on `main`."""
        changes = {p: t for p, t in changes.items() if self.files.get(p) != t}
        for rel, text in changes.items():
            if text is None:
                (self.repo.path / rel).unlink()
            else:
                self.repo.write(rel, text)
        if not all(p in self.files for p in changes):  # new files: staged first (deletions too)
            subprocess.run(["git", "-C", str(self.repo.path), "add", "-A"], check=True, capture_output=True)
        # Tracked files only: one git process (`-a` stages their changes and deletions).
        subprocess.run(
            ["git", "-C", str(self.repo.path), "commit", "-q", "-a", "--allow-empty", "-m", message],
            check=True,
            capture_output=True,
            env=git_env(),
        )
        sha = (self.repo.path / ".git" / "refs" / "heads" / "main").read_text().strip()
        assert HEX40.match(sha), sha
        for rel, text in changes.items():
            if text is None:
                del self.files[rel]
            else:
                self.files[rel] = text
        self.trees[sha] = dict(self.files)
        self.order.append(sha)
        return sha

    def tree(self, revision: str) -> dict[str, str]:
        assert revision in self.trees, f"revision {revision} is not a commit the test made"
        return self.trees[revision]


class Template:
    """One base repository per test session, copied (cheaply) for every example: the same
    base commit id every time, no `git init` + first commit per example."""

    def __init__(self, root: Path):
        self.path = root / "template"
        self.path.mkdir(parents=True)
        repo = Repo(self.path)
        repo.git("init", "-q", "-b", "main")
        repo.git("config", "gc.auto", "0")  # no background repacking mid-example
        self.base = repo.commit(dict(BASE_FILES), "base: the tests")
        # Fewer files to copy for every example: one pack, no sample hooks.
        repo.git("repack", "-adq")
        repo.git("prune-packed")
        shutil.rmtree(self.path / ".git" / "hooks", ignore_errors=True)

    def clone(self, target: Path) -> History:
        done = subprocess.run(["cp", "-a", "--", str(self.path), str(target)], capture_output=True)
        if done.returncode != 0:
            shutil.copytree(self.path, target, symlinks=True)
        history = History(Repo(target), files=dict(BASE_FILES))
        history.trees[self.base] = dict(BASE_FILES)
        history.order.append(self.base)
        return history


def git_env() -> dict[str, str]:
    return {**os.environ, **GIT_ENV}
