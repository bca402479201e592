"""`POST /api/missions/plan/` and `POST /api/missions/apply/?plan_hash=`: the dry run over HTTP
writes nothing; the apply answers as the import; refusals carry stable codes."""

from __future__ import annotations

import json

import pytest
import yaml

from missions.models import Mission, MissionEvent, MissionFeature
from tests.missions.file_helpers import sample

pytestmark = pytest.mark.django_db


def _file() -> str:
    data = sample()
    for m in data["milestones"]:
        for a in m["assertions"]:
            a.pop("check", None)
    return yaml.safe_dump(data)


def test_plan_then_apply_over_the_api(api, owner, stranger):
    client = api(owner)
    planned = client.post("/api/missions/plan/", _file(), content_type="application/yaml")
    assert planned.status_code == 200, planned.json()
    body = planned.json()
    assert body["applicable"] and body["mission_key"] == "shop" and len(body["created"]) == 12
    assert Mission.objects.count() == 0 and MissionEvent.objects.count() == 0
    missing = client.post("/api/missions/apply/", _file(), content_type="application/yaml")
    assert missing.status_code == 400 and missing.json()["code"] == "validation_error"
    applied = client.post(
        f"/api/missions/apply/?plan_hash={body['plan_hash']}", _file(), content_type="application/yaml"
    )
    assert applied.status_code == 201, applied.json()
    assert applied.json()["key"] == "shop" and applied.json()["changed"] is True
    assert [i["key"] for i in applied.json()["plan"]["created"]] == [i["key"] for i in body["created"]]
    assert MissionFeature.objects.filter(mission__key="shop").count() == 3
    # The same hash again: the mission moved on since that plan.
    again = client.post(f"/api/missions/apply/?plan_hash={body['plan_hash']}", _file(), content_type="application/yaml")
    assert again.status_code == 409 and again.json()["code"] == "plan_stale"
    # Someone else's mission is not found, for a plan and an apply alike.
    other = api(stranger).post("/api/missions/plan/", _file(), content_type="application/yaml")
    assert other.status_code == 404 and other.json()["code"] == "not_found"
    other = api(stranger).post(
        f"/api/missions/apply/?plan_hash={body['plan_hash']}", _file(), content_type="application/yaml"
    )
    assert other.status_code == 404 and other.json()["code"] == "not_found"


def test_a_plan_of_an_invalid_file_names_each_mistake_and_its_apply_is_the_imports_error(api, owner):
    data = yaml.safe_load(_file())
    data["milestones"][0]["slices"][0]["features"][0]["assertions"] = ["VAL-NOPE"]
    text = json.dumps(data)
    planned = api(owner).post("/api/missions/plan/", text, content_type="application/json")
    assert planned.status_code == 200
    body = planned.json()
    assert body["applicable"] is False and body["plan_hash"] is None and body["code"] == "invalid_mission_file"
    assert [r["path"] for r in body["refused"]] == ["milestones[0].slices[0].features[0].assertions"]
    applied = api(owner).post("/api/missions/apply/?plan_hash=x:y", text, content_type="application/json")
    assert applied.status_code == 400 and applied.json()["code"] == "invalid_mission_file"
    assert applied.json()["fields"]["errors"] == body["errors"]
    assert Mission.objects.count() == 0
