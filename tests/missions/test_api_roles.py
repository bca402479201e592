"""The REST API's roles table: every endpoint for every role (anonymous, owner, member,
stranger, staff), and what each role may read, authenticate with and change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.authtoken.models import Token

from missions.models import (
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
    Task,
)
from tests.missions.api_helpers import snapshot_tree

pytestmark = pytest.mark.django_db

ROLES = ["anonymous", "owner", "member", "stranger", "staff"]


def user_for(request, role: str):
    return None if role == "anonymous" else request.getfixturevalue(role)


@dataclass(frozen=True)
class Op:
    """One API call on the tree `t`.

    kind: list (object must be in/absent from results), read, create, write, delete, action.
    obj: the tree object the call is about (for lists: which id must appear).
    effect: checks the database after an allowed call.
    """

    name: str
    method: str
    url: Callable[[Any], str]
    kind: str
    ok: int
    obj: Callable[[Any], Any] | None = None
    body: Callable[[Any], dict] | None = None
    effect: Callable[[Any, Any, Any], None] | None = None


def _renamed(model):
    def check(t, obj, response):
        assert model.objects.get(pk=obj.pk).title == "Renamed"
        assert response.json()["title"] == "Renamed"

    return check


def _gone(model):
    def check(t, obj, response):
        assert not model.objects.filter(pk=obj.pk).exists()

    return check


def _created(model, **lookup):
    def check(t, obj, response):
        row = model.objects.get(pk=response.json()["id"])
        for name, value in lookup.items():
            expected = value(t) if callable(value) else value
            assert getattr(row, name) == expected, name

    return check


def _unlinked(t, obj, response):
    assert not FeatureAssertion.objects.filter(feature=obj, assertion=t.a_linked).exists()
    assert response.json()["assertion_keys"] == []


def _linked(t, obj, response):
    assert FeatureAssertion.objects.filter(feature=obj, assertion=t.a_unlinked).exists()
    assert response.json()["assertion_keys"] == ["VAL-002"]


def _read_ok(op: Op, t, body) -> None:
    """A read answers about the object it was asked about."""
    if op.name == "missions.events":
        assert [row["mission"] for row in body["results"]] == [t.mission.pk] * len(body["results"]) and body["results"]
    elif op.name == "milestones.validation":
        assert body["milestone"] == t.milestone.pk and body["state"] == t.milestone.validation_state
    else:
        assert body["id"] == op.obj(t).pk


OPS: list[Op] = [
    # missions
    Op("missions.list", "get", lambda t: "/api/missions/", "list", 200, obj=lambda t: t.mission),
    Op("missions.retrieve", "get", lambda t: f"/api/missions/{t.mission.pk}/", "read", 200, obj=lambda t: t.mission),
    Op(
        "missions.create",
        "post",
        lambda t: "/api/missions/",
        "create",
        201,
        body=lambda t: {"key": "new-mission", "title": "New"},
        effect=_created(Mission, key="new-mission"),
    ),
    Op(
        "missions.update",
        "patch",
        lambda t: f"/api/missions/{t.mission.pk}/",
        "write",
        200,
        obj=lambda t: t.mission,
        body=lambda t: {"title": "Renamed"},
        effect=_renamed(Mission),
    ),
    Op(
        "missions.delete",
        "delete",
        lambda t: f"/api/missions/{t.mission.pk}/",
        "delete",
        204,
        obj=lambda t: t.mission,
        effect=_gone(Mission),
    ),
    Op("missions.tree", "get", lambda t: f"/api/missions/{t.mission.pk}/tree/", "read", 200, obj=lambda t: t.mission),
    Op(
        "missions.events",
        "get",
        lambda t: f"/api/missions/{t.mission.pk}/events/",
        "read",
        200,
        obj=lambda t: t.mission,
    ),
    # milestones
    Op("milestones.list", "get", lambda t: "/api/milestones/", "list", 200, obj=lambda t: t.milestone),
    Op(
        "milestones.retrieve",
        "get",
        lambda t: f"/api/milestones/{t.milestone.pk}/",
        "read",
        200,
        obj=lambda t: t.milestone,
    ),
    Op(
        "milestones.create",
        "post",
        lambda t: "/api/milestones/",
        "create",
        201,
        body=lambda t: {"mission": t.mission.pk, "key": "m-new", "title": "New"},
        effect=_created(Milestone, key="m-new", mission_id=lambda t: t.mission.pk),
    ),
    Op(
        "milestones.update",
        "patch",
        lambda t: f"/api/milestones/{t.milestone.pk}/",
        "write",
        200,
        obj=lambda t: t.milestone,
        body=lambda t: {"title": "Renamed"},
        effect=_renamed(Milestone),
    ),
    Op(
        "milestones.delete",
        "delete",
        lambda t: f"/api/milestones/{t.milestone2.pk}/",
        "delete",
        204,
        obj=lambda t: t.milestone2,
        effect=_gone(Milestone),
    ),
    Op(
        "milestones.validation",
        "get",
        lambda t: f"/api/milestones/{t.milestone.pk}/validation/",
        "read",
        200,
        obj=lambda t: t.milestone,
    ),
    # slices
    Op("slices.list", "get", lambda t: "/api/slices/", "list", 200, obj=lambda t: t.slice),
    Op("slices.retrieve", "get", lambda t: f"/api/slices/{t.slice.pk}/", "read", 200, obj=lambda t: t.slice),
    Op(
        "slices.create",
        "post",
        lambda t: "/api/slices/",
        "create",
        201,
        body=lambda t: {"milestone": t.milestone.pk, "key": "s-new", "title": "New"},
        effect=_created(Slice, key="s-new", mission_id=lambda t: t.mission.pk),
    ),
    Op(
        "slices.update",
        "patch",
        lambda t: f"/api/slices/{t.slice.pk}/",
        "write",
        200,
        obj=lambda t: t.slice,
        body=lambda t: {"title": "Renamed"},
        effect=_renamed(Slice),
    ),
    Op(
        "slices.delete",
        "delete",
        lambda t: f"/api/slices/{t.slice.pk}/",
        "delete",
        204,
        obj=lambda t: t.slice,
        effect=_gone(Slice),
    ),
    # features
    Op("features.list", "get", lambda t: "/api/features/", "list", 200, obj=lambda t: t.f1),
    Op("features.retrieve", "get", lambda t: f"/api/features/{t.f1.pk}/", "read", 200, obj=lambda t: t.f1),
    Op(
        "features.create",
        "post",
        lambda t: "/api/features/",
        "create",
        201,
        body=lambda t: {"slice": t.slice.pk, "key": "f-new", "title": "New"},
        effect=_created(MissionFeature, key="f-new", mission_id=lambda t: t.mission.pk),
    ),
    Op(
        "features.update",
        "patch",
        lambda t: f"/api/features/{t.f1.pk}/",
        "write",
        200,
        obj=lambda t: t.f1,
        body=lambda t: {"title": "Renamed"},
        effect=_renamed(MissionFeature),
    ),
    Op(
        "features.delete",
        "delete",
        lambda t: f"/api/features/{t.f2.pk}/",
        "delete",
        204,
        obj=lambda t: t.f2,
        effect=_gone(MissionFeature),
    ),
    Op(
        "features.link",
        "post",
        lambda t: f"/api/features/{t.f2.pk}/link/",
        "action",
        201,
        obj=lambda t: t.f2,
        body=lambda t: {"assertion": t.a_unlinked.key},
        effect=_linked,
    ),
    Op(
        "features.unlink",
        "post",
        lambda t: f"/api/features/{t.f1.pk}/unlink/",
        "action",
        200,
        obj=lambda t: t.f1,
        body=lambda t: {"assertion": t.a_linked.key},
        effect=_unlinked,
    ),
    # assertions
    Op("assertions.list", "get", lambda t: "/api/assertions/", "list", 200, obj=lambda t: t.a_linked),
    Op(
        "assertions.retrieve",
        "get",
        lambda t: f"/api/assertions/{t.a_linked.pk}/",
        "read",
        200,
        obj=lambda t: t.a_linked,
    ),
    Op(
        "assertions.create",
        "post",
        lambda t: "/api/assertions/",
        "create",
        201,
        body=lambda t: {"milestone": t.milestone.pk, "key": "VAL-NEW", "title": "New", "statement": "it works"},
        effect=_created(ContractAssertion, key="VAL-NEW", mission_id=lambda t: t.mission.pk),
    ),
    Op(
        "assertions.update",
        "patch",
        lambda t: f"/api/assertions/{t.a_linked.pk}/",
        "write",
        200,
        obj=lambda t: t.a_linked,
        body=lambda t: {"title": "Renamed"},
        effect=_renamed(ContractAssertion),
    ),
    Op(
        "assertions.delete",
        "delete",
        lambda t: f"/api/assertions/{t.a_unlinked.pk}/",
        "delete",
        204,
        obj=lambda t: t.a_unlinked,
        effect=_gone(ContractAssertion),
    ),
    # tasks
    Op("tasks.list", "get", lambda t: "/api/tasks/", "list", 200, obj=lambda t: t.task),
    Op("tasks.retrieve", "get", lambda t: f"/api/tasks/{t.task.pk}/", "read", 200, obj=lambda t: t.task),
    Op(
        "tasks.create",
        "post",
        lambda t: "/api/tasks/",
        "create",
        201,
        body=lambda t: {"feature": t.f2.pk, "title": "Implement f2"},
        effect=_created(Task, feature_id=lambda t: t.f2.pk, mission_id=lambda t: t.mission.pk),
    ),
    Op(
        "tasks.update",
        "patch",
        lambda t: f"/api/tasks/{t.task.pk}/",
        "write",
        200,
        obj=lambda t: t.task,
        body=lambda t: {"title": "Renamed"},
        effect=_renamed(Task),
    ),
    Op(
        "tasks.delete",
        "delete",
        lambda t: f"/api/tasks/{t.task.pk}/",
        "delete",
        204,
        obj=lambda t: t.task,
        effect=_gone(Task),
    ),
    # the audit log (read-only)
    Op("events.list", "get", lambda t: "/api/events/", "list", 200, obj=lambda t: t.event),
    Op("events.retrieve", "get", lambda t: f"/api/events/{t.event.pk}/", "read", 200, obj=lambda t: t.event),
]

# What each role gets when it is not simply allowed (status, code).
EXCEPTIONS = {
    ("member", "missions.delete"): (403, "owner_only"),
}


def _results(response) -> list[dict]:
    body = response.json()
    return body["results"] if isinstance(body, dict) and "results" in body else body


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_every_endpoint_for_every_role(request, api, tree, other_tree, role, op):
    t = tree
    client = api(user_for(request, role))
    before = snapshot_tree(t)
    response = getattr(client, op.method)(op.url(t), op.body(t) if op.body else None, format="json")
    body = response.json() if response.content else None

    if role == "anonymous":
        assert response.status_code == 401, body
        assert body["code"] == "not_authenticated"
        assert response.headers["WWW-Authenticate"] == "Token"
        assert snapshot_tree(t) == before
        return

    if role == "stranger":
        if op.kind == "list":
            assert response.status_code == 200, body
            ids = {row["id"] for row in _results(response)}
            assert op.obj(t).pk not in ids  # someone else's object is absent...
            assert op.obj(other_tree).pk in ids  # ...while the stranger's own object is there
        elif op.kind == "create" and op.name != "missions.create":
            # the parent lives in a mission the stranger cannot see: it looks like a missing id
            assert response.status_code == 400, body
            assert body["code"] == "validation_error" and body["fields"]
        elif op.kind == "create":
            assert response.status_code == 201, body  # anyone signed in may start a mission of their own
            assert Mission.objects.get(pk=body["id"]).owner.username == "stranger"
        else:
            assert response.status_code == 404, body
            assert body["code"] == "not_found"
        assert snapshot_tree(t) == before
        return

    if (role, op.name) in EXCEPTIONS:
        status_code, code = EXCEPTIONS[(role, op.name)]
        assert response.status_code == status_code, body
        assert body["code"] == code
        assert snapshot_tree(t) == before
        return

    assert response.status_code == op.ok, body
    if op.kind == "list":
        ids = {row["id"] for row in _results(response)}
        assert op.obj(t).pk in ids
        assert (op.obj(other_tree).pk in ids) == (role == "staff")
    elif op.kind == "read":
        _read_ok(op, t, body)
    if op.effect:
        op.effect(t, op.obj(t) if op.obj else None, response)
    if op.kind in ("list", "read"):
        assert snapshot_tree(t) == before


def test_mission_events_action_lists_the_audit_log_newest_first(api, owner, tree):
    response = api(owner).get(f"/api/missions/{tree.mission.pk}/events/")
    assert response.status_code == 200
    rows = _results(response)
    assert [r["type"] for r in rows] == [
        "milestone:validation:updated",
        "milestone:validation:updated",
        "mission:created",
    ]
    assert [r["seq"] for r in rows] == [3, 2, 1] and rows[-1]["id"] == tree.event.pk


def test_read_only_endpoints_refuse_writes(api, staff, tree):
    client = api(staff)
    assert client.post("/api/events/", {"mission": tree.mission.pk, "type": "x"}, format="json").status_code == 405
    assert client.delete(f"/api/events/{tree.event.pk}/").status_code == 405
    response = client.patch(f"/api/events/{tree.event.pk}/", {"type": "x"}, format="json")
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"
    assert MissionEvent.objects.get(pk=tree.event.pk).type == "mission:created"


def test_token_authentication(api, member, tree):
    token = Token.objects.create(user=member)
    client = api(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.get(f"/api/missions/{tree.mission.pk}/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    response = client.get(f"/api/missions/{tree.mission.pk}/")
    assert response.status_code == 401 and response.json()["code"] == "authentication_failed"
    assert "Invalid token" in response.json()["detail"]
    # A deactivated user's token stops working at once (the token itself is kept).
    type(member).objects.filter(pk=member.pk).update(is_active=False)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    response = client.get(f"/api/missions/{tree.mission.pk}/")
    assert response.status_code == 401 and "inactive" in response.json()["detail"]


@pytest.mark.parametrize("task_id", ["abc", "999999", "99999999999999999999999", "-1"])
def test_completing_a_task_that_is_not_there_answers_404(api, staff, tree, task_id):
    response = api(staff).post(f"/api/tasks/{task_id}/complete/", {"revision": "c" * 40}, format="json")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_session_authentication(client, member, tree):
    client.force_login(member)
    assert client.get(f"/api/missions/{tree.mission.pk}/").status_code == 200
    client.logout()
    response = client.get(f"/api/missions/{tree.mission.pk}/")
    assert response.status_code == 401 and response.json()["code"] == "not_authenticated"


def test_only_owner_or_staff_change_members(api, owner, member, staff, stranger, tree):
    response = api(member).patch(
        f"/api/missions/{tree.mission.pk}/", {"members": [member.pk, stranger.pk]}, format="json"
    )
    assert response.status_code == 403 and response.json()["code"] == "owner_only"
    assert list(tree.mission.members.all()) == [member]
    response = api(owner).patch(
        f"/api/missions/{tree.mission.pk}/", {"members": [member.pk, stranger.pk]}, format="json"
    )
    assert response.status_code == 200
    assert api(stranger).get(f"/api/missions/{tree.mission.pk}/tree/").status_code == 200  # now a member
    assert api(staff).patch(f"/api/missions/{tree.mission.pk}/", {"members": []}, format="json").status_code == 200
    assert api(stranger).get(f"/api/missions/{tree.mission.pk}/tree/").status_code == 404


def test_list_filters(api, member, tree):
    client = api(member)
    rows = _results(client.get("/api/features/", {"slice": tree.slice.pk, "key": "f2"}))
    assert [r["id"] for r in rows] == [tree.f2.pk]
    rows = _results(client.get("/api/assertions/", {"scope": "milestone"}))
    assert [r["key"] for r in rows] == ["VAL-M01"]
    body = client.get("/api/milestones/").json()
    assert body["count"] == 2 and [r["key"] for r in body["results"]] == ["m1", "m2"]
