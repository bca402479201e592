"""What decides how protected tests run is protected with them (docs/TRUTH.md, "Which
files were protected"): with `protected_paths: ["tests/**"]`, a wrong implementation that
adds a root `conftest.py` marking every report passed, a pytest configuration whose
`addopts` stops the tests from running, or a `sitecustomize.py` that forces exit 0, still
fails; an honest change to pyproject.toml (a dependency) does not. And a pattern that is a
bare folder name protects that folder. Real runs over real git repositories, through
admission, with real pytest.
"""

from __future__ import annotations

import sys

import pytest

from tests.validation.protected_runs import BASE_FILES, RIGHT, WRONG, judge_protected
from validation import protect
from validation.models import RunStatus
from validation.runner_config import fix

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]

TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
PYPROJECT = (
    '[project]\nname = "calc"\nversion = "1"\ndependencies = []\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
)
PYTEST = {"run": "python -m pytest -q -p no:cacheprovider tests"}
ALL_PASSED = (
    "import pytest\n\n\n@pytest.hookimpl(wrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    report = yield\n    report.outcome = 'passed'\n    return report\n"
)
EXIT_0 = "import atexit, os\n\natexit.register(lambda: os._exit(0))\n"


@pytest.fixture
def base(git_repo) -> str:
    return git_repo.commit({**BASE_FILES, "tests/test_calc.py": TEST_CALC, "pyproject.toml": PYPROJECT})


def judged(build_mission, base: str, check: dict, *, paths=("tests/**",), on_change="fail", runner_config=True):
    run, verdicts = judge_protected(
        build_mission,
        [check],
        protected_paths=list(paths),
        base_revision=base,
        on_protected_change=on_change,
        protect_runner_config=runner_config,
    )
    return run, verdicts["VAL-1"]


def notes(verdict: dict) -> list[str]:
    return [e["text"] for e in verdict["evidence"] if e["kind"] == "other"]


WITH_DEPENDENCY = PYPROJECT.replace("dependencies = []", 'dependencies = ["requests>=2"]')
TRICKS = {
    "conftest hook": ({"conftest.py": ALL_PASSED}, PYTEST),
    "pytest.ini addopts": ({"pytest.ini": "[pytest]\naddopts = --collect-only -q\n"}, PYTEST),
    "pyproject addopts": (
        {"pyproject.toml": WITH_DEPENDENCY + 'addopts = "--collect-only -q"\n'},
        PYTEST,
    ),
    "nested conftest": ({"tests/conftest.py": ALL_PASSED}, PYTEST),
    "sitecustomize": (
        {"sitecustomize.py": EXIT_0},
        {"run": "PYTHONPATH=. python -m pytest -q -p no:cacheprovider tests", "shell": True},
    ),
}


@pytest.mark.parametrize("trick", list(TRICKS))
def test_a_wrong_implementation_cannot_pass_by_reconfiguring_the_runner(build_mission, git_repo, base, trick):
    files, check = TRICKS[trick]
    git_repo.commit({"calc.py": WRONG, **files})
    run, verdict = judged(build_mission, base, check)
    assert run.status == RunStatus.FAILED, verdict
    assert verdict["verdict"] == "fail"


@pytest.mark.parametrize("trick", ["conftest hook", "pytest.ini addopts", "sitecustomize"])
def test_runner_files_the_implementation_added_are_set_aside_not_failed(build_mission, git_repo, base, trick):
    files, check = TRICKS[trick]
    git_repo.commit({"calc.py": RIGHT, **files})
    run, verdict = judged(build_mission, base, check)
    assert run.status == RunStatus.PASSED, verdict
    [name] = files
    assert notes(verdict) == [f"set aside 1 file the implementation added under protected paths: {name}"]


def test_a_changed_pytest_section_of_pyproject_is_tampering(build_mission, git_repo, base):
    git_repo.commit({"calc.py": RIGHT, **TRICKS["pyproject addopts"][0]})
    run, verdict = judged(build_mission, base, PYTEST)
    assert run.status == RunStatus.FAILED
    assert verdict["message"] == "the implementation changed protected files: pyproject.toml"


def test_an_honest_dependency_in_pyproject_is_not_a_change(build_mission, git_repo, base):
    git_repo.commit({"calc.py": RIGHT, "pyproject.toml": WITH_DEPENDENCY})
    run, verdict = judged(build_mission, base, PYTEST)
    assert run.status == RunStatus.PASSED, verdict
    assert notes(verdict) == []


def test_opting_out_leaves_the_runner_configuration_to_the_implementation(build_mission, git_repo, base):
    git_repo.commit({"calc.py": WRONG, "conftest.py": ALL_PASSED})
    run, verdict = judged(build_mission, base, PYTEST, runner_config=False)
    assert run.protection["runner_config"] is False
    # The conftest is the implementation's now, but a hook that rewrites reports is still a
    # known way to subvert the test process: the scan asks a person (docs/TRUTH.md).
    assert run.status == RunStatus.BLOCKED, verdict
    assert verdict["message"].startswith("suspected tampering: conftest.py:"), verdict["message"]
    assert not any("protected" in text and "set aside" in text for text in notes(verdict))


def test_a_test_packages_init_is_protected_with_its_tests(build_mission, git_repo, base):
    # Only the test files are protected; their package's __init__.py runs before them.
    patch = "import calc\n\ncalc.add = lambda a, b: 4\n"
    git_repo.commit({"calc.py": WRONG, "tests/__init__.py": patch})
    run, verdict = judged(build_mission, base, PYTEST, paths=("**/test_*.py",), on_change="restore")
    assert run.status == RunStatus.FAILED, verdict  # judged with the base's __init__.py
    assert notes(verdict) == ["the implementation changed protected files: tests/__init__.py"]


def test_a_bare_folder_name_protects_the_folder(build_mission, git_repo, base):
    git_repo.commit({"calc.py": WRONG, "tests/test_calc.py": TEST_CALC.replace("== 4", "== 0")})
    run, verdict = judged(build_mission, base, PYTEST, paths=("tests",))
    assert run.status == RunStatus.FAILED
    assert verdict["message"] == "the implementation changed protected files: tests/test_calc.py"
    assert verdict["actual"] == "1 protected file changed; with them restored, the check itself failed"


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("tests", ["tests", "tests/a.py", "tests/a/b.py"], ["testsx/a.py", "src/tests/a.py"]),
        ("src/fixtures", ["src/fixtures/x.json"], ["src/fixtures.json"]),
        ("*/data", ["a/data/x.csv"], ["a/b/data/x.csv"]),
        ("docs/", ["docs/x"], ["docs"]),
    ],
)
def test_a_pattern_covers_everything_under_what_it_names(pattern, yes, no):
    assert [p for p in yes if protect.matches(p, [pattern])] == yes
    assert [p for p in no if protect.matches(p, [pattern])] == []


# ------------------------------------------------------------------ shared files, part by part

SETUP_CFG = "[metadata]\nname = calc\n\n[tool:pytest]\naddopts = -q\n"


def test_only_the_runner_part_of_a_shared_file_is_put_back():
    head = WITH_DEPENDENCY.replace('testpaths = ["tests"]', 'testpaths = ["elsewhere"]')
    state, content = fix("pyproject.toml", PYPROJECT.encode(), head.encode())
    assert state == "changed"
    assert b'dependencies = ["requests>=2"]' in content and b'testpaths = ["tests"]' in content
    assert b"elsewhere" not in content
    # setup.cfg: the [tool:pytest] section; the rest is the implementation's
    head_cfg = SETUP_CFG.replace("-q", "--collect-only") + "\n[options]\npackages = calc\n"
    state, content = fix("setup.cfg", SETUP_CFG.encode(), head_cfg.encode())
    assert state == "changed"
    assert b"--collect-only" not in content and b"packages = calc" in content and b"addopts = -q" in content
    # a runner section where the base had none is set aside; an unchanged one is left alone
    state, content = fix("tox.ini", b"[tox]\nenvlist = py\n", b"[tox]\nenvlist = py\n[pytest]\naddopts = --co\n")
    assert (state, content) == ("added", b"[tox]\nenvlist = py\n")
    assert fix("tox.ini", b"[pytest]\naddopts = -q\n", b"# note\n[pytest]\naddopts = -q\n") == ("same", None)


def test_a_runner_key_outside_its_own_table_puts_the_whole_base_file_back():
    head = '[project]\nname = "calc"\n\n[tool]\npytest.ini_options.addopts = "--co"\n'
    assert fix("pyproject.toml", PYPROJECT.encode(), head.encode()) == ("changed", PYPROJECT.encode())
    assert fix("pyproject.toml", None, head.encode()) == ("added", None)
