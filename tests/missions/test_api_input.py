"""The REST API refuses what only staff may set and every kind of bad input, and writes
nothing when it refuses."""

from __future__ import annotations

import pytest

from missions.models import (
    ContractAssertion,
    LoopState,
    Milestone,
    Mission,
    MissionFeature,
    Slice,
    Task,
)
from tests.missions.api_helpers import snapshot_tree

pytestmark = pytest.mark.django_db

# --------------------------------------------------------------------------- staff only


def test_member_cannot_set_a_check(api, member, owner, tree, counts):
    before, rows = snapshot_tree(tree), counts()
    for user in (member, owner):
        response = api(user).patch(f"/api/assertions/{tree.a_linked.pk}/", {"check": {"run": "true"}}, format="json")
        assert response.status_code == 403, response.json()
        assert response.json()["code"] == "staff_only" and "check" in response.json()["fields"]
        response = api(user).post(
            "/api/assertions/",
            {
                "milestone": tree.milestone.pk,
                "key": "VAL-X",
                "title": "x",
                "statement": "x",
                "check": {"file": "a.txt", "exists": True},
            },
            format="json",
        )
        assert response.status_code == 403 and response.json()["code"] == "staff_only"
    assert snapshot_tree(tree) == before and counts() == rows


def test_member_cannot_set_an_executor_command(api, member, tree, counts):
    before, rows = snapshot_tree(tree), counts()
    response = api(member).patch(
        f"/api/missions/{tree.mission.pk}/", {"executor": "command", "executor_command": "agent --yolo"}, format="json"
    )
    assert response.status_code == 403 and response.json()["code"] == "staff_only"
    response = api(member).post(
        "/api/missions/", {"key": "mine", "title": "Mine", "executor_command": "agent"}, format="json"
    )
    assert response.status_code == 403 and response.json()["code"] == "staff_only"
    assert snapshot_tree(tree) == before and counts() == rows
    mission = Mission.objects.get(pk=tree.mission.pk)
    assert (mission.executor, mission.executor_command) == ("manual", "")


def test_staff_can_set_checks_and_executor_commands(api, staff, member, tree):
    response = api(staff).patch(
        f"/api/assertions/{tree.a_linked.pk}/", {"check": {"run": "pytest -q", "timeout": 30}}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert ContractAssertion.objects.get(pk=tree.a_linked.pk).check_spec == {"run": "pytest -q", "timeout": 30}
    response = api(staff).post(
        "/api/assertions/",
        {
            "milestone": tree.milestone.pk,
            "key": "VAL-F",
            "title": "f",
            "statement": "s",
            "check": {"file": "README.md", "exists": True},
        },
        format="json",
    )
    assert response.status_code == 201 and response.json()["check"] == {"file": "README.md", "exists": True}
    response = api(staff).patch(
        f"/api/missions/{tree.mission.pk}/", {"executor": "command", "executor_command": "agent -p"}, format="json"
    )
    assert response.status_code == 200
    assert Mission.objects.get(pk=tree.mission.pk).executor_command == "agent -p"
    # a member may still edit other fields, sending the check back unchanged or not at all
    response = api(member).patch(
        f"/api/assertions/{tree.a_linked.pk}/",
        {"title": "Better", "check": {"run": "pytest -q", "timeout": 30}},
        format="json",
    )
    assert response.status_code == 200, response.json()
    response = api(member).patch(f"/api/missions/{tree.mission.pk}/", {"title": "Still mine"}, format="json")
    assert response.status_code == 200
    assert Mission.objects.get(pk=tree.mission.pk).executor_command == "agent -p"


# --------------------------------------------------------------------------- bad input


def assert_invalid_and_nothing_written(client, url, body, counts, expected_code="validation_error", field=None):
    rows = counts()
    response = client.post(url, body, format="json")
    assert response.status_code == 400, response.json()
    data = response.json()
    assert data["code"] == expected_code, data
    assert isinstance(data["fields"], dict) and data["fields"], data
    if field:
        assert field in data["fields"], data
    assert counts() == rows
    return data


MISSING_TITLE = [
    ("/api/missions/", lambda t: {"key": "k-new"}),
    ("/api/milestones/", lambda t: {"mission": t.mission.pk, "key": "k-new"}),
    ("/api/slices/", lambda t: {"milestone": t.milestone.pk, "key": "k-new"}),
    ("/api/features/", lambda t: {"slice": t.slice.pk, "key": "k-new"}),
    ("/api/assertions/", lambda t: {"milestone": t.milestone.pk, "key": "K-NEW", "statement": "s"}),
]


@pytest.mark.parametrize("url,body", MISSING_TITLE, ids=[u for u, _ in MISSING_TITLE])
def test_missing_title(api, member, tree, counts, url, body):
    assert_invalid_and_nothing_written(api(member), url, body(tree), counts, field="title")


@pytest.mark.parametrize("url,body", MISSING_TITLE, ids=[u for u, _ in MISSING_TITLE])
@pytest.mark.parametrize("key", ["not a slug", "semi;colon", "dots.are.not.slugs", "", "x" * 200])
def test_bad_slug_key(api, member, tree, counts, url, body, key):
    assert_invalid_and_nothing_written(api(member), url, {**body(tree), "key": key, "title": "T"}, counts, field="key")


def test_title_too_long(api, member, tree, counts):
    assert_invalid_and_nothing_written(
        api(member),
        "/api/features/",
        {"slice": tree.slice.pk, "key": "long", "title": "x" * 201},
        counts,
        field="title",
    )


DUPLICATES = [
    ("/api/milestones/", lambda t: {"mission": t.mission.pk, "key": "m1", "title": "Again"}),
    ("/api/slices/", lambda t: {"milestone": t.milestone2.pk, "key": "s1", "title": "Again"}),
    ("/api/features/", lambda t: {"slice": t.slice.pk, "key": "f1", "title": "Again"}),
    (
        "/api/assertions/",
        lambda t: {"milestone": t.milestone2.pk, "key": "VAL-001", "title": "Again", "statement": "s"},
    ),
]


@pytest.mark.parametrize("url,body", DUPLICATES, ids=[u for u, _ in DUPLICATES])
def test_duplicate_key_in_the_mission(api, member, tree, counts, url, body):
    data = assert_invalid_and_nothing_written(
        api(member), url, body(tree), counts, expected_code="duplicate_key", field="key"
    )
    assert data["detail"]


@pytest.mark.parametrize("url,body", DUPLICATES, ids=[u for u, _ in DUPLICATES])
def test_same_key_in_another_mission_is_fine(api, stranger, tree, other_tree, url, body):
    # other_tree uses the very same keys; creating them once more in a fresh mission works
    fresh = Mission.objects.create(key="gamma", title="Gamma", owner=stranger)
    m = Milestone.objects.create(mission=fresh, key="mx", title="X")
    s = Slice(milestone=m, key="sx", title="X")
    s.save()
    payload = body(tree)
    for field, value in (("mission", fresh.pk), ("milestone", m.pk), ("slice", s.pk)):
        if field in payload:
            payload[field] = value
    response = api(stranger).post(url, payload, format="json")
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize(
    "url,obj,key",
    [
        ("/api/milestones/{}/", "milestone2", "m1"),
        ("/api/slices/{}/", "slice", "s-other"),
        ("/api/features/{}/", "f2", "f1"),
        ("/api/assertions/{}/", "a_unlinked", "VAL-001"),
    ],
)
def test_duplicate_key_on_update(api, member, tree, url, obj, key):
    if key == "s-other":
        other = Slice(milestone=tree.milestone, key="s-other", title="Other")
        other.save()
    before = snapshot_tree(tree)
    response = api(member).patch(url.format(getattr(tree, obj).pk), {"key": key, "title": "Renamed"}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "duplicate_key"
    assert snapshot_tree(tree) == before


def test_duplicate_mission_key(api, member, other_tree, counts):
    assert_invalid_and_nothing_written(
        api(member), "/api/missions/", {"key": "beta", "title": "Taken"}, counts, field="key"
    )


@pytest.mark.parametrize(
    "check",
    [
        {"run": ""},
        {"run": "   "},
        {"file": "../x", "exists": True},
        {"file": "/etc/passwd", "exists": True},
        {"file": "a/../../b", "contains": "x"},
        {"file": "a.txt"},
        {"file": "a.txt", "exists": True, "contains": "x"},
        {"file": "a.txt", "contains": "("},
        {"run": "pytest", "timeout": 0},
        {"run": "pytest", "timeout": 10**9},
        {"run": "pytest", "expect_exit": "zero"},
        {"run": "pytest", "shell": "yes"},
        {"run": "pytest", "rm": "-rf"},
        {"run": "pytest", "file": "a.txt"},
        {"nothing": True},
        "pytest -q",
        ["pytest"],
    ],
)
def test_bad_check_shape(api, staff, tree, counts, check):
    # staff, so that only the shape can be the reason for the refusal
    assert_invalid_and_nothing_written(
        api(staff),
        "/api/assertions/",
        {"milestone": tree.milestone.pk, "key": "VAL-C", "title": "c", "statement": "s", "check": check},
        counts,
        field="check",
    )
    before = snapshot_tree(tree)
    response = api(staff).patch(f"/api/assertions/{tree.a_linked.pk}/", {"check": check}, format="json")
    assert response.status_code == 400 and "check" in response.json()["fields"]
    assert snapshot_tree(tree) == before


@pytest.mark.parametrize(
    "url,body,field",
    [
        ("/api/milestones/", lambda t, o: {"mission": o.mission.pk, "key": "k", "title": "t"}, "mission"),
        ("/api/slices/", lambda t, o: {"milestone": o.milestone.pk, "key": "k", "title": "t"}, "milestone"),
        ("/api/features/", lambda t, o: {"slice": o.slice.pk, "key": "k", "title": "t"}, "slice"),
        (
            "/api/assertions/",
            lambda t, o: {"milestone": o.milestone.pk, "key": "K", "title": "t", "statement": "s"},
            "milestone",
        ),
        ("/api/tasks/", lambda t, o: {"feature": o.f2.pk, "title": "t"}, "feature"),
        ("/api/tasks/", lambda t, o: {"mission": o.mission.pk, "title": "t"}, "mission"),
        (
            "/api/milestones/",
            lambda t, o: {"mission": t.mission.pk, "key": "k", "title": "t", "dependencies": [o.milestone.pk]},
            "dependencies",
        ),
    ],
)
def test_parent_in_a_mission_you_cannot_see(api, member, tree, other_tree, counts, url, body, field):
    assert_invalid_and_nothing_written(api(member), url, body(tree, other_tree), counts, field=field)


@pytest.mark.parametrize(
    "url,obj,body,field",
    [
        ("/api/slices/{}/", "slice", lambda o: {"milestone": o.milestone.pk}, "milestone"),
        ("/api/features/{}/", "f1", lambda o: {"slice": o.slice.pk}, "slice"),
        ("/api/assertions/{}/", "a_linked", lambda o: {"milestone": o.milestone.pk}, "milestone"),
        ("/api/milestones/{}/", "milestone", lambda o: {"mission": o.mission.pk}, "mission"),
    ],
)
def test_cannot_move_into_a_mission_you_cannot_see(api, member, tree, other_tree, url, obj, body, field):
    before, other_before = snapshot_tree(tree), snapshot_tree(other_tree)
    response = api(member).patch(url.format(getattr(tree, obj).pk), body(other_tree), format="json")
    assert response.status_code == 400 and field in response.json()["fields"]
    assert snapshot_tree(tree) == before and snapshot_tree(other_tree) == other_before


@pytest.mark.parametrize(
    "url,obj,body,field",
    [
        ("/api/slices/{}/", "slice", lambda o: {"milestone": o.milestone.pk}, "milestone"),
        ("/api/features/{}/", "f1", lambda o: {"slice": o.slice.pk}, "slice"),
        ("/api/assertions/{}/", "a_linked", lambda o: {"milestone": o.milestone.pk}, "milestone"),
        ("/api/milestones/{}/", "milestone", lambda o: {"mission": o.mission.pk}, "mission"),
    ],
)
def test_cannot_move_to_another_visible_mission(api, staff, tree, other_tree, url, obj, body, field):
    before, other_before = snapshot_tree(tree), snapshot_tree(other_tree)
    response = api(staff).patch(url.format(getattr(tree, obj).pk), body(other_tree), format="json")
    assert response.status_code == 400 and field in response.json()["fields"], response.json()
    assert snapshot_tree(tree) == before and snapshot_tree(other_tree) == other_before


def test_milestone_dependency_cycle(api, member, tree, counts):
    client = api(member)
    m3 = client.post(
        "/api/milestones/",
        {"mission": tree.mission.pk, "key": "m3", "title": "Three", "dependencies": [tree.milestone2.pk]},
        format="json",
    )
    assert m3.status_code == 201 and m3.json()["dependencies"] == [tree.milestone2.pk]
    m3_id = m3.json()["id"]
    assert (
        client.patch(
            f"/api/milestones/{tree.milestone2.pk}/", {"dependencies": [tree.milestone.pk]}, format="json"
        ).status_code
        == 200
    )
    # m1 -> m3 would close m1 <- m2 <- m3 <- m1
    before, rows = snapshot_tree(tree), counts()
    response = client.patch(
        f"/api/milestones/{tree.milestone.pk}/", {"title": "Renamed", "dependencies": [m3_id]}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "dependency_cycle" and "dependencies" in response.json()["fields"]
    assert snapshot_tree(tree) == before and counts() == rows
    # depending on itself
    response = client.patch(
        f"/api/milestones/{tree.milestone.pk}/", {"dependencies": [tree.milestone.pk]}, format="json"
    )
    assert response.status_code == 400 and "dependencies" in response.json()["fields"]
    assert snapshot_tree(tree) == before
    # an acyclic change is fine
    response = client.patch(
        f"/api/milestones/{m3_id}/", {"dependencies": [tree.milestone.pk, tree.milestone2.pk]}, format="json"
    )
    assert response.status_code == 200 and sorted(response.json()["dependencies"]) == sorted(
        [tree.milestone.pk, tree.milestone2.pk]
    )


def test_dependency_on_another_visible_mission(api, staff, tree, other_tree, counts):
    assert_invalid_and_nothing_written(
        api(staff),
        "/api/milestones/",
        {"mission": tree.mission.pk, "key": "m3", "title": "x", "dependencies": [other_tree.milestone.pk]},
        counts,
        expected_code="invalid",
        field="dependencies",
    )


def test_malformed_json_body(api, member, counts):
    rows = counts()
    response = api(member).post("/api/missions/", "{not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "parse_error"
    assert counts() == rows


def test_task_validation(api, member, tree, counts):
    client = api(member)
    assert_invalid_and_nothing_written(client, "/api/tasks/", {"title": "nowhere"}, counts, field="mission")
    assert_invalid_and_nothing_written(
        client,
        "/api/tasks/",
        {
            "title": "x",
            "feature": tree.f2.pk,
            "mission": Mission.objects.create(key="m-two", title="t", owner=member).pk,
        },
        counts,
        field="feature",
    )
    rows = counts()
    response = client.post("/api/tasks/", {"feature": tree.f1.pk, "title": "second"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "task_open"
    assert counts() == rows
    response = client.patch(f"/api/tasks/{tree.task.pk}/", {"feature": tree.f2.pk}, format="json")
    assert response.status_code == 400 and "feature" in response.json()["fields"]
    assert Task.objects.get(pk=tree.task.pk).feature_id == tree.f1.pk


def test_creating_a_task_starts_the_feature_loop(api, member, tree):
    response = api(member).post("/api/tasks/", {"feature": tree.f2.pk}, format="json")
    assert response.status_code == 201, response.json()
    f2 = MissionFeature.objects.get(pk=tree.f2.pk)
    assert f2.loop_state == LoopState.IMPLEMENTING and f2.implementation_attempts == 1
    assert response.json()["title"] == "Feature two" and response.json()["mission"] == tree.mission.pk
