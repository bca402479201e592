"""Every state machine's table, as data (docs/ARCHITECTURE.md, "State machines"). The
engine (`missions.transitions.machine`) moves a field only along its table, services ask
it what a state allows (`Machine.allows`) instead of listing states again, and
`manage.py transition_tables` writes the tables in the docs from `TRANSITIONS`.

A table maps

    old state -> {new state: event name}            any cause may make the move
    old state -> {new state: {cause: event name}}   only these causes, each with its event

A state with no moves out is final. The validation floor's machines (`ValidatorRun.status`,
`Review.state`) are declared here too, by their values: this module imports no model of
the floor above (docs/ARCHITECTURE.md, "Floors"), and `tests/missions/test_transitions.py`
holds every table to its field's choices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from missions.models import (
    AssertionStatus,
    LoopState,
    MilestoneStatus,
    MissionStatus,
    RollupState,
    SliceStatus,
    TaskStatus,
)

# An entry of a table: the event of the move (any cause), or {cause: event} (only these).
Entry = str | Mapping[str, str]
Table = Mapping[str, Mapping[str, Entry]]


def _each(causes: Iterable[str], event: str) -> dict[str, str]:
    return dict.fromkeys(sorted(causes), event)


# --- the plan (missions) ---------------------------------------------------------------

L = LoopState
SUPERSEDE = ("superseded",)

# `MissionFeature.loop_state`: old state -> {new state: the causes that may move it there}.
# Every move publishes `feature:updated`; docs/TRUTH.md says what each state means.
LOOP_CAUSES: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    L.IDLE: {
        L.IMPLEMENTING: ("task_linked",),
        L.VALIDATING: ("validate", "recovery", "root_revalidation", "contract_changed"),
        L.BLOCKED: ("no_assertions", "workspace_unavailable", "fingerprint_failures"),
        L.PASSED: ("fingerprint_reuse",),
        L.SUPERSEDED: SUPERSEDE,
    },
    L.IMPLEMENTING: {
        L.VALIDATING: ("task_done", "validate", "recovery", "re_run", "root_revalidation"),
        L.BLOCKED: ("fingerprint_failures", "operator", "budget_exhausted", "no_assertions", "workspace_unavailable"),
        L.PASSED: ("fingerprint_reuse",),
        L.SUPERSEDED: SUPERSEDE,
    },
    L.VALIDATING: {
        L.PASSED: ("pass", "fingerprint_reuse"),
        L.NEEDS_FIX: ("fail",),
        L.BLOCKED: (
            "blocked",
            "validator_unavailable",
            # A run that ended `error` for want of a sandbox or an environment
            # (validation/services/verdicts/complete.py ERROR_STOP_REASONS).
            "sandbox_unavailable",
            "environment_failed",
            "operator",
            "fingerprint_failures",
            "workspace_unavailable",
            "no_assertions",
        ),
        L.IMPLEMENTING: ("recovery", "clear"),
        L.SUPERSEDED: SUPERSEDE,
    },
    L.NEEDS_FIX: {
        L.IMPLEMENTING: ("fix_created", "task_linked", "clear"),
        L.VALIDATING: ("validate", "re_run", "task_done", "recovery", "root_revalidation"),
        L.BLOCKED: ("budget_exhausted", "operator", "fingerprint_failures", "no_assertions", "workspace_unavailable"),
        L.PASSED: ("fingerprint_reuse",),
        L.SUPERSEDED: SUPERSEDE,
    },
    L.PASSED: {
        L.IDLE: ("contract_changed",),
        L.IMPLEMENTING: ("clear", "task_linked"),
        L.VALIDATING: ("re_run", "validate", "root_revalidation", "milestone_regression"),
        L.BLOCKED: ("fingerprint_failures", "no_assertions", "workspace_unavailable"),
        L.NEEDS_FIX: ("milestone_regression",),
    },
    # Only an operator's clear or re-run, or a mission resume, leaves `blocked`; never a
    # reused pass (docs/TRUTH.md). A blocked fix whose root passed is closed as superseded.
    # `source_available`: the commit a `workspace_unavailable` block waited for is now at
    # the source, and the recovery sweep judges it (a new run, never a reuse).
    L.BLOCKED: {
        L.IMPLEMENTING: ("clear", "resume"),
        L.VALIDATING: ("re_run", "resume", "source_available"),
        L.SUPERSEDED: SUPERSEDE,
    },
    # Closed: a superseded fix is done for rollups and the autopilot and is never judged again.
    L.SUPERSEDED: {},
}

FEATURE: Table = {
    old: {new: _each(causes, "feature:updated") for new, causes in moves.items()} for old, moves in LOOP_CAUSES.items()
}

T = TaskStatus
TASK_EVENT = "task:updated"

# `Task.status`. A task is created `todo`; nothing cancels a task.
TASK: Table = {
    T.TODO: {T.IN_PROGRESS: {"start": TASK_EVENT}, T.DONE: {"complete": TASK_EVENT}, T.FAILED: {"fail": TASK_EVENT}},
    T.IN_PROGRESS: {T.DONE: {"complete": TASK_EVENT}, T.FAILED: {"fail": TASK_EVENT}},
    T.DONE: {},
    T.FAILED: {},
    T.CANCELLED: {},
}

M = MissionStatus

# `Mission.status`; the autopilot's stop reason (`status_reason`) changes as a named move
# of an active mission (halt sets it, continue clears it). Nothing sets `blocked` (a
# mission may be created in it); `archived` has no move in or out.
MISSION: Table = {
    M.PLANNING: {M.ACTIVE: {"activate": "mission:activated"}},
    M.ACTIVE: {
        M.PAUSED: {"pause": "mission:paused"},
        M.COMPLETE: {"complete": "mission:completed"},
        M.ACTIVE: {"halt": "mission:halted", "continue": "mission:continued"},
    },
    M.BLOCKED: {
        M.ACTIVE: {"activate": "mission:activated", "resume": "mission:resumed"},
        M.PAUSED: {"pause": "mission:paused"},
    },
    M.PAUSED: {M.ACTIVE: {"resume": "mission:resumed"}},
    # Anything that undoes a completion reopens the mission; the cause is what undid it.
    M.COMPLETE: {M.ACTIVE: "mission:reopened"},
    M.ARCHIVED: {},
}

MS = MilestoneStatus

# `Milestone.status`. A milestone is created `pending`; nothing sets `blocked`.
MILESTONE: Table = {
    MS.PENDING: {MS.ACTIVE: {"activate": "milestone:activated"}, MS.COMPLETE: {"complete": "milestone:completed"}},
    MS.ACTIVE: {MS.COMPLETE: {"complete": "milestone:completed"}},
    MS.BLOCKED: {MS.COMPLETE: {"complete": "milestone:completed"}},
    # Anything that undoes a completion reopens the milestone; the cause is what undid it.
    MS.COMPLETE: {MS.ACTIVE: "milestone:reopened"},
}

ROLLUP_EVENT = "milestone:validation:updated"

# `Milestone.validation_state`: the rollup of its assertions (precedence not_started >
# failed > blocked > needs_coverage > passed > ready, `missions.selectors.rollup_state`),
# derived, so any state may follow any other; its one writer is the rollup refresh.
MILESTONE_VALIDATION: Table = {
    old: {new: {"rollup": ROLLUP_EVENT} for new in RollupState.values if new != old} for old in RollupState.values
}

SL = SliceStatus

# `Slice.status`. A slice is created `pending`.
SLICE: Table = {
    SL.PENDING: {SL.ACTIVE: {"activate": "slice:activated"}},
    SL.ACTIVE: {SL.COMPLETE: {"complete": "slice:completed"}},
    # Anything that undoes a completion reopens the slice; the cause is what undid it.
    SL.COMPLETE: {SL.ACTIVE: "slice:reopened"},
}

A = AssertionStatus
JUDGED = (A.PASSED, A.FAILED, A.BLOCKED)

# `ContractAssertion.status`, set by verdicts. An assertion is created `pending` and never
# goes back to it; a verdict that repeats the status is no move (the run records it).
ASSERTION: Table = {old: {new: {"verdict": "assertion:judged"} for new in JUDGED if new != old} for old in A.values}

# --- judging (validation) --------------------------------------------------------------

RUN_EVENT = "validator-run:completed"

# `ValidatorRun.status`. A run is created `running` (or already `passed`, for a reused
# pass) by admission and ends once: by its verdict, by an error (a crash, a timeout, a
# reap), or cancelled when newer evidence made it moot. The callers publish the event with
# what the end recorded (a verdict's counts come after the assertions it judged).
RUN: Table = {
    "running": {
        "passed": {"verdict": RUN_EVENT},
        "failed": {"verdict": RUN_EVENT},
        "blocked": {"verdict": RUN_EVENT},
        "error": {"error": RUN_EVENT},
        "cancelled": {"cancel": RUN_EVENT},
    },
    "passed": {},
    "failed": {},
    "blocked": {},
    "error": {},
    "cancelled": {},
}

REVIEW_EVENT = "review:progress"
REVIEW_STAGES = (
    "initializing",
    "candidates_running",
    "candidates_complete",
    "evaluating",
    "evaluation_complete",
    "rendering",
    "completed",
)
REVIEW_ENDS = ("completed", "failed", "cancelled")


def _review() -> dict[str, dict[str, Entry]]:
    """Each stage advances to the next; any stage may fail or be cancelled."""
    table: dict[str, dict[str, Entry]] = {
        stage: {
            following: {"advance": REVIEW_EVENT},
            "failed": {"fail": REVIEW_EVENT},
            "cancelled": {"cancel": REVIEW_EVENT},
        }
        for stage, following in zip(REVIEW_STAGES, REVIEW_STAGES[1:], strict=False)
    }
    return {**table, **{end: {} for end in REVIEW_ENDS}}


# `Review.state`: the advisory review's stages (validation/review/stages.py).
REVIEW: Table = _review()

# Every table by the name the docs' markers use (`<!-- transitions:NAME -->`), with the
# field it governs.
TRANSITIONS: Mapping[str, tuple[str, Table]] = {
    "feature": ("MissionFeature.loop_state", FEATURE),
    "task": ("Task.status", TASK),
    "mission": ("Mission.status", MISSION),
    "milestone": ("Milestone.status", MILESTONE),
    "milestone_validation": ("Milestone.validation_state", MILESTONE_VALIDATION),
    "slice": ("Slice.status", SLICE),
    "assertion": ("ContractAssertion.status", ASSERTION),
    "run": ("ValidatorRun.status", RUN),
    "review": ("Review.state", REVIEW),
}
