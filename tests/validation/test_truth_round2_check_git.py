"""A check's git never sees a repository above its snapshot (docs/TRUTH.md, "Checks see the
revision and nothing else"; docs/REPOSITORIES.md, "Snapshots").

With the default data folder (`var/` inside the service's checkout) every snapshot lies
inside the service's own git work tree. Here `FUSION_SNAPSHOT_DIR` is inside a git work
tree of the test's own: a check that asks git for its repository must not be answered
with that one, whether it runs in the snapshot itself (a lone run check) or in a copy
(a mission in a sub-folder of its repository).
"""

from __future__ import annotations

import pytest

from missions.models import MissionFeature
from tests.conftest import Repo
from validation.models import RunStatus
from validation.services import runner
from validation.services.verdicts.admit import feature_admit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]


@pytest.fixture
def service_checkout(tmp_path, settings) -> Repo:
    """A git work tree holding the snapshot folder, as the service's own checkout does."""
    path = tmp_path / "service"
    path.mkdir()
    repo = Repo(path)
    repo.git("init", "-q", "-b", "main")
    repo.commit({"README.md": "the service\n"}, "the service's own history")
    settings.FUSION_SNAPSHOT_DIR = path / "var" / "snapshots"
    return repo


@pytest.mark.parametrize("mode", ["auto", "off"])  # in the sandbox the folders around it are not even mounted
@pytest.mark.parametrize("workspace", ["", "app"])
def test_git_in_a_check_does_not_find_the_repository_around_the_snapshot_folder(
    build_mission, git_repo, service_checkout, workspace, mode, settings
):
    settings.FUSION_SANDBOX = mode
    git_repo.commit({"app/hello.py": "print('hi')\n"})
    build_mission(
        {"hello": [("VAL-git", {"run": "git rev-parse --show-toplevel"})]},
        workspace=git_repo.path / workspace if workspace else None,
    )
    feature = MissionFeature.objects.get(key="hello")
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate").run

    assert runner.execute_run(run.pk) == RunStatus.FAILED
    run.refresh_from_db()
    [verdict] = run.verdict["assertions"]
    evidence = "\n".join(e["text"] for e in verdict["evidence"])
    assert verdict["verdict"] == "fail" and verdict["actual"] == "exit 128", verdict
    assert "not a git repository" in evidence
    # The service's work tree is never the check's top level (git may name the folder it
    # stopped at, which lies inside it).
    assert str(service_checkout.path) not in [line.strip() for line in evidence.splitlines()]
