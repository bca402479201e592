"""The implementation under judgment runs inside the test process its protected tests
start: a defense in depth (docs/TRUTH.md, "What the host can and cannot prove about code
that runs inside a check's process"). The witness (validation/witness.py) fails a pytest
check whose protected tests did not all report `passed`; the scan of the changed files
(validation/subversion.py) blocks, for a person, a check whose process the implementation
may have subverted. Real runs over real git repositories, through admission."""

from __future__ import annotations

import pytest

from missions.models import Mission, MissionFeature, StopReason
from validation import protect
from validation.models import RunStatus
from validation.services import runner
from validation.services.verdicts.admit import feature_admit
from validation.subversion import scan_file
from validation.witness import pytest_args, selection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]

STUB = "def add(a, b):\n    raise NotImplementedError\n"
RIGHT = "def add(a, b):\n    return a + b\n"
PYTEST_TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
UNITTEST_TESTS = (
    "import unittest\n\nfrom calc import add\n\n\nclass TestAdd(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
)
PYTEST = {"run": "python -m pytest -q -p no:cacheprovider tests/test_calc.py"}


def judged(build_mission, git_repo, calc: str, *, tests: str = PYTEST_TESTS, check=None, files=None):
    """A mission whose protected tests are committed at the base; `calc` implemented on top."""
    base = git_repo.commit({"calc.py": STUB, "tests/test_calc.py": tests, **(files or {})}, "tests first")
    git_repo.commit({"calc.py": calc}, "implementation")
    mission = build_mission({"calc": [("VAL-1", check or PYTEST)]}, validator="checks")
    Mission.objects.filter(pk=mission.pk).update(protected_paths=["tests/**"], base_revision=base)
    feature = MissionFeature.objects.get(key="calc")
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    runner.execute_run(run.pk)
    run.refresh_from_db()
    feature.refresh_from_db()
    assert run.verdict is not None, run.error
    return run, run.verdict["assertions"][0], feature


# ------------------------------------------------------------------ the scan: blocked, for a person


def test_an_exit_0_at_import_never_passes_and_asks_a_person(build_mission, git_repo):
    run, verdict, feature = judged(build_mission, git_repo, "import os\nos._exit(0)\n" + RIGHT)
    assert run.status == RunStatus.BLOCKED
    assert verdict["verdict"] == "blocked" and verdict["message"].startswith(
        "suspected tampering: calc.py:2: os._exit()"
    )
    assert "calc.py:2: os._exit() at import time" in verdict["evidence"][0]["text"]
    assert feature.loop_state == "blocked" and feature.stop_reason == StopReason.SUSPECTED_TAMPERING


def test_patching_unittest_assertions_never_passes(build_mission, git_repo):
    calc = "import unittest\n\nunittest.TestCase.assertEqual = lambda self, a, b, msg=None: None\n\n\n"
    calc += "def add(a, b):\n    return a - b\n"
    run, verdict, feature = judged(
        build_mission, git_repo, calc, tests=UNITTEST_TESTS, check={"run": "python -m pytest -q tests"}
    )
    assert run.status == RunStatus.BLOCKED, verdict
    assert verdict["message"].startswith(
        "suspected tampering: calc.py:3: assignment into unittest.TestCase.assertEqual"
    )
    assert feature.stop_reason == StopReason.SUSPECTED_TAMPERING


def test_rewriting_pytests_reports_never_passes(build_mission, git_repo):
    calc = (
        "import _pytest.reports\n\n_made = _pytest.reports.TestReport.from_item_and_call\n\n\n"
        "def _forged(cls, item, call):\n    report = _made(item, call)\n    report.outcome = 'passed'\n"
        "    return report\n\n\n_pytest.reports.TestReport.from_item_and_call = classmethod(_forged)\n\n\n"
        "def add(a, b):\n    return a - b\n"
    )
    run, verdict, _feature = judged(build_mission, git_repo, calc)
    assert run.status == RunStatus.BLOCKED, verdict
    assert "calc.py:12: assignment into _pytest.reports.TestReport.from_item_and_call" in verdict["message"]
    assert verdict["actual"] == "1 finding; the check itself passed"  # the forged run exited 0


# ------------------------------------------------------------------ the witness: a fact, failed


def test_patching_what_the_protected_tests_read_never_passes(build_mission, git_repo):
    """The tests really run and pass, so the witness is satisfied: the implementation made
    `pathlib` answer what the test reads. The scan names it."""
    tests = (
        "import pathlib\n\nfrom calc import add\n\n\n"
        "def test_data():\n    assert add(1, 1) == 2 and pathlib.Path('data.txt').read_text() == 'ok'\n"
    )
    calc = "import pathlib\n\npathlib.Path.read_text = lambda self, *a, **k: 'ok'\n" + RIGHT
    run, verdict, feature = judged(build_mission, git_repo, calc, tests=tests, files={"data.txt": "wrong"})
    assert run.status == RunStatus.BLOCKED, verdict
    assert verdict["message"].startswith("suspected tampering: calc.py:3: assignment into pathlib.Path.read_text")
    assert feature.stop_reason == StopReason.SUSPECTED_TAMPERING


def test_an_exit_the_scan_does_not_read_is_caught_by_the_witness(build_mission, git_repo):
    hidden = "getattr(__import__('o' + 's'), '_ex' + 'it')(0)\n" + RIGHT
    run, verdict, feature = judged(build_mission, git_repo, hidden)
    assert run.status == RunStatus.FAILED, verdict
    assert verdict["expected"] == "the protected tests from tests/test_calc.py run and pass"
    assert verdict["actual"].startswith("the pytest session never reached its end")
    assert "tests/test_calc.py::test_add (did not run)" in verdict["actual"]
    assert feature.loop_state != "passed"


def test_a_protected_test_the_implementation_skips_is_not_a_pass(build_mission, git_repo):
    skipping = "import unittest\n\n\ndef add(a, b):\n    raise unittest.SkipTest('not today')\n"
    run, verdict, _feature = judged(build_mission, git_repo, skipping)
    assert run.status == RunStatus.FAILED, verdict
    assert verdict["actual"] == "1 of 1 did not report passed: tests/test_calc.py::test_add (skipped)"


# ------------------------------------------------------------------ a legitimate pytest check passes

LEGIT_TESTS = """import sys

import pytest

from calc import add


@pytest.mark.parametrize("a, b, total", [(1, 1, 2), (2, 3, 5)])
def test_add(a, b, total):
    assert add(a, b) == total


@pytest.mark.skip(reason="not written yet")
def test_later():
    assert False


@pytest.mark.skipif(sys.platform == "nowhere", reason="never true")
def test_platform():
    assert add(0, 0) == 0


class TestAdd:
    def test_commutes(self):
        assert add(1, 2) == add(2, 1)

    def helper(self):
        raise AssertionError("not a test")


def test_skips_itself_when_it_must():
    if sys.platform == "linux" or True:
        pytest.skip("judged elsewhere")
"""
CONFTEST = "import pytest\n\n\n@pytest.fixture\ndef numbers():\n    return [1, 2]\n"


def test_a_legitimate_pytest_check_with_its_own_options_passes(build_mission, git_repo):
    check = {
        "run": "python -m pytest -q -p no:cacheprovider --junitxml=report.xml -rA tests/test_calc.py "
        "tests/test_more.py::TestMore",
    }
    more = "class TestMore:\n    def test_numbers(self, numbers):\n        assert numbers == [1, 2]\n"
    files = {
        "tests/conftest.py": CONFTEST,
        "tests/test_more.py": more,
        "tests/test_own.py": "def test_x():\n    pass\n",
    }
    run, verdict, feature = judged(build_mission, git_repo, RIGHT, tests=LEGIT_TESTS, check=check, files=files)
    assert run.status == RunStatus.PASSED, verdict
    assert feature.loop_state == "passed"


def test_a_wrong_implementation_still_fails_as_before(build_mission, git_repo):
    run, verdict, _feature = judged(build_mission, git_repo, "def add(a, b):\n    return a - b\n")
    assert run.status == RunStatus.FAILED and verdict["actual"] == "exit 1"


# ------------------------------------------------------------------ what is recognized, what is found


@pytest.mark.parametrize(
    ("spec", "args"),
    [
        ({"run": "pytest -q tests"}, ["-q", "tests"]),
        ({"run": ["py.test", "tests/test_a.py"]}, ["tests/test_a.py"]),
        ({"run": "python3 -m pytest -x"}, ["-x"]),
        ({"run": "pytest -q tests", "shell": True}, ["-q", "tests"]),
        ({"run": ["sh", "-c", "python -m pytest tests"]}, ["tests"]),
        ({"run": "cd sub && pytest", "shell": True}, None),
        ({"run": "PYTHONPATH=src pytest", "shell": True}, None),
        ({"run": "python -I -m pytest"}, None),
        ({"run": "make test"}, None),
    ],
)
def test_which_commands_the_witness_recognizes(spec, args):
    assert pytest_args(spec) == args


def test_how_far_the_host_reads_a_selection():
    assert selection(["-q", "tests/test_a.py::TestX::test_y[1]"]).mode == "all"
    assert selection(["-q", "tests/test_a.py::TestX::test_y[1]"]).targets == [("tests/test_a.py", "TestX::test_y[1]")]
    assert selection(["--junitxml", "out.xml", "tests"]).targets == [("tests", "")]
    assert selection(["tests"]).mode == "all" and selection([]).targets == []
    assert selection(["-k", "add", "tests/test_a.py"]).mode == "subset"
    assert selection(["-qk", "add"]).mode == "subset"
    assert selection(["--co"]).mode == "none"


def test_the_scan_names_each_form_and_leaves_ordinary_code_alone():
    source = b"""import atexit
import builtins
import os
import sys
from unittest import TestCase as T

if __name__ == "__main__":
    sys.exit(main())
try:
    import fast
except ImportError:
    raise SystemExit(1)
builtins.print = len
setattr(T, "assertTrue", len)


def pytest_runtest_makereport(item, call):
    pass


def later():
    sys.exit(0)
    os._exit(3)


atexit.register(later)
"""
    found = [str(f) for f in scan_file("pkg/mod.py", source)]
    assert [f.split(": ", 1)[0] for f in found] == [
        "pkg/mod.py:12", "pkg/mod.py:13", "pkg/mod.py:14", "pkg/mod.py:17", "pkg/mod.py:23",
    ]  # fmt: skip
    assert [str(f) for f in scan_file("site/evil.pth", b"import os")] == [
        "site/evil.pth:1: evil.pth runs in every Python process started here"
    ]
    ordinary = b"import sys\n\n\ndef main():\n    sys.exit(0)\n\n\nif __name__ == '__main__':\n    main()\n"
    assert scan_file("tool.py", ordinary) == [] and scan_file("broken.py", b"def (") == []


def test_the_scan_names_the_standard_library_patched_at_import_and_not_a_programs_settings():
    patched = b"""import os.path
import pathlib as p
from json import decoder

p.Path.read_text = lambda self, *a, **k: "ok"
setattr(os.path, "exists", lambda path: True)
del decoder.JSONDecoder.decode


def later():
    p.Path.write_text = None
"""
    assert [str(f) for f in scan_file("calc.py", patched)] == [
        "calc.py:5: assignment into pathlib.Path.read_text at import time changes what the tests read",
        "calc.py:6: setattr() on os.path.exists at import time changes what the tests read",
        "calc.py:7: assignment into json.decoder.JSONDecoder.decode at import time changes what the tests read",
    ]
    settings = b"""import os
import sys

import pandas as pd

os.environ["DJANGO_SETTINGS_MODULE"] = "site.settings"
sys.path.insert(0, os.path.dirname(__file__))
sys.dont_write_bytecode = True
pd.options.display.max_rows = 20
config = object()
"""
    assert scan_file("settings.py", settings) == []


def test_an_implementation_that_skips_a_protected_unittest_test_is_not_a_pass(build_mission, git_repo):
    """pytest reports a `unittest.SkipTest` at the test's own location, whoever raised it:
    the witness reads where it was raised (the implementation), not where pytest says."""
    calc = "import unittest\n\n\ndef add(a, b):\n    raise unittest.SkipTest('not today')\n"
    run, verdict, _feature = judged(
        build_mission, git_repo, calc, tests=UNITTEST_TESTS, check={"run": "python -m pytest -q tests/test_calc.py"}
    )
    assert run.status != RunStatus.PASSED and verdict["verdict"] == "fail", verdict
    assert "test_add" in verdict["actual"], verdict


def test_the_scan_names_what_would_hide_code_from_it():
    assert [str(f) for f in scan_file("pkg/__pycache__/calc.cpython-311.pyc", b"\x00" * 16)] == [
        "pkg/__pycache__/calc.cpython-311.pyc:1: calc.cpython-311.pyc: compiled Python runs instead of the source "
        "the scan reads"
    ]
    deep = b"x = 1" + b" + 1" * 200_000 + b"\n"
    assert [f.what for f in scan_file("deep.py", deep)] in ([], ["nested too deeply for the scan to read"])
    nested = b"x = " + b"(" * 100_000 + b")" * 100_000 + b"\n"
    assert [f.what for f in scan_file("nested.py", nested)] in ([], ["nested too deeply for the scan to read"])
    assert protect.matches("pkg/pyvenv.cfg", protect.RUNNER_CONFIG)
    assert protect.matches("pkg/__pycache__/calc.cpython-311.pyc", protect.RUNNER_CONFIG)
