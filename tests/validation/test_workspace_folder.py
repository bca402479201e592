"""A workspace that is a sub-folder of its repository is judged in that folder: checks
run there and file checks name paths relative to it, as the mission's author wrote them
(docs/TRUTH.md, item 9)."""

from __future__ import annotations

import pytest

from fusion_site.repos.snapshots import SnapshotError, snapshot
from missions.models import MissionFeature
from validation.models import RunStatus
from validation.services.runner import execute_run
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)


def test_checks_run_in_the_workspace_folder_of_the_snapshot(build_mission, git_repo):
    git_repo.commit({"app/hello.py": "print('hi from app')\n", "app/VERSION": "2\n", "VERSION": "1\n"})
    build_mission(
        {
            "hello": [
                ("VAL-file", {"file": "VERSION", "contains": "^2$"}),
                ("VAL-run", {"run": "python hello.py", "expect_output": "hi from app"}),
            ]
        },
        workspace=git_repo.path / "app",
    )
    feature = MissionFeature.objects.get(key="hello")
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    assert execute_run(run.pk) == RunStatus.PASSED
    run.refresh_from_db()
    assert {a["key"]: a["verdict"] for a in run.verdict["assertions"]} == {"VAL-file": "pass", "VAL-run": "pass"}


def test_a_revision_without_the_workspace_folder_is_a_clear_snapshot_error(git_repo):
    before = git_repo.git("rev-parse", "HEAD").strip()
    git_repo.commit({"app/x.txt": "x\n"})
    with pytest.raises(SnapshotError, match="has no folder app/"), snapshot(str(git_repo.path / "app"), before):
        pass


def test_a_lone_run_check_in_a_workspace_folder_sees_nothing_above_it(build_mission, git_repo):
    # A `conftest.py` above the folder would change what a test run in it finds; the lone
    # run check (which may run in the snapshot itself, docs/TRUTH.md) must not see it.
    git_repo.commit({"app/hello.py": "print('hi')\n", "conftest.py": "# outside the workspace\n"})
    outside = "python -c \"import os, sys; sys.exit(os.path.exists(os.path.join('..', 'conftest.py')))\""
    build_mission({"hello": [("VAL-alone", {"run": outside})]}, workspace=git_repo.path / "app")
    feature = MissionFeature.objects.get(key="hello")
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run
    assert execute_run(run.pk) == RunStatus.PASSED
    run.refresh_from_db()
    assert run.verdict["assertions"][0]["verdict"] == "pass", run.verdict
