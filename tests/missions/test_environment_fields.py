"""A declared environment (docs/ENVIRONMENTS.md) as every writer takes it: the mission
file (import, export, path-named errors), the API (shown, set by the owner or staff
only, a milestone's own or the mission's), and the run's input fingerprint."""

from __future__ import annotations

import copy

import pytest
import yaml

from missions.errors import Invalid
from missions.models import Milestone, Mission
from missions.services.files import mission_export, mission_import
from validation.services.run_input import input_fingerprint

pytestmark = pytest.mark.django_db

PYTHON = {"preset": "python", "setup": ["pip install --no-index --find-links wheels -r requirements.txt"]}
NODE = {"preset": "node", "key_files": ["package-lock.json"], "path": ["node_modules/.bin", "bin"]}
FILE = {
    "mission": {"key": "envs", "title": "Environments", "environment": PYTHON},
    "milestones": [
        {"key": "web", "title": "Web", "environment": NODE},
        {"key": "api", "title": "API"},
    ],
}


def import_error_lines(document: dict) -> list[str]:
    with pytest.raises(Invalid) as exc:
        mission_import(document=document)
    return exc.value.fields["errors"]


def test_a_mission_file_declares_environments_and_its_export_round_trips():
    mission, _ = mission_import(document=copy.deepcopy(FILE))
    assert mission.environment == PYTHON
    assert {m.key: m.environment for m in Milestone.objects.filter(mission=mission)} == {"web": NODE, "api": None}
    exported = mission_export(mission=mission)
    data = yaml.safe_load(exported)
    assert data["mission"]["environment"] == PYTHON
    assert [m["environment"] for m in data["milestones"]] == [NODE, None]
    again, changed = mission_import(document=exported)
    assert again.pk == mission.pk and not changed


@pytest.mark.parametrize(
    ("where", "environment", "expected"),
    [
        ("mission", {"preset": "ruby"}, "mission.environment.preset: must be one of none, python, node"),
        ("mission", {"setup": "make"}, "mission.environment.setup: must be a list of shell commands"),
        ("milestone", {"setup": ["make", 3]}, "milestones[0].environment.setup[1]: must be a non-empty string"),
        ("mission", {"key_files": ["../secrets"]}, "mission.environment.key_files[0]: must not contain `..`"),
        ("mission", {"key_files": ["/etc/passwd"]}, "mission.environment.key_files[0]: must be relative"),
        ("milestone", {"path": ["../bin"]}, "milestones[0].environment.path[0]: must be a folder relative"),
        ("mission", {"image": "python:3"}, "mission.environment.image: unknown field"),
        ("mission", ["python"], "mission.environment: must be a mapping"),
    ],
)
def test_a_bad_environment_is_refused_with_its_path(where, environment, expected):
    document = copy.deepcopy(FILE)
    if where == "mission":
        document["mission"]["environment"] = environment
    else:
        document["milestones"][0]["environment"] = environment
    lines = import_error_lines(document)
    assert any(line.startswith(expected) for line in lines), lines
    assert not Mission.objects.exists()


def test_the_api_shows_the_environment_and_only_the_owner_or_staff_change_it(api_for, alice, staff, django_user_model):
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    created = api_for(alice).post("/api/missions/", {"key": "m", "title": "M", "environment": PYTHON}, format="json")
    assert created.status_code == 201, created.json()
    mission = Mission.objects.get(key="m")
    mission.members.add(bob)
    assert api_for(bob).get(f"/api/missions/{mission.pk}/").json()["environment"] == PYTHON

    refused = api_for(bob).patch(f"/api/missions/{mission.pk}/", {"environment": {}}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "owner_only", refused.json()
    bad = api_for(alice).patch(f"/api/missions/{mission.pk}/", {"environment": {"preset": "ruby"}}, format="json")
    assert bad.status_code == 400 and "environment" in str(bad.json())
    assert Mission.objects.get(pk=mission.pk).environment == PYTHON
    changed = api_for(staff).patch(f"/api/missions/{mission.pk}/", {"environment": NODE}, format="json")
    assert changed.status_code == 200 and changed.json()["environment"] == NODE

    # A milestone's own: null is the mission's.
    made = api_for(alice).post("/api/milestones/", {"mission": mission.pk, "key": "ms", "title": "MS"}, format="json")
    assert made.status_code == 201 and made.json()["environment"] is None, made.json()
    url = f"/api/milestones/{made.json()['id']}/"
    refused = api_for(bob).patch(url, {"environment": {"preset": "none"}}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "owner_only", refused.json()
    own = api_for(alice).patch(url, {"environment": PYTHON}, format="json")
    assert own.status_code == 200 and own.json()["environment"] == PYTHON
    assert api_for(alice).patch(url, {"environment": None}, format="json").json()["environment"] is None


def test_a_pass_under_another_environment_is_not_reused():
    same = {"revision": "a" * 40, "assertions": [], "profile": {"name": "checks", "kind": "checks"}}
    without = input_fingerprint(**same)
    assert input_fingerprint(**same, environment=None) == without  # no environment: the keys of before
    python = input_fingerprint(**same, environment={"preset": "python", "setup": [], "key_files": [], "path": []})
    node = input_fingerprint(**same, environment={"preset": "node", "setup": [], "key_files": [], "path": []})
    assert len({without, python, node}) == 3


def test_the_admin_shows_and_checks_the_environment_of_a_mission_and_a_milestone(admin_client):
    from missions.admin.forms import MilestoneForm

    mission, _ = mission_import(document=copy.deepcopy(FILE))
    web = Milestone.objects.get(mission=mission, key="web")
    for url in (f"/admin/missions/mission/{mission.pk}/change/", f"/admin/missions/milestone/{web.pk}/change/"):
        page = admin_client.get(url)
        assert page.status_code == 200 and 'name="environment"' in page.content.decode(), url
    fields = {"mission": mission.pk, "key": "web", "title": "Web", "order": 0, "status": web.status}
    fields["validation_state"] = web.validation_state
    bad = MilestoneForm(instance=web, data={**fields, "environment": '{"preset": "ruby"}'})
    assert not bad.is_valid() and "must be one of none, python, node" in str(bad.errors["environment"])
    inherit = MilestoneForm(instance=web, data={**fields, "environment": ""})
    assert inherit.is_valid(), inherit.errors
    assert inherit.cleaned_data["environment"] is None  # emptied: the mission's
