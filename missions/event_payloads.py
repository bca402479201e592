"""The payload of each event type (`missions/event_catalogue.py` checks events against them):
keys and the types of their values. A shape describes what the code sends, it does not
choose it: the dashboard, the streams and API clients read these payloads.
"""

# No `from __future__ import annotations`: TypedDict reads `NotRequired` when the class is made.
from typing import NotRequired, TypedDict

# Keys and the types of their values (`NotRequired`: sent by some publishers of the type,
# not all). A state machine's move (`missions/transitions/machine.py: move`) sends the row
# (its machine's name), `from`, the new value (its field's name) and `cause`, with what
# its caller adds.


class MissionRow(TypedDict):
    mission: int
    status: str


class MissionImported(MissionRow):
    created: bool
    owner: int | None


class MissionUpdated(MissionRow):
    changed: list[str]


# `from` is a keyword: the types that carry it are declared in TypedDict's call form.
MissionBaseChanged = TypedDict(
    "MissionBaseChanged", {"mission": int, "base_revision": str, "from": str, "to": str, "cause": str}
)


class MissionAutopilot(MissionRow):
    enabled: bool


# A state machine's move: `from` and `cause` (the row and its new value are named by each
# machine's type below).
_Move = TypedDict("_Move", {"from": str, "cause": str})

# Sent by some publishers of a type (a move), not all (an edit).
_MovedFrom = TypedDict("_MovedFrom", {"from": NotRequired[str]})


class _Reopened(TypedDict):
    """What reopened a complete node (`missions/transitions/progress.py: work_added`)."""

    feature_id: NotRequired[int | None]
    slice_id: NotRequired[int | None]
    milestone_id: NotRequired[int | None]


class MissionMoved(_Move, _Reopened):
    mission: int
    status: str
    reason: NotRequired[str]  # a halt's stop reason


class MilestoneCreated(TypedDict):
    mission: int
    milestone: int
    key: str
    status: str


class MilestoneMoved(_Move, _Reopened):
    milestone: int
    status: str
    slice: NotRequired[int]  # the slice whose activation activated it


class _Counts(TypedDict):
    total: int
    passed: int
    failed: int
    blocked: int
    pending: int
    unlinked: int


class MilestoneRollup(_Counts, _MovedFrom):
    """The rollup (`missions/selectors.py: milestone_rollup`); with the move's keys when
    its state changed."""

    milestone: int
    state: str
    validation_state: NotRequired[str]
    cause: NotRequired[str]


class SliceCreated(TypedDict):
    mission: int
    slice: int
    milestone: int
    key: str


class SliceMoved(_Move, _Reopened):
    slice: int
    status: str
    milestone: NotRequired[int]  # an activation names its milestone and key
    key: NotRequired[str]
    feature: NotRequired[int]  # a fix reopened it: the fix and its source
    source: NotRequired[int]


class FeatureUpdated(_MovedFrom):
    """An edit (`change`: created, edited, deleted; a deletion sends only `feature` and
    `change`) or a move of the loop (`from`, `loop_state`, `status`, `cause` and what the
    step adds)."""

    feature: int
    change: NotRequired[str]
    loop_state: NotRequired[str]
    status: NotRequired[str | None]
    cause: NotRequired[str]
    task: NotRequired[int]
    run: NotRequired[int]
    fix: NotRequired[int]
    root: NotRequired[int]
    source: NotRequired[int]
    reason: NotRequired[str]
    errors: NotRequired[int]
    assertions: NotRequired[list[str]]
    revision: NotRequired[str]  # new code landed on it


class TaskUpdated(_MovedFrom):
    """A service's change (`change`: created, started, completed, failed; with `feature`
    and `revision`), a move (`from`, `cause`) or an outcome not judged (`warning`)."""

    task: int
    status: str
    feature: NotRequired[int | None]
    revision: NotRequired[str]
    revision_name: NotRequired[str]
    change: NotRequired[str]
    cause: NotRequired[str]
    reason: NotRequired[str]
    warning: NotRequired[str]


class Assertion(TypedDict):
    """`missions/services/hierarchy.py: _assertion_payload`."""

    assertion: int
    key: str
    milestone: int
    status: str
    scope: str


class AssertionLinked(Assertion):
    feature: int


class AssertionJudged(_Move):
    assertion: int
    status: str
    key: NotRequired[str]
    milestone: NotRequired[int]
    run: NotRequired[int]


class RunStarted(TypedDict):
    run: int
    feature: int | None
    milestone: int | None
    scope: str
    trigger: str
    validator_attempt: int
    implementation_attempt: int
    revision: str
    revision_name: NotRequired[str]
    retry_of: NotRequired[int]


class RunCompleted(TypedDict):
    """Built in four places: a verdict (`counts`, `tokens`), an error (`error`), a
    cancellation (`reason`) and a reused pass (`reused_from`, without `milestone` and
    `scope`)."""

    run: int
    feature: int | None
    status: str
    milestone: NotRequired[int | None]
    scope: NotRequired[str]
    counts: NotRequired[dict[str, int]]
    tokens: NotRequired[int]
    error: NotRequired[str]
    reason: NotRequired[str]
    reused_from: NotRequired[int]


class RunFailuresRecorded(TypedDict):
    run: int
    feature: int | None
    count: int
    assertions: list[str]


class FixCreated(TypedDict):
    feature: int
    source: int
    root: int
    run: int
    round: int
    budget_left: int
    assertions: list[str]


class FixStopped(TypedDict):
    mission: int
    feature: int
    run: int


class FixRootBlocked(FixStopped):
    fix: int
    reason: str


class FollowUpRefused(TypedDict):
    mission: int
    step: str
    code: str
    reason: str


# A review's move through its machine also names where it came from and why.
_ReviewMove = TypedDict("_ReviewMove", {"from": NotRequired[str], "cause": NotRequired[str]})


class ReviewProgress(_ReviewMove):
    """`validation/review/state.py: progress`: `event` names the step (a move through the
    machine adds `from` and `cause`, as every machine's event does)."""

    review: int
    event: str
    state: NotRequired[str]
    previous: NotRequired[str]
    slot: NotRequired[int]
    usable_answer: NotRequired[bool]
    attempt: NotRequired[int]
    violations: NotRequired[int]
    failure_code: NotRequired[str]
    failure_stage: NotRequired[str]


class ForgeDeliveryProcessed(TypedDict):
    """A webhook delivery processed (`state`: matched, ignored or failed, with its `reason`);
    the task it completed, and the pull request it named. Never the hook's secret."""

    delivery: int
    provider: str
    event: str
    state: str
    reason: str
    task: int | None
    pull_number: int | None


PAYLOADS: dict[str, type] = {
    "mission:created": MissionRow,
    "mission:imported": MissionImported,
    "mission:updated": MissionUpdated,
    "mission:base-changed": MissionBaseChanged,
    **dict.fromkeys(
        (
            "mission:activated",
            "mission:paused",
            "mission:resumed",
            "mission:completed",
            "mission:reopened",
            "mission:halted",
            "mission:continued",
        ),
        MissionMoved,
    ),
    "mission:autopilot": MissionAutopilot,
    "milestone:created": MilestoneCreated,
    **dict.fromkeys(("milestone:activated", "milestone:completed", "milestone:reopened"), MilestoneMoved),
    "milestone:validation:updated": MilestoneRollup,
    "slice:created": SliceCreated,
    **dict.fromkeys(("slice:activated", "slice:completed", "slice:reopened"), SliceMoved),
    "feature:updated": FeatureUpdated,
    "task:updated": TaskUpdated,
    **dict.fromkeys(("assertion:created", "assertion:updated", "assertion:deleted"), Assertion),
    **dict.fromkeys(("assertion:linked", "assertion:unlinked"), AssertionLinked),
    "assertion:judged": AssertionJudged,
    "validator-run:started": RunStarted,
    "validator-run:completed": RunCompleted,
    "validator-run:failures-recorded": RunFailuresRecorded,
    "fix-feature:created": FixCreated,
    **dict.fromkeys(("fix-feature:report-only", "fix-feature:budget-exhausted"), FixStopped),
    "fix-feature:root-blocked": FixRootBlocked,
    "follow-up:refused": FollowUpRefused,
    "review:progress": ReviewProgress,
    "forge-delivery:processed": ForgeDeliveryProcessed,
}
