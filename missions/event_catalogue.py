"""The event catalogue: every event type the product publishes, what it reports, and the
shape of its payload (docs/DASHBOARD.md, "Event types").

`missions.outbox.publish_on_commit` checks every event against it (`check_event`): an
unknown type, or a payload without a required key, with a key it does not declare or
with a value of another type, raises where `FUSION_STRICT` is on (DEBUG and the test
suite) and is logged elsewhere (the event still goes out: its clients read what it
carries). The dashboard, the streams and API clients read these payloads: a shape here
describes what the code sends, it does not choose it.
"""

# No `from __future__ import annotations`: TypedDict reads `NotRequired` when the class is made.
import logging
import types
import typing
from typing import Any, NotRequired

from django.conf import settings

from missions.event_payloads import PAYLOADS

logger = logging.getLogger(__name__)

# The catalogue: every event type the product publishes, and what it reports. The state
# machines' events are named in their tables (`missions/transitions/`, docs/ARCHITECTURE.md
# "State machines"); the dashboard subscribes to exactly these (`static/dashboard/live.js`
# reads them from the page). A test checks that every published name is here.
EVENT_TYPES: dict[str, str] = {
    # the mission
    "mission:created": "a mission was created",
    "mission:imported": "a mission file was imported (created or changed)",
    "mission:updated": "a mission's own fields were edited (`changed`: their names)",
    "mission:base-changed": "the protection base was pinned (`from`, `to`: commit ids; `cause`: set or first_use)",
    "mission:activated": "planning or blocked -> active",
    "mission:paused": "active or blocked -> paused",
    "mission:resumed": "paused or blocked -> active",
    "mission:completed": "the autopilot completed every milestone",
    "mission:reopened": "a complete mission is active again (`cause`: what undid it)",
    "mission:autopilot": "the autopilot was switched on or off (`enabled`)",
    "mission:halted": "the autopilot stopped (`reason`)",
    "mission:continued": "the autopilot goes on (its stop reason is cleared)",
    # the plan
    "milestone:created": "a milestone was created",
    "milestone:activated": "pending -> active (a slice of it was activated)",
    "milestone:completed": "a milestone completed",
    "milestone:reopened": "a complete milestone is active again (`cause`)",
    "milestone:validation:updated": "a milestone's rollup was recomputed",
    "slice:created": "a slice was created",
    "slice:activated": "the autopilot activated a slice",
    "slice:completed": "every feature of a slice is done",
    "slice:reopened": "a complete slice is active again (`cause`)",
    "feature:updated": "a feature was created, edited or deleted, or its loop state moved",
    "task:updated": "a task was created, started, completed or failed, or its outcome was not judged",
    # the contract
    "assertion:created": "an assertion was created",
    "assertion:updated": "an assertion was edited",
    "assertion:deleted": "an assertion was deleted",
    "assertion:linked": "an assertion was linked to a feature",
    "assertion:unlinked": "an assertion was unlinked from a feature",
    "assertion:judged": "a verdict changed an assertion's status",
    # judging and fixing
    "validator-run:started": "a validator run started",
    "validator-run:completed": "a validator run ended (passed, failed, blocked, error or cancelled)",
    "validator-run:failures-recorded": "a run's failures were recorded",
    "fix-feature:created": "a fix feature was generated for a failure",
    "fix-feature:report-only": "a failure generated no fix: the mission is report-only",
    "fix-feature:budget-exhausted": "a failure generated no fix: the retry budget is used up",
    "fix-feature:root-blocked": "a fix passed while its root is blocked",
    "follow-up:refused": "a step that follows a verdict was refused (`step`, `code`)",
    "review:progress": "an advisory review moved on",
    # the forge (docs/FORGES.md)
    "forge-delivery:processed": "a webhook delivery was matched, ignored or failed (`state`, `reason`)",
}

# Events that also go to the global channel that feeds mission lists: what changes a
# mission as a whole (every named change of the mission, of its plan's progress, and the
# refusals and budget stops), a feature's state, a run's end and a rollup.
GLOBAL_TYPES = frozenset(
    {
        *(name for name in EVENT_TYPES if name.startswith("mission:")),
        "milestone:created",
        "milestone:completed",
        "milestone:reopened",
        "slice:created",
        "slice:completed",
        "slice:reopened",
        "follow-up:refused",
        "fix-feature:report-only",
        "fix-feature:budget-exhausted",
        "fix-feature:root-blocked",
        "feature:updated",
        "validator-run:completed",
        "milestone:validation:updated",
    }
)


class EventShapeError(ValueError):
    """An event whose type is not in the catalogue, or whose payload is off its shape."""


def check_event(type: str, payload: dict[str, Any]) -> None:
    """Refuse an event the catalogue does not declare: raise `EventShapeError` where
    `FUSION_STRICT` is on, else log it (the event goes out as it is)."""
    problems = event_problems(type, payload)
    if not problems:
        return
    message = f"event {type!r} is off the catalogue (missions/event_catalogue.py): {'; '.join(problems)}"
    if settings.FUSION_STRICT:
        raise EventShapeError(message)
    logger.error(message)


def event_problems(type: str, payload: dict[str, Any]) -> list[str]:
    """What is wrong with an event of `type` carrying `payload` (nothing: it matches)."""
    shape = PAYLOADS.get(type)
    if shape is None:
        return ["an unknown type"]
    hints = _hints(shape)
    problems = [f"no {key!r}" for key in sorted(shape.__required_keys__ - payload.keys())]  # type: ignore[attr-defined]
    for key, value in payload.items():
        if key not in hints:
            problems.append(f"{key!r} is not declared")
        elif not _matches(value, hints[key]):
            problems.append(f"{key!r} is {value!r}, not {hints[key]}")
    return problems


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(shape: type) -> dict[str, Any]:
    if shape not in _HINTS:
        _HINTS[shape] = {key: _unwrap(hint) for key, hint in typing.get_type_hints(shape, include_extras=True).items()}
    return _HINTS[shape]


def _unwrap(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is NotRequired else hint


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is not None:  # list[str], dict[str, int]: the container's type
        return isinstance(value, origin)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)
