"""The mission state machine (docs/ARCHITECTURE.md, "State machines"):
`Mission.status`, and the autopilot's stop reason (`status_reason`) as a named change of
an active mission.

| from     | to       | cause                     | event             | who                        |
|----------|----------|---------------------------|-------------------|----------------------------|
| planning | active   | activate                  | mission:activated | lifecycle.mission_activate |
| blocked  | active   | activate                  | mission:activated | lifecycle.mission_activate |
| blocked  | active   | resume                    | mission:resumed   | lifecycle.mission_resume   |
| paused   | active   | resume                    | mission:resumed   | lifecycle.mission_resume   |
| active   | paused   | pause                     | mission:paused    | lifecycle.mission_pause    |
| blocked  | paused   | pause                     | mission:paused    | lifecycle.mission_pause    |
| active   | complete | complete                  | mission:completed | progress.mission_complete  |
| complete | active   | any (what undid it)       | mission:reopened  | progress.reopen_mission    |
| active   | active   | halt (a reason is set)    | mission:halted    | the autopilot stops        |
| active   | active   | continue (reason cleared) | mission:continued | the autopilot goes on      |

`archived` has no move in or out; nothing sets `blocked` today (a mission may be created
in it). Halting sets `status_reason` to its `reason` (and the event carries it);
continuing, activating, pausing, resuming and completing clear it; reopening leaves it.
"""

from __future__ import annotations

from typing import Any

from missions.models import Mission, MissionStatus
from missions.transitions.machine import Machine, Table, move

S = MissionStatus

TRANSITIONS: Table = {
    S.PLANNING: {S.ACTIVE: {"activate": "mission:activated"}},
    S.ACTIVE: {
        S.PAUSED: {"pause": "mission:paused"},
        S.COMPLETE: {"complete": "mission:completed"},
        S.ACTIVE: {"halt": "mission:halted", "continue": "mission:continued"},
    },
    S.BLOCKED: {
        S.ACTIVE: {"activate": "mission:activated", "resume": "mission:resumed"},
        S.PAUSED: {"pause": "mission:paused"},
    },
    S.PAUSED: {S.ACTIVE: {"resume": "mission:resumed"}},
    # Anything that undoes a completion reopens the mission; the cause is what undid it.
    S.COMPLETE: {S.ACTIVE: "mission:reopened"},
    S.ARCHIVED: {},
}

# The moves that clear the autopilot's stop reason.
CLEARS_REASON = frozenset({"activate", "pause", "resume", "complete", "continue"})

MISSION = Machine(name="mission", model=Mission, field="status", table=TRANSITIONS, mission_field="pk")


def mission_transition(
    *,
    mission: Mission | int,
    old: str,
    new: str,
    cause: str,
    reason: str = "",
    actor_id: int | None = None,
    fields: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
) -> bool:
    """Move one mission from `old` to `new`; `reason` is the autopilot's stop reason of a
    halt. Returns False when another writer won. A `Mission` passed in is not refreshed
    (callers that read it again refresh it)."""
    pk = mission if isinstance(mission, int) else mission.pk
    if cause == "halt":
        fields, payload = {**(fields or {}), "status_reason": reason}, {**(payload or {}), "reason": reason}
    elif cause in CLEARS_REASON:
        fields = {**(fields or {}), "status_reason": ""}
    return move(MISSION, pk=pk, old=old, new=new, cause=cause, actor_id=actor_id, fields=fields, payload=payload)
