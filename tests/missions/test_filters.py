"""List filters never tell a stranger whether a mission exists."""

from __future__ import annotations

import pytest

from missions.models import Mission

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "endpoint",
    ["/api/milestones/", "/api/features/", "/api/assertions/", "/api/tasks/", "/api/validation-runs/", "/api/events/"],
)
def test_filtering_by_someone_elses_mission_looks_like_filtering_by_a_missing_one(
    endpoint, api_for, alice, django_user_model
):
    bob = django_user_model.objects.create_user("bob")
    hidden = Mission.objects.create(key="hidden", title="Hidden", owner=bob)
    client = api_for(alice)
    theirs = client.get(endpoint, {"mission": hidden.pk})
    missing = client.get(endpoint, {"mission": hidden.pk + 1000})
    assert theirs.status_code == missing.status_code == 200
    assert theirs.json()["count"] == missing.json()["count"] == 0


def test_a_non_numeric_id_filter_is_a_clear_400(api_for, alice):
    response = api_for(alice).get("/api/features/", {"mission": "abc"})
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error" and "mission" in response.json()["fields"]


@pytest.mark.parametrize("name", ["repository", "workspace"])  # `workspace`: its former name
def test_api_import_refuses_a_relative_repository_and_writes_nothing(api_for, alice, name):
    body = f"mission: {{key: rel, title: Rel, {name}: ./repo}}\nmilestones: []\n"
    response = api_for(alice).post("/api/missions/import/", body, content_type="application/yaml")
    assert response.status_code == 400 and response.json()["code"] == "invalid_mission_file"
    assert response.json()["fields"] == {
        "errors": [f"mission.{name}: a file sent to the API needs a git URL or an absolute repository path"]
    }
    assert not Mission.objects.filter(key="rel").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/api/validation-runs/?feature=18159483890220734636206691788521472",
        "/api/features/?mission=99999999999999999999999",
    ],
)
def test_an_id_the_database_cannot_hold_is_a_bad_request_not_a_server_error(api_for, alice, path):
    response = api_for(alice).get(path)
    assert response.status_code == 400 and response.json()["code"], response.content
