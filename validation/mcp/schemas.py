"""The tools' JSON schemas, written out.

`fusion_validate`'s input is the seed's closed contract (shared/seeds, the
`fusion_validate` document) key for key: pydantic would write `anyOf [..., null]` for the
optional fields and add the API's reference fields, neither of which is that contract.
Its values are still checked by the one declaration of the review request
(`validation/review/request.py`); this schema only tells the client what to send.
"""

from __future__ import annotations

from typing import Any

_TEXT_NOTE = "Non-empty string. Runtime normalization trims and rejects whitespace-only text."
_ARRAY_NOTE = "Array of non-empty strings. Runtime normalization trims every item."


def _text() -> dict[str, Any]:
    return {"description": _TEXT_NOTE, "minLength": 1, "type": "string"}


def _texts(*, described: bool, min_items: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"items": _text(), "type": "array"}
    if described:
        schema["description"] = _ARRAY_NOTE
    if min_items is not None:
        schema["minItems"] = min_items
    return schema


FUSION_VALIDATE_DESCRIPTION = (
    "Start an advisory, read-only Fusion validation review as a tracked background task and return "
    "immediately after durable preflight. Retrieve the verified result with bg_result after notification. "
    "It is not a build/test/lint substitute and never modifies files."
)

FUSION_VALIDATE_INPUT: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {
        "acceptanceCriteria": _texts(described=False, min_items=1),
        "background": _texts(described=True),
        "changeSummary": _text(),
        "exclusions": _texts(described=True),
        "knownLimitations": _texts(described=True),
        "objective": _text(),
        "scope": _texts(described=False, min_items=1),
        "verification": {
            "additionalProperties": False,
            "properties": {
                "evidence": {
                    "items": {
                        "additionalProperties": False,
                        "properties": {"check": _text(), "outcome": _text()},
                        "required": ["check", "outcome"],
                        "type": "object",
                    },
                    "type": "array",
                },
                "reason": _text(),
                "status": {
                    "description": "Google-compatible enum. Use 'provided' only with evidence; "
                    "use 'not_run' only with reason and no evidence.",
                    "enum": ["provided", "not_run"],
                    "type": "string",
                },
            },
            "required": ["status"],
            "type": "object",
        },
    },
    "required": ["acceptanceCriteria", "background", "changeSummary", "objective", "scope", "verification"],
    "type": "object",
}

# ------------------------------------------------------------------ small building blocks

ID = {"type": "integer", "minimum": 1}
REF = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "minLength": 1}]}
MISSION_ARG = {**REF, "description": "Mission id or key; defaults to the connection's mission."}
FEATURE_ARG = {**REF, "description": "Feature id, or its key within the mission."}
MILESTONE_ARG = {**REF, "description": "Milestone id, or its key within the mission."}
OBJECT = {"type": "object"}
NULLABLE_INT = {"type": ["integer", "null"]}
NULLABLE_STR = {"type": ["string", "null"]}


def closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def shape(properties: dict[str, Any], required: tuple[str, ...] | None = None) -> dict[str, Any]:
    """An output object: these keys are always there; nested rows may grow new fields."""
    return {"type": "object", "properties": properties, "required": list(required or properties)}


RECEIPT = shape(
    {
        "taskId": {"type": "string", "description": "The review's id: pass it to bg_result."},
        "id": ID,
        "state": {"type": "string"},
        "mission": NULLABLE_INT,
        "revision": {"type": "string", "description": "The commit the reviewers read (pinned at preflight)."},
        "request_sha256": {"type": "string"},
        "resource": {"type": "string", "description": "fusion://reviews/{id}: updated when the review ends."},
        "replayed": {"type": "boolean"},
        "detail": {"type": "string"},
    }
)

BG_RESULT = shape(
    {
        "taskId": {"type": "string"},
        "state": {"type": "string"},
        "ready": {"type": "boolean"},
        "detail": {"type": "string"},
        "report": {
            "type": ["object", "null"],
            "description": "The whole verified report: content, byte_length, sha256.",
        },
        "accounting": {"type": ["object", "null"]},
        "failure": {"type": ["object", "null"]},
    }
)

FEATURE_ROW = {"type": "object", "required": ["id", "key", "loop_state"]}
MISSION_STATUS = shape(
    {
        "mission": shape({"id": ID, "key": {"type": "string"}, "status": {"type": "string"}}, None),
        "progress": shape(
            {
                "features_total": {"type": "integer"},
                "features_passed": {"type": "integer"},
                "percent": {"type": "integer"},
            }
        ),
        "milestones": {"type": "array", "items": OBJECT},
        "blocked": {"type": "array", "items": FEATURE_ROW},
        "open_tasks": {"type": "array", "items": OBJECT},
    }
)

NEXT_TASK = shape(
    {
        "mission": ID,
        "kind": {"enum": ["task", "nothing"], "description": "task: work on it; nothing: see reason."},
        "reason": {"type": "string"},
        "task": {"type": ["object", "null"]},
        "feature": {"type": ["object", "null"]},
        "prompt": NULLABLE_STR,
        "validation_cause": NULLABLE_STR,
    }
)

TASK_COMPLETE = shape(
    {
        "task": OBJECT,
        "feature": {"type": ["object", "null"]},
        "outcome": {"type": "string", "description": "What happens next: judged_next, judging_skipped, ..."},
        "detail": {"type": "string"},
    }
)

ADMISSION = shape(
    {
        "outcome": {
            "type": "string",
            "description": "started, reused, blocked, ... (validation/services/verdicts/admit.py)",
        },
        "detail": {"type": "string"},
        "run": {"type": ["object", "null"]},
    }
)

MILESTONE_VALIDATION = shape(
    {
        "outcome": {"enum": ["started", "already_running", "complete"]},
        "detail": {"type": "string"},
        "run": {"type": ["object", "null"], "description": "The run that started, is running, or passed."},
        "milestone": {"type": "object", "required": ["id", "key", "status", "validation_state"]},
        "mission_status": {"type": "string"},
    }
)

FEATURE_LOOP = shape(
    {
        "feature": ID,
        "key": {"type": "string"},
        "loop_state": {"type": "string"},
        "status": {"type": "string"},
        "budget_left": {"type": "integer"},
        "retry_budget": {"type": "integer"},
        "last_verdict": {
            "type": "array",
            "items": OBJECT,
            "description": "Per assertion: verdict, expected, actual, evidence.",
        },
        "lineage": {"type": "array", "items": OBJECT},
        "runs": {"type": "array", "items": OBJECT},
    },
    ("feature", "key", "loop_state", "status", "budget_left", "retry_budget", "last_verdict", "lineage", "runs"),
)

VERDICT = shape(
    {
        "feature": ID,
        "finished": {"type": "boolean", "description": "false: the timeout came first; the run goes on."},
        "loop_state": {"type": "string"},
        "run": {"type": ["object", "null"]},
        "verdict": {"type": "array", "items": OBJECT},
        "waited_seconds": {"type": "number"},
    }
)

MISSION_DOCUMENT = {
    "anyOf": [{"type": "string", "minLength": 1}, {"type": "object"}],
    "description": "A mission file: YAML or JSON text, or the object (docs/mission-file.schema.json).",
}
_ITEMS = {"type": "array", "items": OBJECT}
PLAN = shape(
    {
        "mission_key": {"type": "string"},
        "state_version": {"type": "string"},
        "plan_hash": {**NULLABLE_STR, "description": "Pass it to mission_apply with the same file; null: refused."},
        "applicable": {"type": "boolean"},
        "created": _ITEMS,
        "changed": _ITEMS,
        "unchanged": _ITEMS,
        "refused": _ITEMS,
        "left_alone": _ITEMS,
        "reopened": _ITEMS,
        "code": NULLABLE_STR,
        "errors": {"type": "array", "items": {"type": "string"}},
    }
)
APPLIED = shape({"mission": OBJECT, "created": {"type": "boolean"}, "changed": {"type": "boolean"}, "plan": PLAN})
ROW = {"type": "object", "required": ["id", "key"]}
