"""The API shows itself: its root, /api/, links every resource, and its OpenAPI schema
(/api/schema/, shown at /api/docs/) describes every operation for the API's users, with
request bodies that require what the API requires."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer

pytestmark = pytest.mark.django_db

# Words of the code's own vocabulary: a text that uses one talks about the code, not the API.
FORBIDDEN_WORDS = ("floor", "viewset", "queryset", "mixin", "selector", "service")
FORBIDDEN = re.compile(r"\b(" + "|".join(FORBIDDEN_WORDS) + r")s?\b", re.IGNORECASE)
# A module's path: `missions.api.views`, `validation/api/views.py`.
MODULE_PATH = re.compile(r"\b(?:missions|validation|fusion_site)(?:\.\w+)+|\b[\w/]+\.py\b")
# A backticked name with an underscore must be one of the API's own (a field, a parameter,
# a value, a path segment) or an error code, written after its status ("409 `task_open`").
BACKTICKED = re.compile(r"`([A-Za-z_][\w.]*)`")
ERROR_CODE = re.compile(r"\b[1-5]\d\d `(\w+)`")

# The body fields each operation refuses a request without: the schema must say so.
REQUIRED_BODY: dict[tuple[str, str], set[str]] = {
    ("post", "/api/missions/"): {"key", "title"},
    ("post", "/api/milestones/"): {"mission", "key", "title"},
    ("post", "/api/slices/"): {"milestone", "key", "title"},
    ("post", "/api/features/"): {"slice", "key", "title"},
    ("post", "/api/assertions/"): {"milestone", "key", "title", "statement"},
    ("post", "/api/tasks/{id}/complete/"): {"revision"},
    ("post", "/api/missions/{id}/autopilot/"): {"enabled"},
    ("post", "/api/features/{id}/link/"): {"assertion"},
    ("post", "/api/features/{id}/unlink/"): {"assertion"},
    ("post", "/api/features/{id}/repair/"): {"mode"},
    ("post", "/api/missions/import/"): {"mission"},
    ("post", "/api/reviews/"): {
        "objective",
        "changeSummary",
        "background",
        "scope",
        "acceptanceCriteria",
        "verification",
    },
}
# The bodies that need one field of a set, each alone enough.
REQUIRED_ONE_OF: dict[tuple[str, str], tuple[str, ...]] = {
    ("post", "/api/tasks/"): ("feature", "mission"),
}
# Bodies whose refusal names its fields in another shape than `fields` (the mission file's).
REFUSED_WITHOUT_FIELDS = {("post", "/api/missions/import/")}
METHODS = ("get", "post", "put", "patch", "delete")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    generated = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(generated))


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema()["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield method, path, operation


def name_of(method: str, path: str, operation: dict[str, Any]) -> str:
    return f"{method.upper()} {path} ({operation['operationId']})"


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return schema()["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else node


def body_schemas(operation: dict[str, Any]) -> list[dict[str, Any]]:
    return [resolve(media["schema"]) for media in operation["requestBody"]["content"].values()]


def texts() -> Iterator[tuple[str, str]]:
    """(where, text) for every summary and description of the schema."""

    def walk(node: Any, where: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("summary", "description") and isinstance(value, str):
                    yield f"{where} {key}", value
                else:
                    yield from walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from walk(value, f"{where}/{i}")

    for method, path, operation in operations():
        yield from walk(operation, name_of(method, path, operation))
    yield from walk(schema()["components"], "components")
    yield from walk(schema()["info"], "info")


def api_names() -> set[str]:
    """Every name the API itself uses: properties, parameters, enum values, path segments."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}))
            names.update(str(v) for v in node.get("enum", []) if v is not None)
            if node.get("in") in ("query", "path", "header") and "name" in node:
                names.add(node["name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema())
    for path in schema()["paths"]:
        names.update(path.strip("/").split("/"))
    return names


def internals_named(text: str, known: set[str]) -> list[str]:
    found = [f"the word {m.group(1)!r}" for m in FORBIDDEN.finditer(text)]
    found += [f"the module path {m.group(0)!r}" for m in MODULE_PATH.finditer(text)]
    codes = set(ERROR_CODE.findall(text))
    found += [
        f"the name `{name}` (not a field, parameter, value or error code of the API)"
        for name in BACKTICKED.findall(text)
        if "_" in name and name not in known and name not in codes
    ]
    return found


# --------------------------------------------------------------------------- the root


def api_list_routes() -> set[str]:
    """The list route of every resource registered under /api/, by URL name."""

    def walk(patterns, prefix: str) -> Iterator[str]:
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern) and prefix.startswith("api/") and (p.name or "").endswith("-list"):
                yield p.name

    return set(walk(get_resolver().url_patterns, ""))


def test_the_root_links_every_resource_and_each_link_answers(api, member):
    client = api(member)
    response = client.get("/api/")
    assert response.status_code == 200
    links = response.json()
    assert {"missions", "tasks", "validation-runs", "reviews", "lineage"} <= set(links), links
    for name, url in links.items():
        answer = client.get(url)
        assert answer.status_code == 200, f"/api/ links {name} to {url}, which answers {answer.status_code}"
    listed = {urlsplit(url).path for url in links.values()}
    routes = api_list_routes()
    assert routes
    unlisted = sorted(name for name in routes if reverse(name) not in listed)
    assert not unlisted, f"list routes under /api/ that the root does not link: {unlisted}"


def test_every_resource_of_the_root_is_in_the_schema(api, member):
    links = api(member).get("/api/").json()
    missing = sorted(name for name, url in links.items() if urlsplit(url).path not in schema()["paths"])
    assert not missing, f"resources /api/ links but the schema does not describe: {missing}"


# --------------------------------------------------------------------------- descriptions


def test_every_operation_has_a_summary_and_a_description():
    undescribed = [
        f"{name_of(method, path, operation)}: no {part}"
        for method, path, operation in operations()
        for part in ("summary", "description")
        if not operation.get(part, "").strip()
    ]
    assert not undescribed, (
        "operations /api/docs/ shows without a text for the API's users (give them with"
        " extend_schema(summary=..., description=...); docstrings are not published):\n" + "\n".join(undescribed)
    )


def test_no_text_of_the_schema_names_the_code():
    known = api_names()
    named = [f"{where}: {what}" for where, text in texts() for what in internals_named(text, known)]
    assert not named, "texts of the schema that name the code's internals:\n" + "\n".join(named)


def test_the_checks_on_texts_catch_internals():
    known = api_names()
    assert internals_named("409 `task_open`: the feature has an open task; see `loop_state`.", known) == []
    caught = internals_named(
        "Limits every query to the user's missions through `mission_path`; the floor's viewsets"
        " (missions.api.views, validation/api/views.py) call a service.",
        known,
    )
    assert caught == [
        "the word 'floor'",
        "the word 'viewset'",
        "the word 'service'",
        "the module path 'missions.api.views'",
        "the module path 'validation/api/views.py'",
        "the name `mission_path` (not a field, parameter, value or error code of the API)",
    ]


# --------------------------------------------------------------------------- request bodies


def test_request_bodies_require_what_the_api_requires():
    ops = {(method, path): operation for method, path, operation in operations()}
    wrong = []
    for key, fields in REQUIRED_BODY.items():
        assert key in ops, f"{key} is no longer an operation of the API"
        operation = ops[key]
        if not operation.get("requestBody", {}).get("required"):
            wrong.append(f"{name_of(*key, operation)}: its body is not marked required")
        for body in body_schemas(operation):
            if set(body.get("required", [])) != fields:
                wrong.append(
                    f"{name_of(*key, operation)}: requires {sorted(body.get('required', []))}, not {sorted(fields)}"
                )
    for key, names in REQUIRED_ONE_OF.items():
        operation = ops[key]
        if not operation.get("requestBody", {}).get("required"):
            wrong.append(f"{name_of(*key, operation)}: its body is not marked required")
        for body in body_schemas(operation):
            if body.get("anyOf") != [{"required": [name]} for name in names]:
                wrong.append(f"{name_of(*key, operation)}: does not require one of {list(names)}")
    assert not wrong, "request bodies whose schema does not say what the API requires:\n" + "\n".join(wrong)


def test_no_field_with_a_default_is_required():
    both = [
        f"{name}.{field}"
        for name, component in schema()["components"]["schemas"].items()
        if name.endswith("Request")
        for field in component.get("required", [])
        if "default" in component.get("properties", {}).get(field, {})
    ]
    assert not both, f"request fields marked required although they have a default: {both}"


def test_the_api_refuses_a_body_without_its_required_fields(api, owner, make_tree):
    tree = make_tree(owner, "bodies")
    ids = {"missions": tree.mission.pk, "tasks": tree.task.pk, "features": tree.f1.pk}
    client = api(owner)
    for (method, path), fields in {**REQUIRED_BODY, **REQUIRED_ONE_OF}.items():
        url = path.replace("{id}", str(ids[path.split("/")[2]])) if "{id}" in path else path
        response = getattr(client, method)(url, {}, format="json")
        assert response.status_code == 400, f"{method.upper()} {path} with an empty body: {response.status_code}"
        if (method, path) in REFUSED_WITHOUT_FIELDS:
            continue
        named = set(response.json()["fields"])
        # A task without feature and mission: the refusal names `mission` ("give a feature or a mission").
        expected = {"mission"} if (method, path) in REQUIRED_ONE_OF else set(fields)
        assert named == expected, f"{method.upper()} {path} with an empty body names {named}, the schema {fields}"
