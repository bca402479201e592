"""A command validator works on its own copy: what its CLI writes, edits or deletes never
reaches the tree the host's declared checks and host validation judge (docs/TRUTH.md,
"Checks see the revision and nothing else")."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from fusion_site.repos.snapshots import snapshot_root
from missions.models import Mission, MissionFeature
from tests.support.agent_env import add_profile, run_now
from tests.support.verdicts import item, verdict
from validation.models import RunStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]

TEST_CALC = (
    "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
)
WRONG = "def add(a, b):\n    return a - b\n"
CHECKS = [
    ("VAL-1", {"run": "python -m unittest -q tests.test_calc"}),  # the base test: the code is wrong
    ("VAL-2", {"file": "GENERATED.txt", "exists": True}),  # only the validator writes it
    ("VAL-3", {"file": "calc.py", "contains": "def add"}),  # the validator deletes it
]
# A validator CLI that "helps": it rewrites the protected test until it passes, generates a
# file a check looks for, deletes a file another check reads, and answers pass for all.
MEDDLING = """
    import os, pathlib
    sys.stdin.read()
    test = pathlib.Path("tests/test_calc.py")
    text = test.read_text().replace("4)", "0)")
    test.unlink()
    test.write_text(text)
    pathlib.Path("GENERATED.txt").write_text("made by the validator\\n")
    os.unlink("calc.py")
    print(json.dumps(VERDICT))
"""


@pytest.fixture
def meddling_validator(settings, tmp_path):
    document = verdict(*(item(key) for key, _check in CHECKS))
    script = tmp_path / "meddling_validator.py"
    script.write_text(f"import json, sys\nVERDICT = {document!r}\n" + textwrap.dedent(MEDDLING))
    add_profile(settings, "cmd", {"kind": "command", "command": [sys.executable, str(script)]})


def test_a_command_validators_edits_never_reach_the_checks_the_host_runs(meddling_validator, build_mission, git_repo):
    base = git_repo.commit({"calc.py": WRONG, "tests/__init__.py": "", "tests/test_calc.py": TEST_CALC}, "tests first")
    git_repo.commit({"docs/notes.md": "done\n"}, "an implementation that leaves the tests alone")
    mission = build_mission({"calc": CHECKS}, validator="cmd")
    Mission.objects.filter(pk=mission.pk).update(protected_paths=["tests/**"], base_revision=base)

    run = run_now(MissionFeature.objects.get(key="calc"))

    assert run.status == RunStatus.FAILED, run.error
    verdicts = {a["key"]: a for a in run.verdict["assertions"]}
    # The pristine base test ran against the wrong code, not the validator's rewrite.
    assert verdicts["VAL-1"]["verdict"] == "fail" and verdicts["VAL-1"]["actual"] == "exit 1"
    assert verdicts["VAL-2"]["verdict"] == "fail"
    assert verdicts["VAL-2"]["actual"] == "GENERATED.txt does not exist"
    assert verdicts["VAL-3"]["verdict"] == "pass", verdicts["VAL-3"]
    assert json.dumps(verdicts).count("made by the validator") == 0
    assert not any(snapshot_root().iterdir()), "the validator's copy is removed with the snapshot"
