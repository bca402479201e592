"""The API's OpenAPI description (drf-spectacular: /api/schema/, browsable at /api/docs/).

Every operation is described for the API's users with `extend_schema`: a summary, what it
does and answers, its notable error codes (each app's `api/descriptions.py`). Docstrings
are notes for the code's readers and are never published (`AutoSchema.get_description`).
tests/missions/test_openapi.py fails on an operation without a description, or one that
names the code's internals.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular import openapi
from drf_spectacular.plumbing import is_patched_serializer
from drf_spectacular.utils import extend_schema, extend_schema_view

# The answer to an id that is not there or not yours.
NOT_VISIBLE = "404 `not_found`: no such {one}, or it is in a mission you cannot see."
NOT_VISIBLE_MISSION = "404 `not_found`: no such mission, or one you neither own nor are a member of."
VISIBLE_MISSIONS = "Only the missions you own or are a member of count (staff: every mission)."
DUPLICATE_KEY = "400 `duplicate_key` (its mission has {article} {one} with this key)"


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's, with two more truths in request bodies: a serializer's
    `required_one_of` (at least one of these fields: an `anyOf` of required lists) and a
    body given as a JSON schema (a mission file), required when that schema requires a key."""

    def get_description(self) -> str:  # type: ignore[override]  # drf-spectacular's signature, not DRF's
        # drf-spectacular would publish the view's or its bases' docstrings, which are
        # written for the code's readers; an operation's description is `extend_schema`'s.
        return ""

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        alternatives = getattr(serializer, "required_one_of", ())
        if direction == "request" and alternatives and not is_patched_serializer(serializer, direction):
            schema["anyOf"] = [{"required": [name]} for name in alternatives]
        return schema

    def _get_request_for_media_type(self, serializer, direction="request"):
        schema, required = super()._get_request_for_media_type(serializer, direction)
        if isinstance(serializer, dict):
            required = bool(serializer.get("required"))
        elif getattr(serializer, "required_one_of", ()) and self.method != "PATCH":
            required = True
        return schema, required


def described(summary: str, description: str, **kwargs: Any):
    """`extend_schema` with the two texts /api/docs/ shows of an operation."""
    return extend_schema(summary=summary, description=description, **kwargs)


def _view_docs(generated: dict[str, Any], more: dict[str, Any]):
    # An operation in both keeps both: `more` adds its parameters, responses, ...
    merged: dict[str, Any] = {**generated, **more}
    for name in generated.keys() & more.keys():
        merged[name] = [generated[name], more[name]]
    return extend_schema_view(**merged)


def _list_and_read(*, one: str, many: str, listed: str, read: str, missing: str) -> dict[str, Any]:
    article = "an" if one[0] in "aeiou" else "a"
    return {
        "list": described(f"List {many}", f"{listed} 50 per page (`page`), narrowed by the query parameters below."),
        "retrieve": described(f"Read {article} {one}", f"One {one} by id. {read} {missing}".replace("  ", " ")),
    }


def read_docs(*, one: str, many: str, listed: str, read: str = "", missing: str = "", **more: Any):
    """`extend_schema_view` of a read-only resource: `listed` says what its list holds,
    `read` what one holds, `missing` when it answers 404; `more`: `extend_schema` of its
    other operations (or more of these), by method name."""
    missing = missing or NOT_VISIBLE.format(one=one)
    return _view_docs(_list_and_read(one=one, many=many, listed=listed, read=read, missing=missing), more)


def crud_docs(
    *,
    one: str,
    many: str,
    listed: str,
    creating: str,
    creating_errors: str = "",
    changing: str = "",
    changing_errors: str = "",
    deleting: str,
    deleting_errors: str = "",
    missing: str = "",
    key_taken: str = DUPLICATE_KEY,
    **more: Any,
):
    """`extend_schema_view` of a resource of the plan (list, create, read, replace, change,
    delete): the sentences all of them share, with what each adds. `key_taken`: the answer
    to a key already used ("": it has no key)."""
    article = "an" if one[0] in "aeiou" else "a"
    missing = missing or NOT_VISIBLE.format(one=one)
    refused = ", ".join(
        text
        for text in (
            "400 `validation_error` (a required field is missing or a value is invalid, each named under `fields`)",
            key_taken.format(article=article, one=one),
        )
        if text
    )
    changed = f"{changing} Errors: {refused}{changing_errors}; {missing}".strip()
    generated = {
        **_list_and_read(one=one, many=many, listed=f"{listed} {VISIBLE_MISSIONS}", read="", missing=missing),
        "create": described(
            f"Create {article} {one}", f"{creating} Answers 201 with the {one}. Errors: {refused}{creating_errors}."
        ),
        "update": described(
            f"Replace {article} {one}", f"Sets every writable field: the required ones must be sent. {changed}"
        ),
        "partial_update": described(
            f"Change {article} {one}", f"Changes the fields sent; the others stay as they are. {changed}"
        ),
        "destroy": described(f"Delete {article} {one}", f"{deleting} Answers 204. {deleting_errors}{missing}"),
    }
    return _view_docs(generated, more)
