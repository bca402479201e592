"""The security matrix of the API: every endpoint and method for an anonymous user, a
member of the mission, a signed-in non-member (the stranger) and staff.

The rows are keyed by the OpenAPI schema's (method, path): an endpoint added to the API
without a row here fails `test_every_api_operation_has_a_row`, and every URL pattern
under /api/ must be an operation of the schema or one of the few documented extras.

What each role gets (docs/DASHBOARD.md and docs/API.md; the other matrices,
test_security_code.py, test_security_pages.py and test_security_cli.py, hold to the same):
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

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from tests.reliability.conftest import ROLES, mission_rows, token_of, user_of

pytestmark = pytest.mark.django_db


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
    # the mission's forge: its secret is the owner's and staff's (the member is not the owner)
    ("GET", "/api/missions/{id}/forge/"): Row(lambda w: f"/api/missions/{w.mission.pk}/forge/", "read", 200),
    ("POST", "/api/missions/{id}/forge/rotate-secret/"): Row(
        lambda w: f"/api/missions/{w.mission.pk}/forge/rotate-secret/",
        "action",
        403,
        staff=200,
        member_code="owner_only",
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
    # a plan of the member's mission file: nothing is written; the stranger does not see the mission
    ("POST", "/api/missions/plan/"): Row(
        lambda w: "/api/missions/plan/",
        "action",
        200,
        stranger=404,
        body=_import_yaml,
        content_type="application/yaml",
    ),
    # an apply by a hash no plan answered: refused, nothing changes
    ("POST", "/api/missions/apply/"): Row(
        lambda w: "/api/missions/apply/?plan_hash=0:0",
        "action",
        409,
        stranger=404,
        body=_import_yaml,
        content_type="application/yaml",
        member_code="plan_mismatch",
        staff_code="plan_mismatch",
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
