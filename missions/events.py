"""The only module that publishes live events and writes the mission audit log.

`publish_on_commit` sends nothing until the surrounding transaction commits; then the
event goes to django-eventstream (stored, so a reconnecting EventSource replays it from
Last-Event-ID) on `mission-<id>` and `missions`, and to the mission's Channels group for
WebSocket clients with the same JSON and the stored event id.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, transaction
from django.dispatch import Signal

from fusion_site.base.prepared import Prepared
from missions import audit, delivery
from missions.models import Mission, MissionEvent, MissionStatus

logger = logging.getLogger(__name__)

GLOBAL_CHANNEL = "missions"

# The catalogue: every event type the product publishes, and what it reports. The state
# machines' events are named in their tables (`missions/transitions/tables.py`, docs/ARCHITECTURE.md
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
}

# Events that also go to the global channel that feeds mission lists: what changes a
# mission as a whole (every named change of the mission, of its plan's progress, and the
# refusals and budget stops that used to be `mission:updated`), a feature's state, a run's
# end and a rollup.
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


# Sent after commit with `mission_id`, `channel` (the mission's) and `user_ids` (who lost
# access). The SSE streams of this process subscribe (`missions.streams.views`): this
# module stays below the transport and imports nothing of it.
access_revoked = Signal()


def mission_channel(mission_id: int) -> str:
    return f"mission-{mission_id}"


def group_name(mission_id: int) -> str:
    return f"mission-{mission_id}"


def lock_mission(mission_id: int) -> None:
    """Take the mission's row lock first. Every event takes it (the `seq` counter), so
    a transaction that will also lock features or tasks must take it before them: one
    lock order everywhere, no deadlock between the autopilot and the loop. SQLite's
    IMMEDIATE transactions serialize writers already; there this is a no-op (no query:
    without `FOR UPDATE` it would only be a read)."""
    connection = connections[Mission.objects.db]
    if not connection.features.has_select_for_update:
        return
    if connection.in_atomic_block and _held(connection, mission_id) is not None:
        return  # this transaction holds it already: no second round trip under it
    row = _LOCK.first(pk=mission_id)
    if connection.in_atomic_block and row is not None:
        connection.on_commit(_MissionLock(mission_id, running=_runs(*row)))


# The row's autopilot and status come with the lock: `autopilot_running_under_lock` answers
# from them, without a read of its own.
_LOCK: Prepared[tuple[bool, str]] = Prepared(
    lambda pk: Mission.objects.select_for_update().filter(pk=pk).values_list("autopilot", "status")
)
_AUTOPILOT: Prepared[tuple[bool, str]] = Prepared(
    lambda pk: Mission.objects.filter(pk=pk).values_list("autopilot", "status")
)


class _MissionLock:
    """A no-op on-commit callback that marks the mission's row lock as held by the current
    transaction, with what the row said when it was locked. Django drops it exactly when
    the lock goes: at commit or rollback, and with a savepoint rolled back (which releases
    the locks taken after it)."""

    __slots__ = ("mission_id", "running")

    def __init__(self, mission_id: int, *, running: bool):
        self.mission_id = mission_id
        self.running = running  # its autopilot is on and it is active, as locked

    def __call__(self) -> None:
        return None


def autopilot_running_under_lock(mission_id: int) -> bool | None:
    """Whether the mission's autopilot is on and the mission active, as this transaction
    read it when it took the mission's lock (`lock_mission`); None without that lock. It
    cannot change before this transaction commits: any other writer of the row waits for
    it. In a SQLite transaction, read now: it began `IMMEDIATE`, with the one write lock."""
    connection = connections[Mission.objects.db]
    if not connection.in_atomic_block:
        return None
    if not connection.features.has_select_for_update:
        row = _AUTOPILOT.first(pk=mission_id)
        return row is not None and _runs(*row)
    return _held(connection, mission_id)


def _runs(autopilot: bool, status: str) -> bool:
    """The autopilot has work to look at: it is on and the mission active."""
    return bool(autopilot) and status == MissionStatus.ACTIVE


def _held(connection: Any, mission_id: int) -> bool | None:
    """The marker of this transaction's lock on the mission (its `running`), or None."""
    for entry in connection.run_on_commit:
        if isinstance(entry, tuple) and len(entry) == 3:
            marker = entry[1]
            if isinstance(marker, _MissionLock) and marker.mission_id == mission_id:
                return marker.running
    return None


def publish_on_commit(
    mission: Mission | int, type: str, payload: dict[str, Any], *, actor_id: int | None = None
) -> MissionEvent:
    """Append the audit row now (it rolls back with the transaction) and send the live
    event only after commit. The row's `seq` travels with the event so that clients can
    tell gaps and the WebSocket carries the same id as the audit log. Inside
    `published_together`, the row is written at the end of that block: the event returned
    has its `seq` only then."""
    mission_id = mission if isinstance(mission, int) else mission.pk
    pending = _pending(transaction.get_connection(MissionEvent.objects.db))
    if pending is not None:
        event = audit.new(mission_id, type, payload, actor_id)
        data = {"type": type, "mission": mission_id, "seq": None, **payload}
        pending.append((event, data, _send_on_commit(mission_id, type, data)))
        return event
    # No savepoint of its own (two statements fewer per event, on every hop of the loop):
    # a failure here fails the caller's transaction, which is what it would do anyway.
    with transaction.atomic(savepoint=False):
        event = audit.append(mission_id, type, payload, actor_id)
    _send_on_commit(mission_id, type, {"type": type, "mission": mission_id, "seq": event.seq, **payload})
    return event


_PENDING = "fusion_published_together"


def _pending(connection: Any) -> list[tuple[MissionEvent, dict[str, Any], _Outbox]] | None:
    return getattr(connection, _PENDING, None) if connection.in_atomic_block else None


@contextlib.contextmanager
def published_together() -> Iterator[None]:
    """The audit rows of the events published in this block (inside a transaction) are
    written together when it ends: one statement per mission instead of one per event (a
    loop step publishes up to five, each a round trip under the mission's lock).

    Use it inside the transaction, around the whole body of an atomic service, so that an
    exception leaving the block also rolls that transaction (or its savepoint) back with
    the events. A block that locks other rows must take the mission's lock before them
    (`lock_mission`), as every service does: its rows' counter, which takes the mission's
    row too, comes at the end. An event published in
    a savepoint rolled back inside the block is dropped with its live send. Outside a
    transaction, or inside another such block, it changes nothing."""
    connection = transaction.get_connection(MissionEvent.objects.db)
    if not connection.in_atomic_block or _pending(connection) is not None:
        yield
        return
    pending: list[tuple[MissionEvent, dict[str, Any], _Outbox]] = []
    setattr(connection, _PENDING, pending)
    try:
        yield
    finally:
        setattr(connection, _PENDING, None)
    _write_pending(connection, pending)


def _write_pending(connection: Any, pending: list[tuple[MissionEvent, dict[str, Any], _Outbox]]) -> None:
    # Still to be sent: an outbox Django dropped went with a savepoint rolled back.
    live = {id(hook) for _sids, hook, _robust in connection.run_on_commit}
    by_mission: dict[int, list[tuple[MissionEvent, dict[str, Any]]]] = {}
    for event, data, outbox in pending:
        if id(outbox) in live:
            by_mission.setdefault(event.mission_id, []).append((event, data))
    for mission_id, items in by_mission.items():
        audit.append_many(mission_id, [event for event, _data in items])
        for event, data in items:
            if "seq" not in event.payload:  # as `{"seq": …, **payload}` has it
                data["seq"] = event.seq


class _Outbox:
    """The live events of one transaction (of one savepoint level), sent together once it
    commits: their stream rows in one transaction, their group sends in one hop. A loop
    step publishes two to six events; each sent alone was a write transaction of its own."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[tuple[int, str, dict[str, Any]]] = []

    def __call__(self) -> None:
        send_all(self.events)


def _send_on_commit(mission_id: int, type: str, data: dict[str, Any]) -> _Outbox:
    """Join the transaction's newest outbox when it belongs to the same savepoint level
    (a savepoint rolled back then drops exactly its own events, as Django drops its
    callbacks, and events go out in `seq` order); else open a new one. An event may so
    go out before a callback registered after its outbox (an actor's message): never
    before its own commit, and never after something it caused."""
    connection = transaction.get_connection(Mission.objects.db)
    if connection.in_atomic_block:
        # Django files each callback under the savepoints open when it was registered, an
        # `atomic(savepoint=False)` block as None: no rollback drops by None (such a block
        # that fails dooms its nearest real savepoint or the transaction), so None is no level.
        newest = next(
            ((s, hook) for s, hook, _r in reversed(connection.run_on_commit) if isinstance(hook, _Outbox)), None
        )
        if newest is not None and newest[0] - {None} == set(connection.savepoint_ids) - {None}:
            newest[1].events.append((mission_id, type, data))
            return newest[1]
    outbox = _Outbox()
    outbox.events.append((mission_id, type, data))
    transaction.on_commit(outbox, using=connection.alias)
    return outbox


def audience(mission_id: int) -> set[int]:
    """The ids of the users who see a mission by name (its owner and members; staff see
    every mission and never lose access by a membership change)."""
    owner, members = (
        Mission.objects.filter(pk=mission_id).values_list("owner_id", flat=True).first(),
        set(Mission.members.through.objects.filter(mission_id=mission_id).values_list("user_id", flat=True)),
    )
    return members | ({owner} if owner is not None else set())


def revoke_on_commit(mission_id: int, user_ids: set[int]) -> None:
    """After commit, end the live streams of those of `user_ids` who may no longer see
    the mission: SSE streams of this process at once, through `access_revoked` (those of other processes when they
    re-check access, every KEEP_ALIVE_SECONDS), WebSocket connections of every process
    through the mission's Channels group (close code 4403)."""
    if user_ids:
        transaction.on_commit(lambda: _revoke(mission_id, set(user_ids)))


def _revoke(mission_id: int, user_ids: set[int]) -> None:
    # Runs after commit: a failure here must not turn the committed change into an error
    # (nor skip the callbacks after it). The streams' periodic re-check remains.
    try:
        _revoke_now(mission_id, user_ids)
    except Exception:  # noqa: BLE001
        logger.exception("revoking the live streams of mission %s failed", mission_id)


def _revoke_now(mission_id: int, user_ids: set[int]) -> None:

    staff = set(get_user_model().objects.filter(pk__in=user_ids, is_staff=True).values_list("pk", flat=True))
    revoked = user_ids - audience(mission_id) - staff  # whoever was given access back meanwhile keeps it
    if not revoked:
        return
    for receiver, result in access_revoked.send_robust(
        sender=None, mission_id=mission_id, channel=mission_channel(mission_id), user_ids=revoked
    ):
        if isinstance(result, Exception):  # the WebSocket connections below are closed all the same
            logger.error("ending the SSE streams of mission %s failed (%s)", mission_id, receiver, exc_info=result)
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group_name(mission_id), {"type": "mission.access", "revoked": sorted(revoked)})


def send_all(events: list[tuple[int, str, dict[str, Any]]]) -> None:
    """Send committed events `(mission id, type, data)` now: stored for the event streams,
    then to the missions' Channels groups (the outbox at commit, `missions.relay` later)."""
    # A failing transport must never undo or break the committed business change:
    # the database is the source of truth and clients reload their state on reset.
    groups = list(dict.fromkeys(group_name(mission_id) for mission_id, _t, _d in events))
    listened = None  # not known: every group gets its send
    try:
        listened = _stream(events, groups)
    except Exception:  # noqa: BLE001
        logger.exception("eventstream delivery failed for %s", ", ".join(type for _m, type, _d in events))
    _send_groups(events, listened)


def _stream(events: list[tuple[int, str, dict[str, Any]]], groups: list[str]) -> set[str] | None:
    """Store and publish; which of `groups` have members, when the stream's Redis tells."""
    items = []
    for mission_id, type, data in events:
        encoded = json.dumps(data, cls=DjangoJSONEncoder)  # as django-eventstream's send_event encodes it
        items.append((mission_channel(mission_id), type, encoded))
        if type in GLOBAL_TYPES:
            items.append((GLOBAL_CHANNEL, type, encoded))
    return delivery.stream(items, groups=groups)


def _send_groups(events: list[tuple[int, str, dict[str, Any]]], listened: set[str] | None = None) -> None:
    """One `mission.events` message per mission group with that mission's events in order
    (`{"event", "data", "id"}` each): a group send costs Redis round trips and a hop to
    the sender loop whatever it carries. Listeners also take a single `mission.event`.
    `listened`: the groups known to have members (None: not known); no other gets a send."""
    batches: dict[int, list[dict[str, Any]]] = {}
    for mission_id, type, data in events:
        batches.setdefault(mission_id, []).append({"event": type, "data": data, "id": data["seq"]})
    delivery.group_send(
        [
            (group_name(mission_id), {"type": "mission.events", "events": items})
            for mission_id, items in batches.items()
            if listened is None or group_name(mission_id) in listened
        ]
    )
