"""The protection base is pinned once (docs/TRUTH.md, "Which files were protected").

A mission's `base_revision` (the README's `main`) is resolved to a commit id when a person
sets it; every run compares with that commit, never with where the branch points now. An
agent that commits onto `main` cannot make its rewritten tests the base, and a base branch
that moves on after a merge never makes an honest commit "change protected files". Real
runs over real git repositories, set through the API and mission files.
"""

from __future__ import annotations

import pytest

from missions.models import Mission, MissionEvent, MissionFeature
from missions.services.files import mission_export, mission_import
from validation.models import RunStatus
from validation.services import runner
from validation.services.verdicts.admit import feature_admit

TEST_CALC = "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n"
BASE = {
    "calc.py": "def add(a, b):\n    raise NotImplementedError\n",
    "tests/__init__.py": "",
    "tests/test_calc.py": TEST_CALC + "        self.assertEqual(add(2, 2), 4)\n",
}
WRONG = "def add(a, b):\n    return a - b\n"
RIGHT = "def add(a, b):\n    return a + b\n"
UNITTEST = {"run": "python -m unittest -q tests.test_calc"}

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("idle_broker")]


@pytest.fixture
def base(git_repo) -> str:
    return git_repo.commit(BASE, "acceptance tests first")


def readme_mission(build_mission, api_for, alice) -> MissionFeature:
    """The README's shape, set through the API: `base_revision: main`, `tests/**` protected."""
    mission = build_mission({"calc": [("VAL-1", UNITTEST)]})
    response = api_for(alice).patch(
        f"/api/missions/{mission.pk}/", {"base_revision": "main", "protected_paths": ["tests/**"]}, format="json"
    )
    assert response.status_code == 200, response.json()
    return MissionFeature.objects.get(key="calc")


def judge(feature: MissionFeature, revision: str):
    run = feature_admit(feature_id=feature.pk, trigger="manual", cause="validate", revision=revision).run
    assert run is not None
    runner.execute_run(run.pk)
    run.refresh_from_db()
    assert run.verdict is not None, run.error
    return run


def test_an_agent_committing_rewritten_tests_onto_the_base_branch_still_fails(
    build_mission, api_for, alice, git_repo, base
):
    feature = readme_mission(build_mission, api_for, alice)
    # The agent works on `main` itself: a wrong implementation and a test rewritten to suit it.
    tampered = git_repo.commit(
        {"calc.py": WRONG, "tests/test_calc.py": TEST_CALC + "        self.assertEqual(add(2, 2), 0)\n"}, "done"
    )
    assert git_repo.git("rev-parse", "main").strip() == tampered
    run = judge(feature, tampered)
    assert run.status == RunStatus.FAILED
    verdict = run.verdict["assertions"][0]
    assert verdict["verdict"] == "fail"
    assert verdict["message"] == "the implementation changed protected files: tests/test_calc.py"
    assert run.protection["base"] == base
    body = api_for(alice).get(f"/api/missions/{feature.mission_id}/").json()
    assert (body["base_revision"], body["base_commit"]) == ("main", base)


def test_a_base_branch_that_moves_on_never_fails_an_honest_commit(build_mission, api_for, alice, git_repo, base):
    feature = readme_mission(build_mission, api_for, alice)
    git_repo.git("checkout", "-q", "-b", "work")
    honest = git_repo.commit({"calc.py": RIGHT}, "implement add")
    git_repo.git("checkout", "-q", "main")
    # Meanwhile `main` moves on: another branch's merge changes the protected tests.
    git_repo.commit({"tests/test_calc.py": TEST_CALC + "        self.assertEqual(add(1, 2), 3)\n"}, "more tests")
    run = judge(feature, honest)
    assert run.status == RunStatus.PASSED, run.verdict
    assert run.protection["base"] == base


def test_an_unresolvable_base_is_refused_and_changes_nothing(build_mission, api_for, alice, git_repo, base):
    feature = readme_mission(build_mission, api_for, alice)
    response = api_for(alice).patch(f"/api/missions/{feature.mission_id}/", {"base_revision": "nope"}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "unknown_base_revision"
    mission = Mission.objects.get(pk=feature.mission_id)
    assert (mission.base_revision, mission.base_commit) == ("main", base)
    # `base_commit` is read-only: a client cannot write it.
    api_for(alice).patch(f"/api/missions/{mission.pk}/", {"base_commit": "0" * 40}, format="json")
    assert Mission.objects.get(pk=mission.pk).base_commit == base


def test_a_pattern_that_matches_nothing_at_the_base_is_refused(build_mission, api_for, alice, git_repo, base):
    mission = build_mission({"calc": [("VAL-1", UNITTEST)]})
    response = api_for(alice).patch(
        f"/api/missions/{mission.pk}/",
        {"base_revision": "main", "protected_paths": ["tests/**", "spec/**", "*.feature"]},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "protected_path_matches_nothing"
    assert body["patterns"] == ["spec/**", "*.feature"]
    assert "spec/**, *.feature" in body["detail"]
    mission.refresh_from_db()
    assert (mission.base_revision, mission.protected_paths, mission.base_commit) == ("", [], "")


def test_a_mission_stored_before_pinning_is_pinned_at_its_next_use_and_keeps_it(build_mission, git_repo, base):
    mission = build_mission({"calc": [("VAL-1", UNITTEST)]})
    Mission.objects.filter(pk=mission.pk).update(base_revision="main", protected_paths=["tests/**"])
    feature = MissionFeature.objects.get(key="calc")
    git_repo.git("checkout", "-q", "-b", "work")
    right = git_repo.commit({"calc.py": RIGHT}, "implement")
    git_repo.git("checkout", "-q", "main")
    first = judge(feature, right)  # `main` is pinned now, where it points: the base commit
    assert first.status == RunStatus.PASSED and first.protection["base"] == base
    assert Mission.objects.get(pk=mission.pk).base_commit == base
    pinned = MissionEvent.objects.get(mission=mission, type="mission:base-changed").payload
    assert (pinned["from"], pinned["to"], pinned["cause"]) == ("", base, "first_use")
    # `main` moves on: the stored pin stands.
    tampered = git_repo.commit({"tests/test_calc.py": TEST_CALC + "        pass\n", "calc.py": WRONG}, "x")
    assert judge(feature, tampered).status == RunStatus.FAILED


def test_a_mission_file_pins_the_base_and_export_writes_the_name(git_repo, base):
    document = {
        "mission": {
            "key": "pinned",
            "title": "Pinned",
            "repository": str(git_repo.path),
            "base_revision": "main",
            "protected_paths": ["tests/**"],
            "protect_runner_config": False,
            "submodules": True,
            "validator": "composite",
            "allowed_validators": ["checks"],
        },
        "milestones": [],
    }
    mission, _changed = mission_import(document=document)
    assert (mission.base_revision, mission.base_commit) == ("main", base)
    assert (mission.protect_runner_config, mission.submodules, mission.allowed_validators) == (False, True, ["checks"])
    text = mission_export(mission=mission)
    assert "base_revision: main\n" in text and base not in text
    assert "protect_runner_config: false" in text and "submodules: true" in text
    # Re-importing the same file after `main` moved does not move the base.
    git_repo.commit({"calc.py": RIGHT}, "later")
    again, changed = mission_import(document=document)
    assert again.base_commit == base and not changed
    bad = {**document, "mission": {**document["mission"], "base_revision": "no-such-branch"}}
    with pytest.raises(Exception) as refused:
        mission_import(document=bad)
    assert getattr(refused.value, "code", "") == "unknown_base_revision"
    assert refused.value.fields["errors"][0].startswith("mission.base_revision: base_revision 'no-such-branch'")
    assert Mission.objects.get(pk=mission.pk).base_commit == base


def test_a_person_moving_the_base_reopens_what_was_judged_under_the_old_one(
    build_mission, api_for, alice, git_repo, base
):
    from missions.models import Milestone, Slice

    feature = readme_mission(build_mission, api_for, alice)
    git_repo.git("checkout", "-q", "-b", "work")
    right = git_repo.commit({"calc.py": RIGHT}, "implement")
    git_repo.git("checkout", "-q", "main")
    assert judge(feature, right).status == RunStatus.PASSED
    feature.refresh_from_db()
    assert feature.loop_state == "passed"
    Slice.objects.filter(mission=feature.mission).update(status="complete")
    Milestone.objects.filter(mission=feature.mission).update(status="complete")
    Mission.objects.filter(pk=feature.mission_id).update(status="complete")
    moved = git_repo.commit({"tests/test_calc.py": TEST_CALC + "        self.assertEqual(add(1, 2), 3)\n"}, "more")
    response = api_for(alice).patch(f"/api/missions/{feature.mission_id}/", {"base_revision": moved}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["base_commit"] == moved
    events = MissionEvent.objects.filter(mission_id=feature.mission_id)
    changed = events.filter(type="mission:base-changed").order_by("-seq").first().payload
    assert (changed["from"], changed["to"], changed["cause"]) == (base, moved, "set")
    for kind in ("milestone:reopened", "mission:reopened"):
        assert events.get(type=kind).payload["cause"] == "base_changed"
    assert events.filter(type="slice:reopened").exists()
    feature.refresh_from_db()
    assert feature.loop_state == "validating"  # judged again, against the new base
    assert feature.last_run.protection["base"] == moved


def test_the_admin_pins_the_base_refuses_an_unknown_one_and_moving_it_is_recorded(
    admin_client, admin_user, git_repo, base
):
    from tests.validation.test_protected_paths import _change_form

    mission = Mission.objects.create(key="adm", title="Adm", owner=admin_user, repository=str(git_repo.path))
    url = f"/admin/missions/mission/{mission.pk}/change/"
    data = _change_form(admin_client.get(url))
    fields = {"protected_paths": '["tests/**"]', "allowed_validators": '["checks"]', "submodules": "on"}
    refused = admin_client.post(url, {**data, **fields, "base_revision": "no-such-branch"})
    assert refused.status_code == 200 and "base_revision &#x27;no-such-branch&#x27;" in refused.content.decode()
    nothing = admin_client.post(url, {**data, "protected_paths": '["spec/**"]', "base_revision": "main"})
    assert nothing.status_code == 200 and "spec/**" in nothing.content.decode()
    assert Mission.objects.get(pk=mission.pk).base_commit == ""
    assert admin_client.post(url, {**data, **fields, "base_revision": "main"}).status_code == 302
    mission.refresh_from_db()
    assert (mission.base_revision, mission.base_commit, mission.allowed_validators) == ("main", base, ["checks"])
    assert mission.submodules is True
    page = admin_client.get(url).content.decode()
    assert base in page  # shown, read-only
    moved = git_repo.commit({"tests/test_calc.py": TEST_CALC + "        pass\n"}, "later")
    data = _change_form(admin_client.get(url))
    assert admin_client.post(url, {**data, "base_revision": moved}).status_code == 302
    assert Mission.objects.get(pk=mission.pk).base_commit == moved
    event = MissionEvent.objects.filter(mission=mission, type="mission:base-changed").order_by("-seq").first()
    assert (event.payload["from"], event.payload["to"], event.payload["cause"]) == (base, moved, "set")
