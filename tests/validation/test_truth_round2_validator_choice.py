"""A mission names the profiles that may judge it (docs/TRUTH.md, "Which validator").

Its `validator` and its `allowed_validators`: a validation asking for any other profile
is refused with `validator_not_allowed` (naming the allowed ones) and changes nothing,
whoever asks and by whichever path (the API, MCP, the command line), because admission
checks it (over MCP: tests/mcp/test_truth_round2_validator_choice.py). Only the
mission's owner or staff change which profiles judge it.
"""

from __future__ import annotations

import pytest

from missions.models import Mission, MissionFeature
from validation.models import ValidatorRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password="pw-bob-123")


def validate(client, feature: MissionFeature, validator: str):
    return client.post(f"/api/features/{feature.pk}/validate/", {"validator": validator}, format="json")


def test_a_member_asking_for_another_profile_is_refused_and_nothing_changes(build_mission, api_for, alice, bob):
    mission = build_mission({"calc": [("VAL-1", {"file": "README.md", "exists": True})]}, validator="composite")
    mission.members.add(bob)
    feature = MissionFeature.objects.get(key="calc")
    before = feature.loop_state
    response = validate(api_for(bob), feature, "checks")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "validator_not_allowed"
    assert body["allowed"] == ["composite"] and "composite" in body["detail"]
    feature.refresh_from_db()
    assert feature.loop_state == before and not ValidatorRun.objects.exists()
    # The member may not widen the choice either: the owner (or staff) decides.
    for change in ({"allowed_validators": ["checks"]}, {"validator": "checks"}):
        refused = api_for(bob).patch(f"/api/missions/{mission.pk}/", change, format="json")
        assert refused.status_code == 403 and refused.json()["code"] == "owner_only", change
    assert Mission.objects.get(pk=mission.pk).allowed_validators == []
    # The owner allows it: now it judges.
    allowed = api_for(alice).patch(f"/api/missions/{mission.pk}/", {"allowed_validators": ["checks"]}, format="json")
    assert allowed.status_code == 200 and allowed.json()["allowed_validators"] == ["checks"]
    started = validate(api_for(bob), feature, "checks")
    assert started.status_code == 202, started.json()
    assert ValidatorRun.objects.get().validator == "checks"


def test_a_member_cannot_lift_the_protection_its_work_is_judged_by(build_mission, api_for, alice, bob, git_repo):
    """An agent's token is a member's: were it able to empty `protected_paths` (or move the
    base, or judge against restored files), a rewritten test would pass."""
    base = git_repo.commit({"tests/test_calc.py": "def test_add():\n    assert True\n"}, "the acceptance tests")
    mission = build_mission({"calc": [("VAL-1", {"file": "README.md", "exists": True})]})
    mission.members.add(bob)
    owner = api_for(alice).patch(
        f"/api/missions/{mission.pk}/",
        {"base_revision": base, "protected_paths": ["tests/**"]},
        format="json",
    )
    assert owner.status_code == 200, owner.json()
    for change in (
        {"protected_paths": []},
        {"on_protected_change": "restore"},
        {"protect_runner_config": False},
        {"base_revision": "main"},
    ):
        refused = api_for(bob).patch(f"/api/missions/{mission.pk}/", change, format="json")
        assert refused.status_code == 403 and refused.json()["code"] == "owner_only", change
    mission.refresh_from_db()
    assert (mission.protected_paths, mission.on_protected_change, mission.protect_runner_config) == (
        ["tests/**"],
        "fail",
        True,
    )
    assert mission.base_commit == base


def test_a_member_cannot_re_pin_the_base_by_naming_the_repository_again(
    build_mission, api_for, alice, bob, git_repo, settings
):
    """A new repository re-pins the base: where `main` points there may be the agent's own
    commit, which would make the rewritten tests the base."""
    base = git_repo.commit({"tests/test_calc.py": "def test_add():\n    assert True\n"}, "the acceptance tests")
    mission = build_mission({"calc": [("VAL-1", {"file": "README.md", "exists": True})]})
    mission.members.add(bob)
    owner = api_for(alice).patch(
        f"/api/missions/{mission.pk}/", {"base_revision": "main", "protected_paths": ["tests/**"]}, format="json"
    )
    assert owner.status_code == 200, owner.json()
    git_repo.commit({"tests/test_calc.py": "def test_add():\n    pass\n"}, "the agent rewrites the tests on main")
    settings.FUSION_WORKSPACE_ROOTS = [str(git_repo.path.parent)]  # a member may name it
    elsewhere = git_repo.path.parent / "same-repo"  # the same repository, named anew
    elsewhere.symlink_to(git_repo.path)
    refused = api_for(bob).patch(f"/api/missions/{mission.pk}/", {"repository": str(elsewhere)}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "owner_only", refused.json()
    refused = api_for(bob).patch(f"/api/missions/{mission.pk}/", {"submodules": True}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "owner_only", refused.json()
    mission.refresh_from_db()
    assert mission.base_commit == base and mission.submodules is False
