"""An honest agent's own tests never fail it (docs/TRUTH.md, "Which files were protected"):
tampering is changing or deleting what the base holds. A file the implementation adds
under a protected path is set aside before the checks run and reported on their verdicts,
never a reason to fail. Real runs over real git repositories, through admission.
"""

from __future__ import annotations

import pytest

from tests.validation.protected_runs import BASE_FILES, RIGHT, TEST_CALC, judge_protected
from validation.models import RunStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]

MINE = "import unittest\nfrom calc import add\n\n\nclass Mine(unittest.TestCase):\n    def test_zero(self):\n"
CHECKS = [
    {"run": "python -m unittest -q tests.test_calc"},
    {"file": "calc.py", "contains": r"return a \+ b"},  # unrelated to the tests
    {"file": "tests/test_mine.py", "exists": False},  # set aside: the checks never see it
]
NOTE = "set aside 1 file the implementation added under protected paths: tests/test_mine.py"


@pytest.fixture
def base(git_repo) -> str:
    return git_repo.commit(BASE_FILES)


def judged(build_mission, base: str):
    return judge_protected(build_mission, CHECKS, protected_paths=["tests/**"], base_revision=base)


def test_a_correct_implementation_that_adds_its_own_tests_passes_with_them_set_aside(build_mission, git_repo, base):
    git_repo.commit({"calc.py": RIGHT, "tests/test_mine.py": MINE + "        self.assertEqual(add(0, 0), 0)\n"})
    run, verdicts = judged(build_mission, base)
    assert run.status == RunStatus.PASSED, verdicts
    for verdict in verdicts.values():  # every check says what was set aside; none fails on it
        assert verdict["verdict"] == "pass"
        assert verdict["evidence"][-1] == {"kind": "other", "text": NOTE}
        assert "changed protected files" not in verdict["message"]


def test_changing_a_test_of_the_base_is_still_tampering_beside_an_added_one(build_mission, git_repo, base):
    git_repo.commit(
        {
            "calc.py": RIGHT,
            "tests/test_mine.py": MINE + "        pass\n",
            "tests/test_calc.py": TEST_CALC + "# touched\n",
        }
    )
    run, verdicts = judged(build_mission, base)
    assert run.status == RunStatus.FAILED
    for verdict in verdicts.values():
        assert verdict["message"] == "the implementation changed protected files: tests/test_calc.py"
        assert [e["text"] for e in verdict["evidence"][-2:]] == [NOTE, verdict["message"]]
        assert verdict["actual"] == "1 protected file changed; with them restored, the check itself passed"
