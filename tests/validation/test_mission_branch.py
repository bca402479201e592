"""Which revision a validation judges when no task has landed one (docs/TRUTH.md, "Which
revision"): the head of the mission's `branch`, else of the repository's default branch
(for a local path, the branch its working copy has checked out), pinned at admission; the
run records the branch's name and shows what was judged and why. A branch the repository
does not have is refused and changes nothing."""

from __future__ import annotations

import pytest
from django.db import transaction

from missions.models import Milestone, MissionEvent, MissionFeature
from tests.missions.loop_helpers import add_slice, make_mission, milestone_ready
from tests.validation.test_truth_milestones import milestone_assertion
from validation.models import RunStatus, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)

UNLANDED = "no task had landed a revision"


@pytest.fixture
def two_branches(git_repo) -> tuple[str, str]:
    """`main` holds the feature's work, `other` does not, and the working copy is on `other`."""
    main = git_repo.commit({"f1.txt": "done f1\n"}, "f1 on main")
    git_repo.git("checkout", "-q", "-b", "other")
    other = git_repo.commit({"f1.txt": "not yet\n"}, "other work")
    return main, other


def branch_feature(alice, git_repo, **fields) -> MissionFeature:
    mission = make_mission(alice, git_repo.path, key="br", status="active", **fields)
    add_slice(mission, "m1", "s1", ["f1"])
    return MissionFeature.objects.get(mission=mission, key="f1")


def validate(api_for, user, feature):
    return api_for(user).post(f"/api/features/{feature.pk}/validate/", {}, format="json")


def run_page(client, user, run: ValidatorRun) -> str:
    client.force_login(user)
    return client.get(f"/runs/{run.pk}/").content.decode()


def test_the_missions_branch_is_judged_not_the_checked_out_one(worker, git_repo, two_branches, alice, api_for, client):
    main, other = two_branches
    feature = branch_feature(alice, git_repo, branch="main")

    response = validate(api_for, alice, feature)
    assert response.status_code == 202, response.json()
    shown = response.json()["run"]
    assert (shown["revision"], shown["revision_name"]) == (main, "main")
    assert shown["revision_note"] == f"branch main at {main[:12]} — {UNLANDED}"
    worker.drain()

    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.PASSED and run.revision != other  # main's f1.txt says done
    feature.refresh_from_db()
    assert feature.loop_state == "passed"
    started = MissionEvent.objects.get(type="validator-run:started")
    assert (started.payload["revision"], started.payload["revision_name"]) == (main, "main")
    assert f"branch main at {main[:12]} — {UNLANDED}" in run_page(client, alice, run)
    assert git_repo.git("branch", "--show-current").strip() == "other"  # the working copy is left alone


def test_without_a_branch_the_checked_out_branch_is_judged_and_named(worker, git_repo, two_branches, alice, api_for):
    _main, other = two_branches
    feature = branch_feature(alice, git_repo)

    response = validate(api_for, alice, feature)
    assert response.status_code == 202, response.json()
    assert (response.json()["run"]["revision"], response.json()["run"]["revision_name"]) == (other, "other")
    worker.drain()

    run = ValidatorRun.objects.get(feature=feature)
    assert run.status == RunStatus.FAILED  # other's f1.txt does not say done
    assert run.revision_note == f"branch other at {other[:12]} — {UNLANDED}"


def test_a_detached_head_is_judged_at_its_commit_and_says_so(idle_broker, git_repo, two_branches, alice, api_for):
    main, _other = two_branches
    git_repo.git("checkout", "-q", "--detach", main)
    feature = branch_feature(alice, git_repo)

    response = validate(api_for, alice, feature)
    assert response.status_code == 202, response.json()
    shown = response.json()["run"]
    assert (shown["revision"], shown["revision_name"]) == (main, "HEAD")
    assert shown["revision_note"] == f"detached HEAD at {main[:12]} — {UNLANDED}"


def test_a_branch_the_repository_does_not_have_is_refused_and_changes_nothing(
    idle_broker, git_repo, two_branches, alice, api_for
):
    feature = branch_feature(alice, git_repo, branch="no-such-branch")
    events = MissionEvent.objects.count()

    response = validate(api_for, alice, feature)
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "unknown_revision" and "no-such-branch" in response.json()["detail"]
    feature.refresh_from_db()
    assert feature.loop_state == "idle" and feature.validator_attempts == 0
    assert not ValidatorRun.objects.exists() and MissionEvent.objects.count() == events


def test_a_landed_task_revision_is_judged_whatever_the_branch(worker, git_repo, two_branches, alice, api_for):
    from missions.services.tasks import task_complete, task_create

    main, other = two_branches
    feature = branch_feature(alice, git_repo, branch="main")
    task = task_create(user=alice, feature=feature)
    task_complete(user=alice, task=task, revision=other)
    worker.drain()

    run = ValidatorRun.objects.get(feature=feature)
    assert (run.revision, run.revision_name, run.revision_note) == (other, "", "")
    assert run.status == RunStatus.FAILED and main != other


def featureless_milestone(alice, git_repo, branch: str, check: dict | None) -> Milestone:
    """A milestone with one milestone-scoped assertion and no feature, so no passed revision."""
    mission = make_mission(alice, git_repo.path, key="br", status="active", branch=branch)
    milestone = Milestone.objects.create(mission=mission, key="m1", title="M1")
    milestone_assertion(mission, check)
    return milestone


def test_a_milestone_without_a_passed_revision_is_judged_on_the_missions_branch(
    worker, git_repo, two_branches, alice, client
):
    main, _other = two_branches
    milestone = featureless_milestone(alice, git_repo, "main", {"file": "f1.txt", "contains": "done f1"})
    with transaction.atomic():
        assert milestone_ready(milestone=milestone) == "validating_milestone"
    worker.drain()

    run = ValidatorRun.objects.get(milestone=milestone)
    assert (run.revision, run.revision_name, run.status) == (main, "main", RunStatus.PASSED)
    note = f"branch main at {main[:12]} — no feature of the milestone had passed at a revision"
    assert run.revision_note == note and note in run_page(client, alice, run)


def test_a_milestone_on_a_missing_branch_stops_with_the_reason(idle_broker, git_repo, two_branches, alice):
    milestone = featureless_milestone(alice, git_repo, "gone", None)
    with transaction.atomic():
        outcome = milestone_ready(milestone=milestone)
    assert outcome.startswith("stop:milestone m1 cannot be validated: branch gone does not exist")
    assert not ValidatorRun.objects.exists()


@pytest.mark.parametrize("name", ["-x", "a..b", "with space", " main"])
def test_a_branch_that_is_no_branch_name_is_refused_when_written(git_repo, alice, api_for, name):
    mission = make_mission(alice, git_repo.path, key="br")
    response = api_for(alice).patch(f"/api/missions/{mission.pk}/", {"branch": name}, format="json")
    if name == " main":  # the API trims a text: that is the name main
        assert response.status_code == 200 and response.json()["branch"] == "main"
        return
    assert response.status_code == 400 and response.json()["code"] == "invalid_branch", response.json()
    assert "branch" in response.json()["fields"]
    mission.refresh_from_db()
    assert mission.branch == ""


def test_the_admin_form_sets_the_branch_and_refuses_no_branch_name(admin_client, git_repo):
    from tests.missions.test_repository_field import _form

    form = _form(key="adm", branch="a..b")
    assert not form.is_valid() and list(form.errors) == ["branch"], form.errors
    form = _form(key="adm", branch="release/2.x")
    assert form.is_valid(), form.errors
    mission = form.save()
    assert mission.branch == "release/2.x"
    page = admin_client.get(f"/admin/missions/mission/{mission.pk}/change/")
    assert page.status_code == 200 and page.context["adminform"].form.initial["branch"] == "release/2.x"
