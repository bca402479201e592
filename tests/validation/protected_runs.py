"""Driving a real run of a mission with protected paths (admission, then the runner), for
the tests of docs/TRUTH.md's "Which files were protected"."""

from __future__ import annotations

from missions.models import Mission, MissionFeature
from validation.services import runner
from validation.services.verdicts.admit import feature_admit

TEST_CALC = (
    "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
)
UNDONE = "def add(a, b):\n    raise NotImplementedError\n"
WRONG = "def add(a, b):\n    return a - b\n"
RIGHT = "def add(a, b):\n    return a + b\n"
BASE_FILES = {"calc.py": UNDONE, "tests/__init__.py": "", "tests/test_calc.py": TEST_CALC}  # tests first


def judge_protected(build_mission, checks: list[dict], **mission_fields):
    """One feature `calc` whose assertions VAL-1, VAL-2, ... carry `checks`, the mission's
    fields (`protected_paths`, `base_revision`, ...) set, judged at the repository's HEAD:
    (run, verdicts by key)."""
    mission = build_mission({"calc": [(f"VAL-{i}", c) for i, c in enumerate(checks, 1)]})
    Mission.objects.filter(pk=mission.pk).update(**mission_fields)
    run = feature_admit(feature_id=MissionFeature.objects.get(key="calc").pk, trigger="manual", cause="validate").run
    runner.execute_run(run.pk)
    run.refresh_from_db()
    assert run.verdict is not None, (run.status, run.error)
    return run, {a["key"]: a for a in run.verdict["assertions"]}
