"""The security matrix: every API endpoint and method, the SSE streams,
the WebSocket, every admin page, the dashboard and the CLI, for an anonymous user, a
member of the mission, a signed-in non-member (the stranger) and staff.

The API rows are keyed by the OpenAPI schema's (method, path): an endpoint added to the
API without a row here fails `test_every_api_operation_has_a_row`, and every URL pattern
under /api/ must be an operation of the schema or one of the few documented extras.

What each role gets (docs/DASHBOARD.md and docs/API.md):
- anonymous: 401 with `code: not_authenticated` everywhere under /api/; SSE
  `stream-error` forbidden; WebSocket closed with 4403; admin and dashboard redirect to
  a sign-in page. Nothing is written.
- stranger (signed in, not a member): someone else's object answers 404 (never 403: its
  existence does not leak), lists leave it out, a create under someone else's parent
  is a 400 on that field; nothing of the member's mission is written.
- member: the answer of the row (a real success, or the domain's refusal: never 401,
  403 or 404 except the owner-only and staff-only rules).
- staff: everything, including checks and executor commands (code the host executes).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from django.contrib import admin
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from missions.models import ContractAssertion, Milestone, Mission, MissionEvent, MissionFeature, Task
from tests.reliability.conftest import ROLES, mission_rows, token_of, user_of

pytestmark = pytest.mark.django_db


# =========================================================================== API rows


@dataclass(frozen=True)
class Row:
    """One API operation on the world `w`.

    kind: list | read | create | write | action (what a stranger should get follows from it)
    member / staff: the status the member / staff get on a fresh world
    hidden_parent: a create whose parent is in the member's mission (stranger: 400)
    own: a create a stranger may make on their own (a new mission, a review without mission)
    stranger: an explicit answer for the stranger when the kind's rule does not apply
    """

    url: Callable[[Any], str]
    kind: str
    member: int
    staff: int | None = None
    body: Callable[[Any], Any] | None = None
    obj: Callable[[Any], Any] | None = None
    content_type: str = "json"
    stranger: int | None = None
    member_code: str | None = None
    staff_code: str | None = None


def _mission_put(w):
    return {"key": w.mission.key, "title": "Put title"}


def _import_yaml(w) -> str:
    return yaml.safe_dump(
        {
            "mission": {
                "key": w.mission.key,
                "title": "Imported title",
                "status": "active",
                "repository": str(w.repo.path),
            },
            "milestones": [{"key": "m1", "title": "Milestone one"}],
        }
    )


def _review_body(w):
    from tests.review.support import request_body

    return request_body(mission=w.mission.pk)


API: dict[tuple[str, str], Row] = {
    # missions
    ("GET", "/api/missions/"): Row(lambda w: "/api/missions/", "list", 200, obj=lambda w: w.mission),
    ("POST", "/api/missions/"): Row(
        lambda w: "/api/missions/", "create", 201, stranger=201, body=lambda w: {"key": "brand-new", "title": "New"}
    ),
    ("GET", "/api/missions/{id}/"): Row(
        lambda w: f"/api/missions/{w.mission.pk}/", "read", 200, obj=lambda w: w.mission
    ),
    ("PUT", "/api/missions/{id}/"): Row(lambda w: f"/api/missions/{w.mission.pk}/", "write", 200, body=_mission_put),
    ("PATCH", "/api/missions/{id}/"): Row(
        lambda w: f"/api/missions/{w.mission.pk}/", "write", 200, body=lambda w: {"title": "Renamed"}
    ),
    ("DELETE", "/api/missions/{id}/"): Row(
        lambda w: f"/api/missions/{w.mission.pk}/", "write", 403, staff=204, member_code="owner_only"
    ),
    ("POST", "/api/missions/{id}/activate/"): Row(
        lambda w: f"/api/missions/{w.mission.pk}/activate/", "action", 409, member_code="illegal_mission_state"
    ),
    ("POST", "/api/missions/{id}/pause/"): Row(lambda w: f"/api/missions/{w.mission.pk}/pause/", "action", 200),
    ("POST", "/api/missions/{id}/resume/"): Row(
        lambda w: f"/api/missions/{w.mission.pk}/resume/", "action", 409, member_code="illegal_mission_state"
    ),
    ("POST", "/api/missions/{id}/autopilot/"): Row(
        lambda w: f"/api/missions/{w.mission.pk}/autopilot/", "action", 200, body=lambda w: {"enabled": False}
    ),
    ("GET", "/api/missions/{id}/events/"): Row(lambda w: f"/api/missions/{w.mission.pk}/events/", "read", 200),
    ("GET", "/api/missions/{id}/export/"): Row(lambda w: f"/api/missions/{w.mission.pk}/export/", "read", 200),
    ("GET", "/api/missions/{id}/tree/"): Row(
        lambda w: f"/api/missions/{w.mission.pk}/tree/", "read", 200, obj=lambda w: w.mission
    ),
    # an import of the member's mission file: the stranger is refused (the key is taken)
    ("POST", "/api/missions/import/"): Row(
        lambda w: "/api/missions/import/",
        "action",
        200,
        stranger=403,
        body=_import_yaml,
        content_type="application/yaml",
    ),
    # milestones
    ("GET", "/api/milestones/"): Row(lambda w: "/api/milestones/", "list", 200, obj=lambda w: w.m1),
    ("POST", "/api/milestones/"): Row(
        lambda w: "/api/milestones/",
        "create",
        201,
        body=lambda w: {"mission": w.mission.pk, "key": "m-new", "title": "New"},
    ),
    ("GET", "/api/milestones/{id}/"): Row(lambda w: f"/api/milestones/{w.m1.pk}/", "read", 200, obj=lambda w: w.m1),
    ("PUT", "/api/milestones/{id}/"): Row(
        lambda w: f"/api/milestones/{w.m1.pk}/",
        "write",
        200,
        body=lambda w: {"mission": w.mission.pk, "key": "m1", "title": "Put"},
    ),
    ("PATCH", "/api/milestones/{id}/"): Row(
        lambda w: f"/api/milestones/{w.m1.pk}/", "write", 200, body=lambda w: {"title": "Renamed"}
    ),
    ("DELETE", "/api/milestones/{id}/"): Row(lambda w: f"/api/milestones/{w.m2.pk}/", "write", 204),
    ("GET", "/api/milestones/{id}/validation/"): Row(lambda w: f"/api/milestones/{w.m1.pk}/validation/", "read", 200),
    # m2 has nothing to judge: it completes
    ("POST", "/api/milestones/{id}/validate/"): Row(lambda w: f"/api/milestones/{w.m2.pk}/validate/", "action", 200),
    # slices
    ("GET", "/api/slices/"): Row(lambda w: "/api/slices/", "list", 200, obj=lambda w: w.s1),
    ("POST", "/api/slices/"): Row(
        lambda w: "/api/slices/", "create", 201, body=lambda w: {"milestone": w.m1.pk, "key": "s-new", "title": "New"}
    ),
    ("GET", "/api/slices/{id}/"): Row(lambda w: f"/api/slices/{w.s1.pk}/", "read", 200, obj=lambda w: w.s1),
    ("PUT", "/api/slices/{id}/"): Row(
        lambda w: f"/api/slices/{w.s1.pk}/",
        "write",
        200,
        body=lambda w: {"milestone": w.m1.pk, "key": "s1", "title": "Put"},
    ),
    ("PATCH", "/api/slices/{id}/"): Row(
        lambda w: f"/api/slices/{w.s1.pk}/", "write", 200, body=lambda w: {"title": "Renamed"}
    ),
    ("DELETE", "/api/slices/{id}/"): Row(lambda w: f"/api/slices/{w.s2.pk}/", "write", 204),
    # features
    ("GET", "/api/features/"): Row(lambda w: "/api/features/", "list", 200, obj=lambda w: w.f1),
    ("POST", "/api/features/"): Row(
        lambda w: "/api/features/", "create", 201, body=lambda w: {"slice": w.s1.pk, "key": "f-new", "title": "New"}
    ),
    ("GET", "/api/features/{id}/"): Row(lambda w: f"/api/features/{w.f1.pk}/", "read", 200, obj=lambda w: w.f1),
    ("PUT", "/api/features/{id}/"): Row(
        lambda w: f"/api/features/{w.f2.pk}/",
        "write",
        200,
        body=lambda w: {"slice": w.s1.pk, "key": "f2", "title": "Put"},
    ),
    ("PATCH", "/api/features/{id}/"): Row(
        lambda w: f"/api/features/{w.f2.pk}/", "write", 200, body=lambda w: {"title": "Renamed"}
    ),
    ("DELETE", "/api/features/{id}/"): Row(lambda w: f"/api/features/{w.f3.pk}/", "write", 204),
    ("POST", "/api/features/{id}/validate/"): Row(lambda w: f"/api/features/{w.f1.pk}/validate/", "action", 202),
    ("POST", "/api/features/{id}/repair/"): Row(
        lambda w: f"/api/features/{w.f1.pk}/repair/",
        "action",
        200,
        body=lambda w: {"mode": "clear", "reason": "matrix"},
    ),
    ("POST", "/api/features/{id}/create_fix/"): Row(lambda w: f"/api/features/{w.f1.pk}/create_fix/", "action", 201),
    ("GET", "/api/features/{id}/loop/"): Row(lambda w: f"/api/features/{w.f1.pk}/loop/", "read", 200),
    ("POST", "/api/features/{id}/link/"): Row(
        lambda w: f"/api/features/{w.f2.pk}/link/", "action", 201, body=lambda w: {"assertion": "VAL-2"}
    ),
    ("POST", "/api/features/{id}/unlink/"): Row(
        lambda w: f"/api/features/{w.f1.pk}/unlink/", "action", 200, body=lambda w: {"assertion": "VAL-1"}
    ),
    ("POST", "/api/features/{id}/review/"): Row(lambda w: f"/api/features/{w.f1.pk}/review/", "action", 202),
    # contract assertions
    ("GET", "/api/assertions/"): Row(lambda w: "/api/assertions/", "list", 200, obj=lambda w: w.a1),
    ("POST", "/api/assertions/"): Row(
        lambda w: "/api/assertions/",
        "create",
        201,
        body=lambda w: {"milestone": w.m1.pk, "key": "VAL-NEW", "title": "New", "statement": "it works"},
    ),
    ("GET", "/api/assertions/{id}/"): Row(lambda w: f"/api/assertions/{w.a1.pk}/", "read", 200, obj=lambda w: w.a1),
    ("PUT", "/api/assertions/{id}/"): Row(
        lambda w: f"/api/assertions/{w.a2.pk}/",
        "write",
        200,
        body=lambda w: {"milestone": w.m1.pk, "key": "VAL-2", "title": "Put", "statement": "f2 works"},
    ),
    ("PATCH", "/api/assertions/{id}/"): Row(
        lambda w: f"/api/assertions/{w.a2.pk}/", "write", 200, body=lambda w: {"title": "Renamed"}
    ),
    ("DELETE", "/api/assertions/{id}/"): Row(lambda w: f"/api/assertions/{w.a2.pk}/", "write", 204),
    # tasks
    ("GET", "/api/tasks/"): Row(lambda w: "/api/tasks/", "list", 200, obj=lambda w: w.t1),
    ("POST", "/api/tasks/"): Row(lambda w: "/api/tasks/", "create", 201, body=lambda w: {"feature": w.f3.pk}),
    ("GET", "/api/tasks/{id}/"): Row(lambda w: f"/api/tasks/{w.t1.pk}/", "read", 200, obj=lambda w: w.t1),
    ("PUT", "/api/tasks/{id}/"): Row(
        lambda w: f"/api/tasks/{w.t2.pk}/",
        "write",
        200,
        body=lambda w: {"feature": w.f2.pk, "mission": w.mission.pk, "title": "Put"},
    ),
    ("PATCH", "/api/tasks/{id}/"): Row(
        lambda w: f"/api/tasks/{w.t2.pk}/", "write", 200, body=lambda w: {"title": "Renamed"}
    ),
    ("DELETE", "/api/tasks/{id}/"): Row(lambda w: f"/api/tasks/{w.t2.pk}/", "write", 204),
    ("POST", "/api/tasks/{id}/start/"): Row(lambda w: f"/api/tasks/{w.t2.pk}/start/", "action", 200),
    ("POST", "/api/tasks/{id}/complete/"): Row(
        lambda w: f"/api/tasks/{w.t2.pk}/complete/",
        "action",
        200,
        body=lambda w: {"revision": w.revision, "summary": "done"},
    ),
    ("POST", "/api/tasks/{id}/fail/"): Row(
        lambda w: f"/api/tasks/{w.t2.pk}/fail/", "action", 200, body=lambda w: {"reason": "could not"}
    ),
    # the audit log
    ("GET", "/api/events/"): Row(lambda w: "/api/events/", "list", 200, obj=lambda w: w.event),
    ("GET", "/api/events/{id}/"): Row(lambda w: f"/api/events/{w.event.pk}/", "read", 200, obj=lambda w: w.event),
    # validation runs, lineage
    ("GET", "/api/validation-runs/"): Row(lambda w: "/api/validation-runs/", "list", 200, obj=lambda w: w.r1),
    ("GET", "/api/validation-runs/{id}/"): Row(
        lambda w: f"/api/validation-runs/{w.r1.pk}/", "read", 200, obj=lambda w: w.r1
    ),
    ("GET", "/api/validation-runs/{id}/journal/"): Row(
        lambda w: f"/api/validation-runs/{w.r1.pk}/journal/", "read", 200
    ),
    ("POST", "/api/validation-runs/{id}/replay/"): Row(
        lambda w: f"/api/validation-runs/{w.r1.pk}/replay/", "action", 200
    ),
    ("GET", "/api/lineage/"): Row(lambda w: "/api/lineage/", "list", 200, obj=lambda w: w.lineage),
    ("GET", "/api/lineage/{id}/"): Row(lambda w: f"/api/lineage/{w.lineage.pk}/", "read", 200, obj=lambda w: w.lineage),
    # advisory reviews
    ("GET", "/api/reviews/"): Row(lambda w: "/api/reviews/", "list", 200, obj=lambda w: w.review),
    ("POST", "/api/reviews/"): Row(lambda w: "/api/reviews/", "create", 202, body=_review_body),
    ("GET", "/api/reviews/{id}/"): Row(lambda w: f"/api/reviews/{w.review.pk}/", "read", 200, obj=lambda w: w.review),
    ("GET", "/api/reviews/{id}/result/"): Row(lambda w: f"/api/reviews/{w.review.pk}/result/", "read", 200),
    ("GET", "/api/reviews/{id}/artifact/"): Row(
        lambda w: f"/api/reviews/{w.review.pk}/artifact/?name=request.json", "read", 200
    ),
    ("POST", "/api/reviews/{id}/cancel/"): Row(lambda w: f"/api/reviews/{w.review.pk}/cancel/", "action", 200),
}

# URL patterns under /api/ that are not operations of the schema, with their answers:
# the API root, the schema itself and its Swagger UI.
API_EXTRAS: dict[str, dict[str, int]] = {
    "/api/": {"anonymous": 401, "member": 200, "stranger": 200, "staff": 200},
    "/api/schema/": {"anonymous": 401, "member": 200, "stranger": 200, "staff": 200},
    "/api/docs/": {"anonymous": 401, "member": 200, "stranger": 200, "staff": 200},
}


@functools.lru_cache(maxsize=1)
def schema_operations() -> frozenset[tuple[str, str]]:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    return frozenset(
        (method.upper(), path)
        for path, ops in schema["paths"].items()
        for method in ops
        if method in ("get", "post", "put", "patch", "delete")
    )


def test_every_api_operation_has_a_row():
    operations = schema_operations()
    missing = sorted(operations - set(API))
    assert not missing, f"API operations without a row in the security matrix: {missing}"
    stale = sorted(set(API) - operations)
    assert not stale, f"rows for operations the API no longer has: {stale}"


def _walk(patterns, prefix: str = ""):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from _walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern)


def _as_schema_path(route: str) -> str | None:
    if "format>" in route:
        return None  # DRF's format-suffix twin (`.json`) of a route that is covered
    route = route.replace("^", "").replace("$", "")
    route = re.sub(r"\(\?P<pk>[^)]*\)", "{id}", route)
    route = re.sub(r"<(?:int:)?pk>", "{id}", route)
    return "/" + route


def test_every_api_url_pattern_is_an_operation_or_a_documented_extra():
    paths = {path for _m, path in schema_operations()} | set(API_EXTRAS)
    routes = [r for r in _walk(get_resolver().url_patterns) if r.startswith("api/") or r.startswith("^api/")]
    assert routes
    unknown = sorted({p for p in map(_as_schema_path, routes) if p is not None and p not in paths})
    assert not unknown, f"URL patterns under /api/ that the matrix does not cover: {unknown}"


API_IDS = [f"{m} {p}" for m, p in API]


def _send(client, method: str, url: str, row: Row, w):
    body = row.body(w) if row.body else None
    if row.content_type == "json":
        return getattr(client, method.lower())(url, body, format="json")
    return getattr(client, method.lower())(url, body, content_type=row.content_type)


def _ids(response) -> set[int]:
    data = response.json()
    rows = data["results"] if isinstance(data, dict) and "results" in data else data
    return {r["id"] for r in rows}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("key", list(API), ids=API_IDS)
def test_api_matrix(key, role, users, world):
    # Every row is an operation of the API today: one that is gone fails here, never skips.
    assert key in schema_operations(), f"{key} is no longer an operation of the API"
    method, _path = key
    row = API[key]
    w = world
    user = user_of(users, role)
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token_of(user)}")
    before = mission_rows(w.mission.pk)
    response = _send(client, method, row.url(w), row, w)
    body = response.json() if response.get("Content-Type", "").startswith("application/json") else None
    status = response.status_code

    if role == "anonymous":
        assert status == 401, (status, body)
        assert body["code"] == "not_authenticated"
        assert mission_rows(w.mission.pk) == before
        return
    if role == "stranger":
        if row.stranger is not None:
            assert status == row.stranger, (status, body)
        elif row.kind == "list":
            assert status == 200, body
            assert row.obj(w).pk not in _ids(response)
        elif row.kind == "create":
            assert status == 400, (status, body)  # the parent is a missing id for them
            assert body["code"] in ("validation_error", "unknown_reference", "invalid"), body
        else:
            assert status == 404, (status, body)
            assert body["code"] == "not_found"
        assert mission_rows(w.mission.pk) == before, "a stranger changed the member's mission"
        return
    expected = row.member if role == "member" else (row.staff or row.member)
    assert status == expected, (status, body if body is not None else response.content[:500])
    code = row.member_code if role == "member" else row.staff_code
    if code:
        assert body["code"] == code
    if row.kind == "list":
        ids = _ids(response)
        assert row.obj(w).pk in ids
    if row.kind == "read" and row.obj is not None:
        assert body["id"] == row.obj(w).pk
    if method == "GET":
        assert mission_rows(w.mission.pk) == before, "a read wrote"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("url", list(API_EXTRAS))
def test_api_extras(url, role, users):
    user = user_of(users, role)
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token_of(user)}")
    response = client.get(url)
    assert response.status_code == API_EXTRAS[url][role]


def test_a_staff_list_shows_every_mission_and_a_member_list_only_theirs(users, world):
    staff, member = APIClient(), APIClient()
    staff.force_authenticate(users.staff)
    member.force_authenticate(users.member)
    assert {w.pk for w in (world.mission, world.theirs)} <= _ids(staff.get("/api/missions/"))
    assert _ids(member.get("/api/missions/")) == {world.mission.pk}


# ======================================================= checks and executor commands: staff only

CODE_WRITES = [
    (
        "assertion check (create)",
        "post",
        lambda w: "/api/assertions/",
        lambda w: {"milestone": w.m1.pk, "key": "VAL-RUN", "title": "t", "statement": "s", "check": {"run": "id"}},
    ),
    (
        "assertion check (update)",
        "patch",
        lambda w: f"/api/assertions/{w.a2.pk}/",
        lambda w: {"check": {"run": "touch /tmp/pwned"}},
    ),
    (
        "assertion check (change)",
        "patch",
        lambda w: f"/api/assertions/{w.a1.pk}/",
        lambda w: {"check": {"file": "hello.py", "exists": True}},
    ),
    (
        "executor command (update)",
        "patch",
        lambda w: f"/api/missions/{w.mission.pk}/",
        lambda w: {"executor": "command", "executor_command": "sh -c 'curl evil'"},
    ),
    (
        "executor command (new mission)",
        "post",
        lambda w: "/api/missions/",
        lambda w: {"key": "exec-new", "title": "t", "executor": "command", "executor_command": "id"},
    ),
]


@pytest.mark.parametrize("role", ["member", "staff"])
@pytest.mark.parametrize("case", CODE_WRITES, ids=[c[0] for c in CODE_WRITES])
def test_checks_and_executor_commands_over_the_api_are_staff_only(case, role, users, world):
    _name, method, url, body = case
    client = APIClient()
    client.force_authenticate(getattr(users, role))
    before = mission_rows(world.mission.pk)
    missions_before = Mission.objects.count()
    response = getattr(client, method)(url(world), body(world), format="json")
    if role == "member":
        assert response.status_code == 403, response.json()
        assert response.json()["code"] == "staff_only"
        assert mission_rows(world.mission.pk) == before and Mission.objects.count() == missions_before
    else:
        assert response.status_code in (200, 201), response.json()


def _file_with(w, **mission_fields) -> str:
    return yaml.safe_dump(
        {
            "mission": {"key": w.mission.key, "title": "Alpha", "repository": str(w.repo.path), **mission_fields},
            "milestones": [
                {
                    "key": "m1",
                    "title": "Milestone one",
                    "assertions": [
                        {
                            "key": "VAL-1",
                            "title": "hello exists",
                            "statement": "hello() exists",
                            "check": {"run": "sh -c 'echo pwned'"},
                        }
                    ],
                }
            ],
        }
    )


@pytest.mark.parametrize("role", ["member", "staff"])
def test_a_mission_file_import_sets_checks_and_executor_commands_only_for_staff(role, users, world):
    client = APIClient()
    client.force_authenticate(getattr(users, role))
    before = mission_rows(world.mission.pk)
    for text in (_file_with(world), _file_with(world, executor="command", executor_command="id")):
        response = client.post("/api/missions/import/", text, content_type="application/yaml")
        if role == "member":
            assert response.status_code == 403, response.json()
            assert response.json()["code"] == "staff_only"
            assert mission_rows(world.mission.pk) == before
        else:
            assert response.status_code == 200, response.json()
    if role == "staff":
        assert ContractAssertion.objects.get(pk=world.a1.pk).check_spec == {"run": "sh -c 'echo pwned'"}
        assert Mission.objects.get(pk=world.mission.pk).executor_command == "id"


def test_the_cli_import_is_trusted_like_staff(world, tmp_path):
    path = tmp_path / "alpha.yaml"
    path.write_text(_file_with(world, executor="command", executor_command="id"))
    call_command("import_mission", str(path), stdout=open(tmp_path / "out", "w"))
    assert ContractAssertion.objects.get(pk=world.a1.pk).check_spec == {"run": "sh -c 'echo pwned'"}


@pytest.mark.parametrize("role", ["anonymous", "member", "stranger", "staff"])
def test_checks_and_executor_commands_in_the_admin_are_staff_only(role, users, world):
    client = Client()
    user = user_of(users, role)
    if user is not None:
        client.force_login(user)
    url = reverse("admin:missions_contractassertion_change", args=[world.a1.pk])
    get = client.get(url)
    if role != "staff":
        assert get.status_code == 302 and "/admin/login/" in get["Location"]
        post = client.post(url, {"check_spec": '{"run": "id"}'})
        assert post.status_code == 302 and "/admin/login/" in post["Location"]
        assert ContractAssertion.objects.get(pk=world.a1.pk).check_spec != {"run": "id"}
        mission_url = reverse("admin:missions_mission_change", args=[world.mission.pk])
        assert client.post(mission_url, {"executor_command": "id"}).status_code == 302
        assert Mission.objects.get(pk=world.mission.pk).executor_command == ""
        return
    assert get.status_code == 200
    assert b"check_spec" in get.content


# ================================================================= dashboard pages


def dashboard_urls(w) -> list[str]:
    """Every page of the dashboard (from its URL patterns) with the world's objects, and
    every part (fragment) a page has."""
    from validation.views import pages, runs

    urls = [
        "/",
        "/_/missions/",
        f"/missions/{w.mission.pk}/",
        f"/features/{w.f1.pk}/",
        f"/runs/{w.r1.pk}/",
        f"/reviews/{w.review.pk}/",
        f"/reviews/{w.review.pk}/_/review/",
    ]
    urls += [f"/missions/{w.mission.pk}/_/{part}/" for part in pages.MISSION_PARTS if part != "milestone"]
    urls += [f"/missions/{w.mission.pk}/_/milestone/{w.m1.pk}/"]
    urls += [f"/features/{w.f1.pk}/_/{part}/" for part in pages.FEATURE_PARTS]
    urls += [f"/runs/{w.r1.pk}/_/{part}/" for part in runs.RUN_PARTS]
    return urls


def test_the_dashboard_table_covers_every_dashboard_pattern(world):
    import validation.urls

    names = {p.name for p in validation.urls.urlpatterns} - {"login", "logout", "static-file"}
    from django.urls import resolve

    covered = {resolve(u.split("?")[0]).url_name for u in dashboard_urls(world)}
    assert names <= covered, f"dashboard pages without a row: {sorted(names - covered)}"


PUBLIC_DASHBOARD = {"/", "/_/missions/"}  # lists: every signed-in user sees their own rows


@pytest.mark.parametrize("role", ROLES)
def test_dashboard_matrix(role, users, world):
    client = Client()
    user = user_of(users, role)
    if user is not None:
        client.force_login(user)
    before = mission_rows(world.mission.pk)
    for url in dashboard_urls(world):
        response = client.get(url)
        if role == "anonymous":
            assert response.status_code == 302 and "/login/" in response["Location"], url
        elif role == "stranger" and url not in PUBLIC_DASHBOARD:
            assert response.status_code == 404, url
        else:
            assert response.status_code == 200, (url, response.status_code)
            if role == "stranger":
                assert world.mission.title.encode() not in response.content, url
    assert mission_rows(world.mission.pk) == before


# ====================================================================== admin pages


def admin_urls(w) -> list[tuple[str, str]]:
    """(url, kind) for the admin index, every app index and, for every registered model,
    its changelist, add page and the change, history and delete pages of one object."""
    urls = [(reverse("admin:index"), "index")]
    apps = set()
    for model in admin.site._registry:
        opts = model._meta
        apps.add(opts.app_label)
        base = f"admin:{opts.app_label}_{opts.model_name}"
        urls.append((reverse(f"{base}_changelist"), "changelist"))
        urls.append((reverse(f"{base}_add"), "add"))
        obj = model._default_manager.order_by("pk").first()
        if obj is not None:
            for page in ("change", "history", "delete"):
                urls.append((reverse(f"{base}_{page}", args=[obj.pk]), page))
    urls += [(reverse("admin:app_list", args=[label]), "app") for label in sorted(apps)]
    return urls


@pytest.mark.parametrize("role", ROLES)
def test_admin_matrix(role, users, world):
    from tests.review.support import request_body  # noqa: F401 — the world has a review with artifacts

    client = Client()
    user = user_of(users, role)
    if user is not None:
        client.force_login(user)
    before = mission_rows(world.mission.pk)
    urls = admin_urls(world)
    assert len(urls) > 40
    for url, kind in urls:
        response = client.get(url)
        if role != "staff":
            # members and strangers are not staff: the admin is not theirs at all
            assert response.status_code == 302 and "/admin/login/" in response["Location"], (url, response.status_code)
            continue
        # staff (here a superuser) reach every page; view-only records refuse add/delete with 403
        assert response.status_code in (200, 403), (url, response.status_code)
        if response.status_code == 403:
            assert kind in ("add", "delete", "change"), url
    assert mission_rows(world.mission.pk) == before


# =================================================================== SSE and WebSocket


def _asgi_get(path: str, token: str | None, *, wait: float = 15.0) -> tuple[int, bytes]:
    """GET `path` from the ASGI application and read until the first body chunk that has
    data (a stream never ends: disconnect after it)."""
    from fusion_site.asgi import application

    headers = [(b"host", b"testserver"), (b"accept", b"text/event-stream")]
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 12345),
        "server": ("testserver", 80),
    }

    async def run():
        inbox: asyncio.Queue = asyncio.Queue()
        await inbox.put({"type": "http.request", "body": b"", "more_body": False})
        done = asyncio.Event()
        status, body = 0, b""

        async def receive():
            if not inbox.empty():
                return await inbox.get()
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            nonlocal status, body
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body += message.get("body", b"")
                if body.strip() or not message.get("more_body", False):
                    done.set()

        task = asyncio.ensure_future(application(scope, receive, send))
        try:
            await asyncio.wait_for(done.wait(), timeout=wait)
        except TimeoutError:
            pass
        done.set()
        try:
            await asyncio.wait_for(task, timeout=5)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
        return status, body

    return asyncio.run(run())


def _sse_forbidden(body: bytes) -> bool:
    return b"stream-error" in body and b"forbidden" in body


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", ROLES)
def test_sse_matrix(role, users, git_repo):
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"}, "hello")
    from tests.reliability.conftest import build_world

    w = build_world(users, git_repo)
    user = user_of(users, role)
    token = token_of(user) if user else None
    status, body = _asgi_get(f"/events/missions/{w.mission.pk}/", token)
    if role in ("anonymous", "stranger"):
        assert _sse_forbidden(body), body[:300]
    else:
        assert status == 200 and not _sse_forbidden(body), body[:300]
        assert b"event: stream-open" in body, body[:300]
    status, body = _asgi_get("/events/missions/", token)
    if role == "anonymous":
        assert _sse_forbidden(body), body[:300]
    else:
        assert status == 200 and not _sse_forbidden(body) and b"event: stream-open" in body, body[:300]
    # the stranger's own list feed carries their own mission only, never the member's
    if role == "stranger":
        from missions.streams import user_channels

        assert user_channels(users.stranger) == {f"mission-{w.theirs.pk}"}
    # someone else's mission never appears in the SSE stream of the list for a member
    if role == "member":
        from missions.streams import user_channels

        assert user_channels(users.member) == {f"mission-{w.mission.pk}"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.usefixtures("own_channel_layer", "synthetic_events")  # an event of its own making
def test_websocket_matrix(role, users, git_repo):
    from channels.testing import WebsocketCommunicator

    from fusion_site.asgi import application
    from missions.outbox import publish_on_commit
    from tests.reliability.conftest import build_world

    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"}, "hello")
    w = build_world(users, git_repo)
    user = user_of(users, role)
    query = f"?token={token_of(user)}" if user else ""

    async def session():
        from channels.db import database_sync_to_async

        communicator = WebsocketCommunicator(application, f"/ws/missions/{w.mission.pk}/{query}")
        connected, _sub = await communicator.connect(timeout=10)
        if role in ("anonymous", "stranger"):
            message = await communicator.receive_output(timeout=5)
            return connected, message
        await database_sync_to_async(publish_on_commit)(
            w.mission.pk, "mission:updated", {"mission": w.mission.pk, "change": "ws-matrix"}
        )
        message = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return connected, message

    connected, message = asyncio.run(session())
    if role in ("anonymous", "stranger"):
        assert message["type"] == "websocket.close" and message["code"] == 4403, message
    else:
        assert connected
        assert message["event"] == "mission:updated" and message["data"]["change"] == "ws-matrix", message


# ============================================================================ CLI


@dataclass
class Cli:
    name: str
    args: Callable[[Any], list[str]]
    effect: Callable[[Any], bool] = field(default=lambda w: True)


CLI = [
    Cli(
        "mission pause",
        lambda w: ["mission", "pause", w.mission.key],
        lambda w: Mission.objects.get(pk=w.mission.pk).status == "paused",
    ),
    Cli(
        "mission autopilot-on",
        lambda w: ["mission", "autopilot-on", w.mission.key],
        lambda w: Mission.objects.get(pk=w.mission.pk).autopilot,
    ),
    Cli("mission status", lambda w: ["mission", "status", w.mission.key]),
    Cli(
        "task start",
        lambda w: ["task", "start", str(w.t2.pk)],
        lambda w: Task.objects.get(pk=w.t2.pk).status == "in_progress",
    ),
    Cli(
        "task fail",
        lambda w: ["task", "fail", str(w.t2.pk), "--reason", "cli"],
        lambda w: Task.objects.get(pk=w.t2.pk).status == "failed",
    ),
    Cli(
        "validate_milestone",
        lambda w: ["validate_milestone", f"{w.mission.key}/m2"],
        lambda w: Milestone.objects.get(pk=w.m2.pk).status == "complete",
    ),
    Cli(
        "repair_feature clear",
        lambda w: ["repair_feature", str(w.f1.pk), "--mode", "clear", "--reason", "cli"],
        lambda w: MissionFeature.objects.get(pk=w.f1.pk).loop_state == "implementing",
    ),
]


def _actor_of_last_event(w) -> int | None:
    return MissionEvent.objects.filter(mission=w.mission).order_by("-seq").values_list("actor_id", flat=True).first()


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("cli", CLI, ids=[c.name for c in CLI])
def test_cli_matrix(cli, role, users, world, tmp_path):
    """The CLI runs with the server's own credentials (whoever has the shell has the
    database): it is trusted like staff for every role, and `--user` only names the actor
    in the audit log. An unknown user is exit code 2 and changes nothing."""
    w = world
    user = user_of(users, role)
    args = cli.args(w) + (["--user", user.username] if user is not None else [])
    events_before = MissionEvent.objects.filter(mission=w.mission).count()
    with open(tmp_path / "out", "w") as out:
        call_command(*args, stdout=out, stderr=out)
    assert cli.effect(w)
    if MissionEvent.objects.filter(mission=w.mission).count() > events_before:
        assert _actor_of_last_event(w) == (user.pk if user else None)


@pytest.mark.parametrize("cli", CLI, ids=[c.name for c in CLI])
def test_cli_with_an_unknown_user_changes_nothing(cli, world, tmp_path):
    before = mission_rows(world.mission.pk)
    with pytest.raises(CommandError) as info, open(tmp_path / "out", "w") as out:
        call_command(*cli.args(world), "--user", "nobody-like-this", stdout=out, stderr=out)
    assert info.value.returncode == 2
    assert mission_rows(world.mission.pk) == before
