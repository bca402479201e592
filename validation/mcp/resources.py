"""The resources: `fusion://missions/{id}` (the tree, as `GET /api/missions/{id}/tree/`),
`fusion://runs/{id}` (a run's verdict and a summary of its journal) and
`fusion://reviews/{id}` (the review record, as `GET /api/reviews/{id}/`). Each is read with
the visibility of the API: a stranger's resource is "not found"."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import mcp_types as types

from missions.api.tree import mission_tree
from missions.errors import NotFound
from validation.api.reviews import ReviewSerializer
from validation.api.serializers import RunSerializer
from validation.mcp.context import Principal, find_mission, load_user
from validation.selectors import visible_reviews, visible_runs

URI = re.compile(r"\Afusion://(missions|runs|reviews)/(\d{1,15})\Z")

TEMPLATES = [
    types.ResourceTemplate(
        uri_template="fusion://missions/{id}",
        name="mission",
        title="Mission tree",
        description="Milestones -> slices -> features with loop states, rollups and budget left (JSON).",
        mime_type="application/json",
    ),
    types.ResourceTemplate(
        uri_template="fusion://runs/{id}",
        name="run",
        title="Validator run",
        description="A run's status, verdict per assertion, failures, and its journal summary (JSON).",
        mime_type="application/json",
    ),
    types.ResourceTemplate(
        uri_template="fusion://reviews/{id}",
        name="review",
        title="Advisory review",
        description="A review's state, pinned revision, request hash and artifact hashes (JSON); the report is "
        "read with bg_result.",
        mime_type="application/json",
    ),
]


def parse(uri: str) -> tuple[str, int]:
    match = URI.match(uri)
    if match is None:
        raise NotFound(f"no resource {uri!r}", code="not_found")
    return match.group(1), int(match.group(2))


def _run(user, pk: int):
    run = visible_runs(user=user).prefetch_related("failures").filter(pk=pk).first()
    if run is None:
        raise NotFound(f"no run {pk}", code="not_found")
    return run


def _review(user, pk: int):
    review = visible_reviews(user=user).prefetch_related("artifacts").filter(pk=pk).first()
    if review is None:
        raise NotFound(f"no review {pk}", code="not_found")
    return review


def mission_of(*, user, uri: str) -> int | None:
    """The mission whose events touch the resource (None: a review outside any mission);
    raises "not found" for a resource the user may not read."""
    kind, pk = parse(uri)
    if kind == "missions":
        return find_mission(user=user, ref=pk).pk
    if kind == "runs":
        return _run(user, pk).mission_id
    return _review(user, pk).mission_id


def readable(principal: Principal, uris: list[str]) -> dict[str, int]:
    """Of the resources the principal may read, the mission of each that has one (a review
    outside any mission hears of nothing), in one database trip; "not found" for the first
    it may not read."""
    user = load_user(principal)
    missions: dict[str, int] = {}
    for uri in uris:
        try:
            mission_id = mission_of(user=user, uri=uri)
        except NotFound as exc:
            raise NotFound(f"not found: {uri}", code="not_found") from exc
        if mission_id is not None:
            missions[uri] = mission_id
    return missions


def _journal_summary(run) -> dict[str, Any]:
    rows = list(run.journal.order_by("seq").values_list("seq", "kind", "sha256"))
    return {
        "entries": len(rows),
        "kinds": dict(Counter(kind for _seq, kind, _sha in rows)),
        "last_seq": rows[-1][0] if rows else None,
        "head_sha256": rows[-1][2] if rows else None,
    }


def read(*, user, uri: str) -> dict[str, Any]:
    kind, pk = parse(uri)
    if kind == "missions":
        return mission_tree(mission=find_mission(user=user, ref=pk))
    if kind == "runs":
        run = _run(user, pk)
        return {**RunSerializer(run).data, "journal": _journal_summary(run)}
    return dict(ReviewSerializer(_review(user, pk)).data)


def contents(uri: str, body: dict[str, Any]) -> types.ReadResourceResult:
    text = json.dumps(body, default=str, sort_keys=True)
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
    )
