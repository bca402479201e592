"""A mission known only by its URL (a real `git daemon`), validated before any task landed
a revision: the remote's default branch is judged (the branch its HEAD names), or the
mission's `branch` when set; the run names the branch (docs/TRUTH.md, "Which revision")."""

from __future__ import annotations

import pytest

from validation.models import RunStatus, ValidatorRun

from .conftest import feature, git, loop_state, url_mission

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def side_branch(served) -> tuple[str, str]:
    """`main` (the served repository's default branch) holds f1's work; `side` does not."""
    main = served.commit({"f1.txt": "done f1\n"}, "f1 on main")
    served.clone.git("checkout", "-q", "-b", "side")
    side = served.commit({"f1.txt": "not yet\n"}, "side work", push=False)
    served.push("side:refs/heads/side")
    assert git("ls-remote", "--symref", served.url, "HEAD").startswith("ref: refs/heads/main\tHEAD")
    return main, side


def validate(api_for, user, mission):
    return api_for(user).post(f"/api/features/{feature(mission, 'f1').pk}/validate/", {}, format="json")


def test_a_url_mission_without_a_branch_judges_the_remotes_default_branch(worker, served, side_branch, alice, api_for):
    main, _side = side_branch
    mission = url_mission(alice, served.url, ("f1",))

    response = validate(api_for, alice, mission)
    assert response.status_code == 202, response.json()
    run = response.json()["run"]
    assert (run["revision"], run["revision_name"]) == (main, "main")
    assert run["revision_note"] == f"branch main at {main[:12]} — no task had landed a revision"
    worker.drain()
    assert ValidatorRun.objects.get(pk=run["id"]).status == RunStatus.PASSED
    assert loop_state(mission, "f1") == "passed"


def test_a_url_missions_branch_is_judged_at_its_head(worker, served, side_branch, alice, api_for):
    _main, side = side_branch
    mission = url_mission(alice, served.url, ("f1",), branch="side")

    response = validate(api_for, alice, mission)
    assert response.status_code == 202, response.json()
    assert (response.json()["run"]["revision"], response.json()["run"]["revision_name"]) == (side, "side")
    worker.drain()
    assert ValidatorRun.objects.get(pk=response.json()["run"]["id"]).status == RunStatus.FAILED


def test_a_url_missions_unknown_branch_is_refused(idle_broker, served, side_branch, alice, api_for):
    mission = url_mission(alice, served.url, ("f1",), branch="gone")
    response = validate(api_for, alice, mission)
    assert response.status_code == 400 and response.json()["code"] == "unknown_revision", response.json()
    assert not ValidatorRun.objects.exists() and loop_state(mission, "f1") == "idle"
