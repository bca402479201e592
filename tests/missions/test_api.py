"""The REST API of the planning hierarchy: who may do what, bad input, link/unlink,
events, the tree, the OpenAPI schema and the mission-file endpoints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.authtoken.models import Token

from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    LoopState,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    RollupState,
    Slice,
    Task,
)

pytestmark = pytest.mark.django_db

ROLES = ["anonymous", "owner", "member", "stranger", "staff"]


def user_for(request, role: str):
    return None if role == "anonymous" else request.getfixturevalue(role)


def new_event_types(since_id: int) -> list[str]:
    return list(
        MissionEvent.objects.filter(pk__gt=since_id).order_by("mission_id", "seq").values_list("type", flat=True)
    )


def last_event_id() -> int:
    return MissionEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def snapshot_tree(t) -> dict[str, Any]:
    """Every row of a tree with its title and updated_at, plus links and dependencies."""
    out: dict[str, Any] = {}
    for model in (Mission, Milestone, Slice, MissionFeature, ContractAssertion, Task):
        path = "pk" if model is Mission else "mission"
        out[model.__name__] = sorted(
            model.objects.filter(**{path: t.mission.pk}).values_list("pk", "title", "updated_at")
        )
    out["links"] = sorted(
        FeatureAssertion.objects.filter(feature__mission=t.mission).values_list("feature_id", "assertion_id")
    )
    out["deps"] = sorted(
        Milestone.dependencies.through.objects.filter(from_milestone__mission=t.mission).values_list(
            "from_milestone_id", "to_milestone_id"
        )
    )
    out["checks"] = sorted(ContractAssertion.objects.filter(mission=t.mission).values_list("pk", "check_spec"))
    out["executor_command"] = Mission.objects.get(pk=t.mission.pk).executor_command
    out["members"] = sorted(t.mission.members.values_list("pk", flat=True))
    out["events"] = MissionEvent.objects.filter(mission=t.mission).count()
    return out


# --------------------------------------------------------------------------- roles table


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


def _post_invalid(client, url, body, counts, expected_code="validation_error", field=None):
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
    _post_invalid(api(member), url, body(tree), counts, field="title")


@pytest.mark.parametrize("url,body", MISSING_TITLE, ids=[u for u, _ in MISSING_TITLE])
@pytest.mark.parametrize("key", ["not a slug", "semi;colon", "dots.are.not.slugs", "", "x" * 200])
def test_bad_slug_key(api, member, tree, counts, url, body, key):
    _post_invalid(api(member), url, {**body(tree), "key": key, "title": "T"}, counts, field="key")


def test_title_too_long(api, member, tree, counts):
    _post_invalid(
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
    data = _post_invalid(api(member), url, body(tree), counts, expected_code="duplicate_key", field="key")
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
    _post_invalid(api(member), "/api/missions/", {"key": "beta", "title": "Taken"}, counts, field="key")


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
    _post_invalid(
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
    _post_invalid(api(member), url, body(tree, other_tree), counts, field=field)


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
    _post_invalid(
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
    _post_invalid(client, "/api/tasks/", {"title": "nowhere"}, counts, field="mission")
    _post_invalid(
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


# --------------------------------------------------------------------------- link / unlink


def test_link_and_unlink(api, member, tree, counts):
    client = api(member)
    url = f"/api/features/{tree.f2.pk}/"
    response = client.post(url + "link/", {"assertion": "VAL-002"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["assertion_keys"] == ["VAL-002"]

    rows = counts()
    response = client.post(url + "link/", {"assertion": "VAL-002"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "already_linked"
    response = client.post(url + "link/", {"assertion": str(tree.a_unlinked.pk)}, format="json")  # by id: same link
    assert response.status_code == 409 and response.json()["code"] == "already_linked"
    assert counts() == rows

    response = client.post(url + "link/", {"assertion": str(tree.a_linked.pk)}, format="json")  # by id
    assert response.status_code == 201
    assert response.json()["assertion_keys"] == ["VAL-001", "VAL-002"]

    response = client.post(url + "unlink/", {"assertion": "VAL-001"}, format="json")
    assert response.status_code == 200 and response.json()["assertion_keys"] == ["VAL-002"]
    rows = counts()
    response = client.post(url + "unlink/", {"assertion": "VAL-001"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "not_linked"
    response = client.post(url + "unlink/", {"assertion": str(tree.a_milestone.pk)}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "not_linked"
    assert counts() == rows
    assert list(FeatureAssertion.objects.filter(feature=tree.f2).values_list("assertion__key", flat=True)) == [
        "VAL-002"
    ]


@pytest.mark.parametrize("ref", ["VAL-M01", "id"])
def test_linking_a_milestone_scoped_assertion_is_refused(api, member, tree, counts, ref):
    rows = counts()
    value = str(tree.a_milestone.pk) if ref == "id" else ref
    response = api(member).post(f"/api/features/{tree.f2.pk}/link/", {"assertion": value}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "milestone_scoped" and "assertion" in response.json()["fields"]
    assert counts() == rows


@pytest.mark.parametrize("ref", ["VAL-404", "999999", "99999999999999999999999", "²", "VAL 001"])
def test_linking_an_unknown_assertion_is_refused(api, member, tree, counts, ref):
    rows = counts()
    response = api(member).post(f"/api/features/{tree.f2.pk}/link/", {"assertion": ref}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "unknown_assertion"
    assert counts() == rows


@pytest.mark.parametrize("body", [{}, {"assertion": ""}, {"assertion": None}, {"assertion": "  "}])
def test_link_without_an_assertion(api, member, tree, counts, body):
    rows = counts()
    response = api(member).post(f"/api/features/{tree.f2.pk}/link/", body, format="json")
    assert response.status_code == 400 and "assertion" in response.json()["fields"]
    assert counts() == rows


def test_cross_mission_assertion_is_refused(api, staff, tree, other_tree, counts):
    rows = counts()
    # staff sees both missions: the other mission's assertion is still not linkable
    response = api(staff).post(
        f"/api/features/{tree.f2.pk}/link/", {"assertion": str(other_tree.a_unlinked.pk)}, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "unknown_assertion"
    assert counts() == rows


def test_assertion_with_links_cannot_become_milestone_scoped(api, member, tree):
    before = snapshot_tree(tree)
    response = api(member).patch(f"/api/assertions/{tree.a_linked.pk}/", {"scope": "milestone"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "linked_assertion"
    assert snapshot_tree(tree) == before
    response = api(member).patch(f"/api/assertions/{tree.a_unlinked.pk}/", {"scope": "milestone"}, format="json")
    assert response.status_code == 200
    assert ContractAssertion.objects.get(pk=tree.a_unlinked.pk).scope == AssertionScope.MILESTONE


def test_feature_assertion_model_validation(tree, other_tree):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as info:
        FeatureAssertion(feature=tree.f2, assertion=tree.a_milestone).full_clean()
    assert "assertion" in info.value.message_dict
    with pytest.raises(ValidationError):
        FeatureAssertion(feature=tree.f2, assertion=other_tree.a_unlinked).full_clean()
    FeatureAssertion(feature=tree.f2, assertion=tree.a_unlinked).full_clean()  # a valid link passes


# --------------------------------------------------------------------------- events


def test_creating_an_assertion_writes_its_events(api, member, tree):
    since = last_event_id()
    response = api(member).post(
        "/api/assertions/",
        {"milestone": tree.milestone.pk, "key": "VAL-NEW", "title": "New", "statement": "s"},
        format="json",
    )
    assert response.status_code == 201
    assert new_event_types(since) == ["assertion:created", "milestone:validation:updated"]
    created, rollup = MissionEvent.objects.filter(pk__gt=since).order_by("seq")
    assert created.payload["key"] == "VAL-NEW" and created.actor == member
    assert rollup.payload["state"] == RollupState.NEEDS_COVERAGE and rollup.payload["milestone"] == tree.milestone.pk
    assert rollup.seq == created.seq + 1


def test_link_and_unlink_write_their_events(api, member, tree):
    client = api(member)
    since = last_event_id()
    assert client.post(f"/api/features/{tree.f2.pk}/link/", {"assertion": "VAL-002"}, format="json").status_code == 201
    assert new_event_types(since) == ["assertion:linked", "milestone:validation:updated"]
    linked = MissionEvent.objects.get(pk__gt=since, type="assertion:linked")
    assert linked.payload["feature"] == tree.f2.pk and linked.payload["key"] == "VAL-002"
    since = last_event_id()
    assert (
        client.post(f"/api/features/{tree.f2.pk}/unlink/", {"assertion": "VAL-002"}, format="json").status_code == 200
    )
    assert new_event_types(since) == ["assertion:unlinked", "milestone:validation:updated"]


def test_updating_and_deleting_an_assertion_write_their_events(api, member, tree):
    client = api(member)
    since = last_event_id()
    assert (
        client.patch(f"/api/assertions/{tree.a_unlinked.pk}/", {"title": "Changed"}, format="json").status_code == 200
    )
    assert new_event_types(since) == ["assertion:updated", "milestone:validation:updated"]
    since = last_event_id()
    assert (
        client.patch(f"/api/assertions/{tree.a_unlinked.pk}/", {"title": "Changed"}, format="json").status_code == 200
    )
    assert new_event_types(since) == []  # nothing changed, nothing announced
    since = last_event_id()
    assert client.delete(f"/api/assertions/{tree.a_unlinked.pk}/").status_code == 204
    assert new_event_types(since) == ["assertion:deleted", "milestone:validation:updated"]


def test_refused_writes_write_no_events(api, member, tree):
    client = api(member)
    since = last_event_id()
    client.post(f"/api/features/{tree.f1.pk}/link/", {"assertion": "VAL-001"}, format="json")  # already linked
    client.post(f"/api/features/{tree.f2.pk}/link/", {"assertion": "VAL-M01"}, format="json")  # milestone-scoped
    client.post(
        "/api/assertions/",
        {"milestone": tree.milestone.pk, "key": "VAL-001", "title": "d", "statement": "s"},
        format="json",
    )  # duplicate
    client.patch(f"/api/assertions/{tree.a_linked.pk}/", {"check": {"run": "id"}}, format="json")  # staff only
    assert new_event_types(since) == []


# --------------------------------------------------------------------------- tree


def test_tree_content(api, member, tree):
    tree.a_linked.status = "passed"
    tree.a_linked.save()
    MissionFeature.objects.filter(pk=tree.f1.pk).update(loop_state=LoopState.PASSED)
    response = api(member).get(f"/api/missions/{tree.mission.pk}/tree/")
    assert response.status_code == 200
    body = response.json()
    assert (body["id"], body["key"], body["retry_budget"]) == (tree.mission.pk, "alpha", 3)
    assert [m["key"] for m in body["milestones"]] == ["m1", "m2"]
    m1, m2 = body["milestones"]
    assert m1["assertions"] == ["VAL-001", "VAL-002", "VAL-M01"]
    assert m1["rollup"] == {
        "state": "needs_coverage",
        "total": 3,
        "passed": 1,
        "failed": 0,
        "blocked": 0,
        "pending": 2,
        "unlinked": 1,
    }
    assert m2["rollup"]["state"] == "not_started" and m2["slices"] == [] and m2["assertions"] == []
    [s1] = m1["slices"]
    assert s1["key"] == "s1"
    features = {f["key"]: f for f in s1["features"]}
    assert [f["key"] for f in s1["features"]] == ["f1", "f2"]
    assert features["f1"]["loop_state"] == "passed" and features["f1"]["assertions"] == ["VAL-001"]
    assert features["f2"]["loop_state"] == "idle" and features["f2"]["assertions"] == []
    assert features["f1"]["budget_left"] == 3


def _bulk_mission(
    owner, member, key: str, n_features: int, per_slice: int = 10, slices_per_milestone: int = 5
) -> Mission:
    mission = Mission.objects.create(key=key, title=key, owner=owner)
    mission.members.set([member])
    n_slices = -(-n_features // per_slice)
    n_milestones = -(-n_slices // slices_per_milestone)
    milestones = Milestone.objects.bulk_create(
        Milestone(mission=mission, key=f"m{i}", title=f"M{i}", order=i) for i in range(n_milestones)
    )
    slices = Slice.objects.bulk_create(
        Slice(mission=mission, milestone=milestones[i // slices_per_milestone], key=f"s{i}", title=f"S{i}", order=i)
        for i in range(n_slices)
    )
    features = MissionFeature.objects.bulk_create(
        MissionFeature(mission=mission, slice=slices[i // per_slice], key=f"f{i}", title=f"F{i}", order=i)
        for i in range(n_features)
    )
    assertions = ContractAssertion.objects.bulk_create(
        ContractAssertion(
            mission=mission,
            milestone=slices[i // per_slice].milestone,
            key=f"VAL-{i}",
            title="a",
            statement="s",
            order=i,
        )
        for i in range(n_features)
    )
    FeatureAssertion.objects.bulk_create(
        FeatureAssertion(feature=f, assertion=a) for f, a in zip(features, assertions, strict=True)
    )
    return mission


@pytest.mark.parametrize("role", ["member", "staff"])
def test_tree_query_count_does_not_grow_with_the_mission(
    request, api, owner, member, django_assert_max_num_queries, role
):
    small = _bulk_mission(owner, member, "small", 3)
    large = _bulk_mission(owner, member, "large", 300)
    client = api(request.getfixturevalue(role))
    used = {}
    for mission, n in ((small, 3), (large, 300)):
        with django_assert_max_num_queries(12):
            with CaptureQueriesContext(connection) as queries:
                response = client.get(f"/api/missions/{mission.pk}/tree/")
        assert response.status_code == 200
        features = [f for m in response.json()["milestones"] for s in m["slices"] for f in s["features"]]
        assert len(features) == n and all(len(f["assertions"]) == 1 for f in features)
        used[n] = len(queries)
    assert 0 < used[3] == used[300], used


def test_tree_rollups_agree_with_the_validation_endpoint(api, staff, tree):
    client = api(staff)
    tree.a_unlinked.status = "failed"
    tree.a_unlinked.save()
    body = client.get(f"/api/missions/{tree.mission.pk}/tree/").json()
    for milestone in body["milestones"]:
        rollup = client.get(f"/api/milestones/{milestone['id']}/validation/").json()
        assert {k: v for k, v in rollup.items() if k != "milestone"} == milestone["rollup"]
    assert body["milestones"][0]["rollup"]["state"] == "failed"


# --------------------------------------------------------------------------- OpenAPI


def test_schema_and_docs(api, member, client):
    response = api(member).get("/api/schema/")
    assert response.status_code == 200
    text = response.content.decode()
    for path in (
        "/api/missions/{id}/tree/",
        "/api/features/{id}/link/",
        "/api/milestones/{id}/validation/",
        "/api/missions/import/",
        "/api/missions/{id}/export/",
    ):
        assert path in text, path
    assert api(None).get("/api/schema/").status_code == 401
    client.force_login(member)
    response = client.get("/api/docs/")
    assert response.status_code == 200 and b"swagger" in response.content.lower()


def test_schema_validates_without_warnings(tmp_path):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    schema = yaml.safe_load(target.read_text())
    assert schema["openapi"].startswith("3.") and "/api/missions/" in schema["paths"]


# --------------------------------------------------------------------------- mission files


MISSION_FILE = """\
mission: {key: shop, title: Shop checkout, validator: composite, executor: manual, retry_budget: 2}
milestones:
  - key: m1
    title: Cart
    assertions:
      - {key: VAL-CART-001, title: Empty cart total is zero, statement: "cart_total([]) == 0"}
      - {key: VAL-CART-002, title: Totals add up, statement: "cart_total([1, 2]) == 3"}
    slices:
      - key: s1
        title: Totals
        features:
          - {key: cart-total, title: Cart total, description: "sum", assertions: [VAL-CART-001, VAL-CART-002]}
"""


def test_import_and_export_through_the_api(api, member, stranger, counts):
    client = api(member)
    response = client.post("/api/missions/import/", MISSION_FILE, content_type="application/yaml")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["key"] == "shop" and body["owner"] == member.pk and body["changed"] is True
    mission = Mission.objects.get(key="shop")
    assert mission.retry_budget == 2
    assert list(
        FeatureAssertion.objects.filter(feature__mission=mission)
        .order_by("assertion__key")
        .values_list("assertion__key", flat=True)
    ) == ["VAL-CART-001", "VAL-CART-002"]
    assert Milestone.objects.get(mission=mission, key="m1").validation_state == RollupState.READY

    response = client.get(f"/api/missions/{mission.pk}/export/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/yaml")
    exported = yaml.safe_load(response.content.decode())
    assert exported["mission"]["key"] == "shop"
    feature = exported["milestones"][0]["slices"][0]["features"][0]
    assert feature["key"] == "cart-total" and sorted(feature["assertions"]) == ["VAL-CART-001", "VAL-CART-002"]

    # re-importing what was exported changes nothing
    rows = counts()
    response = client.post("/api/missions/import/", response.content.decode(), content_type="application/yaml")
    assert response.status_code == 200, response.content
    assert response.json()["changed"] is False
    assert counts() == rows

    # someone else's mission: not exportable, and its key cannot be taken over by an import
    assert api(stranger).get(f"/api/missions/{mission.pk}/export/").status_code == 404
    response = api(stranger).post("/api/missions/import/", MISSION_FILE, content_type="application/yaml")
    assert response.status_code == 403 and response.json()["code"] == "mission_key_taken"
    assert counts() == rows


def test_import_refuses_bad_files_and_writes_nothing(api, member, counts):
    client = api(member)
    rows = counts()
    response = client.post("/api/missions/import/", "", content_type="application/yaml")
    assert response.status_code == 400 and response.json()["code"] == "invalid_mission_file"
    response = client.post("/api/missions/import/", "mission: [unclosed", content_type="application/yaml")
    assert response.status_code == 400 and response.json()["code"] == "invalid_mission_file"
    broken = MISSION_FILE.replace("[VAL-CART-001, VAL-CART-002]", "[VAL-CART-404]")
    response = client.post("/api/missions/import/", broken, content_type="application/yaml")
    assert response.status_code == 400 and response.json()["code"] == "invalid_mission_file"
    assert response.json()["fields"]
    # a check executes code on the host: staff only, through files as through the API
    with_check = MISSION_FILE.replace(
        'statement: "cart_total([]) == 0"}', 'statement: "cart_total([]) == 0", check: {run: "pytest -q"}}'
    )
    response = client.post("/api/missions/import/", with_check, content_type="application/yaml")
    assert response.status_code == 403 and response.json()["code"] == "staff_only"
    assert counts() == rows
    assert api(None).post("/api/missions/import/", MISSION_FILE, content_type="application/yaml").status_code == 401
    assert counts() == rows


def test_import_as_json(api, staff):
    document = yaml.safe_load(MISSION_FILE)
    response = api(staff).post("/api/missions/import/", document, format="json")
    assert response.status_code == 201, response.content
    assert Mission.objects.get(key="shop").owner == staff


# --------------------------------------------------------------------------- misc


def test_updated_at_moves_on_api_writes(api, member, tree):
    MissionFeature.objects.filter(pk=tree.f1.pk).update(updated_at=timezone.now() - timezone.timedelta(days=1))
    old = MissionFeature.objects.get(pk=tree.f1.pk).updated_at
    response = api(member).patch(f"/api/features/{tree.f1.pk}/", {"description": "more"}, format="json")
    assert response.status_code == 200
    assert MissionFeature.objects.get(pk=tree.f1.pk).updated_at > old


def test_the_completions_task_read_sees_what_visible_missions_sees(owner, member, staff, stranger, tree, other_tree):
    """The completion's prepared read of its task and `visible_missions` are one rule."""
    from django.contrib.auth.models import AnonymousUser

    from missions.selectors import visible_missions, visible_task_with_mission

    for user in (owner, member, staff, stranger, AnonymousUser(), None):
        for task in (tree.task, other_tree.task):
            expected = visible_missions(user=user).filter(pk=task.mission_id).exists()
            got = visible_task_with_mission(user=user, pk=str(task.pk))
            assert (got is not None) == expected, (user, task.mission.key)
            if got is not None:
                assert got.pk == task.pk and got.mission.key == task.mission.key
