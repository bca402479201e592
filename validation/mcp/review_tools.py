"""`fusion_validate` and `bg_result`: the seed's tools over the review pipeline.

`fusion_validate` hands its arguments to `review_create`, the service behind
`POST /api/reviews/`: the same normalization, the same refusals (the legacy `{prompt}`
first, then every problem at once), the same durable preflight. The review's mission (its
repository, pinned revision) is the connection's: the API's `mission`, `feature` and
`revision` keys are not part of the seed's closed contract, and are refused here as the
unknown fields they are in it.
"""

from __future__ import annotations

import json
from typing import Any

from missions.errors import Invalid, NotFound
from validation.mcp import schemas
from validation.mcp.context import db, load_user
from validation.mcp.resources import readable
from validation.mcp.tooling import Call, Tool
from validation.review import artifacts
from validation.review.create import review_create
from validation.review.request import REFERENCE_KEYS, ReviewRequestInvalid, normalize_request
from validation.review.state import TERMINAL
from validation.selectors import visible_reviews


def _closed_request(arguments: dict[str, Any]) -> dict[str, Any]:
    """The body without the API's reference keys, refused with every other problem."""
    extra = sorted(k for k in REFERENCE_KEYS if k in arguments)
    body = {k: v for k, v in arguments.items() if k not in extra}
    errors: list[dict[str, str]] = [{"path": k, "message": "unknown field"} for k in extra]
    try:
        normalize_request(body)  # the legacy shape is refused here, alone and first
    except ReviewRequestInvalid as exc:
        if not extra:
            raise
        errors += exc.extra.get("errors", [{"path": "", "message": exc.detail}])
    if not extra:
        return body
    # The contract's order: unknown keys of an object first, by name.
    unknown = sorted(
        (e for e in errors if e["message"] == "unknown field" and "." not in e["path"]), key=lambda e: e["path"]
    )
    rest = [e for e in errors if e not in unknown]
    ordered = unknown + rest
    fields: dict[str, list[str]] = {}
    for e in ordered:
        fields.setdefault(e["path"], []).append(e["message"])
    listed = "; ".join(f"{e['path']}: {e['message']}" for e in ordered)
    raise ReviewRequestInvalid(f"the review request is invalid: {listed}", fields=fields, extra={"errors": ordered})


def _create(principal, arguments: dict[str, Any]) -> dict[str, Any]:
    user = load_user(principal)
    body = _closed_request(arguments)
    if principal.mission_id is None:
        raise Invalid(
            "fusion_validate reviews the connection's mission: connect to /mcp/missions/<key>/ "
            "(or run manage.py mcp --mission KEY)",
            code="mission_required",
            fields={"mission": ["the connection has no mission"]},
        )
    preflight = review_create(body={**body, "mission": principal.mission_id}, user=user, source="mcp")
    receipt = artifacts.receipt(preflight.review)
    return {
        "taskId": str(receipt["id"]),
        "id": receipt["id"],
        "state": receipt["state"],
        "mission": receipt["mission"],
        "revision": receipt["revision"],
        "request_sha256": receipt["request_sha256"],
        "resource": f"fusion://reviews/{receipt['id']}",
        "replayed": not preflight.created,
        "detail": "The review runs in the background; do not change the reviewed scope meanwhile. Wait for the "
        "notification (notifications/resources/updated for the resource, and a log message), then call "
        "bg_result once with this taskId; do not poll.",
    }


async def fusion_validate(call: Call) -> dict[str, Any]:
    receipt = await db(_create)(call.principal, call.arguments)
    await call.live.watch_review(
        call.ctx,
        review_id=receipt["id"],
        mission_id=receipt["mission"],
        user_id=call.principal.user_id,
        check=lambda: db(readable)(call.principal, [receipt["resource"]]),
    )
    return receipt


def _review_id(raw: Any) -> int | None:
    text = str(raw).strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) < 16 else None


def _result(principal, task_id: str) -> dict[str, Any]:
    user = load_user(principal)
    pk = _review_id(task_id)
    review = visible_reviews(user=user).filter(pk=pk).first() if pk is not None else None
    if review is None:
        raise NotFound(f"no review {task_id!r}", code="not_found")
    answer = artifacts.review_result(review)  # verifies every stored hash before answering
    out: dict[str, Any] = {
        "taskId": str(review.pk),
        "state": review.state,
        "ready": bool(answer.get("ready")),
        "report": None,
        "accounting": None,
        "failure": None,
    }
    if answer.get("ready"):
        report, accounting = answer["report"], answer["accounting"]
        if report.get("content") is None:
            # Past the API's inline limit the API links to the artifact; a tool answer has
            # no link to follow, so the whole verified text comes inline: never truncated.
            report = {**report, "content": artifacts.verified_artifact(review, artifacts.REPORT).content}
        if accounting.get("content") is None:
            row = artifacts.verified_artifact(review, artifacts.ACCOUNTING)
            accounting = {**accounting, "content": json.loads(row.content)}
        out.update(report=report, accounting=accounting, detail="completed: the report verified")
    elif review.state in TERMINAL:
        out["failure"] = {k: answer.get(k) for k in ("reason", "failure_code", "failure_stage")}
        out["detail"] = f"{review.state}: {answer.get('reason') or 'no report'}"
    else:
        out["detail"] = f"still running: {review.state}"
    return out


async def bg_result(call: Call) -> dict[str, Any]:
    return await db(_result)(call.principal, call.arguments["taskId"])


TOOLS = [
    Tool(
        name="fusion_validate",
        title="Fusion Validate",
        description=schemas.FUSION_VALIDATE_DESCRIPTION,
        input_schema=schemas.FUSION_VALIDATE_INPUT,
        output_schema=schemas.RECEIPT,
        handler=fusion_validate,
        read_only=False,
        check_arguments=False,
    ),
    Tool(
        name="bg_result",
        title="Background result",
        description="Retrieve the result of a background review started by fusion_validate, once, after its "
        "notification. Never blocks: a running review answers 'still running: <state>'. A completed review's "
        "report is verified (byte length and sha256 of every stored artifact) and returned whole, never truncated; "
        "a failed or cancelled one returns its reason and no report.",
        input_schema=schemas.closed({"taskId": {"type": "string", "minLength": 1}}, ("taskId",)),
        output_schema=schemas.BG_RESULT,
        handler=bg_result,
    ),
]
