"""A committed symlink never moves the judged folder (docs/TRUTH.md, "Checks see the
revision and nothing else"; docs/REPOSITORIES.md, "Snapshots").

The mission is a sub-folder (`app/`) of its repository. At the judged revision the agent
committed `app` as a symlink: to a folder outside the repository that holds passing
content, or to the user's own working tree of `app/`. Followed, the checks would judge
those files and protection would restore the protected tests into them. The run must
never pass, and nothing outside the snapshot may be written.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from missions.models import Mission, MissionFeature
from tests.conftest import GIT_ENV, Repo
from tests.repos.conftest import tree_digest
from validation.models import RunStatus, ValidatorRun
from validation.services import runner
from validation.services.recovery import redrive_unavailable
from validation.services.verdicts.admit import feature_admit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]

TESTS = "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n"
HONEST_TEST = TESTS + "        self.assertEqual(add(2, 2), 4)\n"
WRONG = "def add(a, b):\n    raise NotImplementedError\n"
RIGHT = "def add(a, b):\n    return a + b\n"
UNITTEST = {"run": "python -m unittest -q tests.test_calc"}


def write(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def commit_app_as_symlink(git_repo: Repo, tmp_path, target: str) -> str:
    """The agent's commit, made in a clone of its own (the user's working tree keeps its
    real `app/`): `app` replaced by a symlink to `target`."""
    agent = Repo(tmp_path / "agent")
    subprocess.run(
        ["git", "clone", "-q", str(git_repo.path), str(agent.path)], check=True, env={**os.environ, **GIT_ENV}
    )
    agent.git("rm", "-r", "-q", "app")
    os.symlink(target, agent.path / "app")
    revision = agent.commit(message="app lives elsewhere now")
    agent.git("push", "-q", "origin", "HEAD:refs/heads/agent")
    return revision


@pytest.mark.parametrize("points_to", ["a folder outside the repository", "the user's working tree"])
def test_a_mission_folder_committed_as_a_symlink_is_refused_and_nothing_outside_is_written(
    build_mission, git_repo, tmp_path, points_to
):
    base = git_repo.commit({"app/calc.py": WRONG, "app/tests/__init__.py": "", "app/tests/test_calc.py": HONEST_TEST})
    if points_to == "the user's working tree":
        # Uncommitted work of the user: passing, and none of the agent's business.
        target = git_repo.path / "app"
        write(target, {"calc.py": RIGHT, "tests/test_calc.py": HONEST_TEST + "        self.assertTrue(True)\n"})
    else:
        target = tmp_path / "outside"
        write(target, {"calc.py": RIGHT, "tests/__init__.py": "", "tests/test_calc.py": TESTS + "        pass\n"})
    revision = commit_app_as_symlink(git_repo, tmp_path, str(target))
    mission = build_mission(
        {"calc": [("VAL-1", UNITTEST), ("VAL-2", {"file": "calc.py", "contains": "return a \\+ b"})]},
        workspace=git_repo.path / "app",
    )
    # `restore`: followed, the run would pass on the linked files with the tests put back.
    Mission.objects.filter(pk=mission.pk).update(
        protected_paths=["tests/**"], base_revision=base, on_protected_change="restore"
    )
    feature = MissionFeature.objects.get(key="calc")
    before = tree_digest(target)
    user_tree = tree_digest(git_repo.path)

    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate", revision=revision).run
    runner.execute_run(run.pk)

    run = ValidatorRun.objects.get(pk=run.pk)
    feature.refresh_from_db()
    assert run.status == RunStatus.ERROR and run.verdict is None
    assert feature.loop_state == "blocked" and feature.stop_reason == "workspace_unavailable"
    assert f"the mission's folder app/ is a symlink at revision {revision[:12]}" in feature.stop_detail
    assert f"app -> {target}" in feature.stop_detail
    assert tree_digest(target) == before  # nothing restored, copied or run there
    assert tree_digest(git_repo.path) == user_tree
    assert not list((tmp_path / "snapshots").iterdir())
    # The commit is there: the recovery sweep, which judges again what was waiting for a
    # commit, leaves a refused revision to a person instead of refusing it on every sweep.
    assert run.error.startswith("workspace_refused: ")
    assert redrive_unavailable() == []
    assert ValidatorRun.objects.filter(feature=feature).count() == 1
