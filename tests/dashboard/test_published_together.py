"""`missions.outbox.published_together`: the audit rows of a block's events written in one
statement at its end, numbered as if each had been written when published, and sent live
with those numbers; what a savepoint or an exception undoes is neither written nor sent."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django_eventstream.models import Event as StoredEvent

from missions.locks import lock_mission
from missions.models import Mission, MissionEvent
from missions.outbox import publish_on_commit, published_together
from tests.dashboard.conftest import publish_in_a_rolled_back_savepoint

# Their events carry payloads of their own making: the transport is under test.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("synthetic_events")]


def audit_writes(queries) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if 'INSERT INTO "missions_missionevent"' in q["sql"]]


def streamed(mission: Mission) -> list[dict]:
    rows = StoredEvent.objects.filter(channel=f"mission-{mission.pk}").exclude(type="").order_by("eid")
    return [json.loads(json.loads(data)) for data in rows.values_list("data", flat=True)]


def test_a_block_s_events_are_written_in_one_statement_numbered_in_order_and_sent_with_their_seq(small_mission):
    m = small_mission.mission
    before = Mission.objects.get(pk=m.pk).event_seq
    with CaptureQueriesContext(connection) as queries, transaction.atomic(), published_together():
        lock_mission(m.pk)
        for change in ("a", "b", "c"):
            publish_on_commit(m, "feature:updated", {"change": change})
        assert not MissionEvent.objects.filter(mission=m, seq__gt=before).exists()  # not yet: at the end
    assert len(audit_writes(queries)) == 1
    rows = list(MissionEvent.objects.filter(mission=m, seq__gt=before).order_by("seq").values_list("seq", "payload"))
    assert rows == [(before + 1, {"change": "a"}), (before + 2, {"change": "b"}), (before + 3, {"change": "c"})]
    assert Mission.objects.get(pk=m.pk).event_seq == before + 3
    sent = [(e["seq"], e["change"]) for e in streamed(m)[-3:]]
    assert sent == [(before + 1, "a"), (before + 2, "b"), (before + 3, "c")]


def test_an_event_of_a_savepoint_rolled_back_in_the_block_is_neither_written_nor_sent(small_mission):
    m = small_mission.mission
    before = Mission.objects.get(pk=m.pk).event_seq
    with transaction.atomic(), published_together():
        publish_on_commit(m, "mission:updated", {"change": "kept"})
        publish_in_a_rolled_back_savepoint(m)
        publish_on_commit(m, "mission:updated", {"change": "kept too"})
    rows = MissionEvent.objects.filter(mission=m, seq__gt=before).order_by("seq").values_list("seq", "payload")
    assert list(rows) == [(before + 1, {"change": "kept"}), (before + 2, {"change": "kept too"})]
    assert [(e["seq"], e["change"]) for e in streamed(m)[-2:]] == [(before + 1, "kept"), (before + 2, "kept too")]
    assert "rolled back" not in json.dumps(streamed(m))


def test_an_exception_out_of_the_block_writes_and_sends_nothing(small_mission):
    m = small_mission.mission
    before = Mission.objects.get(pk=m.pk).event_seq
    sent_before = len(streamed(m))
    with pytest.raises(RuntimeError), transaction.atomic(), published_together():
        publish_on_commit(m, "mission:updated", {"change": "lost"})
        raise RuntimeError
    assert Mission.objects.get(pk=m.pk).event_seq == before
    assert not MissionEvent.objects.filter(mission=m, seq__gt=before).exists()
    assert len(streamed(m)) == sent_before


def test_outside_a_transaction_and_nested_it_changes_nothing(small_mission):
    """Outside a transaction each event is written at once; a nested block leaves the
    writing to the outer one."""
    m = small_mission.mission
    before = Mission.objects.get(pk=m.pk).event_seq
    with published_together():
        assert publish_on_commit(m, "mission:updated", {"change": "now"}).seq == before + 1
    with CaptureQueriesContext(connection) as queries, transaction.atomic(), published_together():
        publish_on_commit(m, "mission:updated", {"change": "outer"})
        with published_together():
            publish_on_commit(m, "mission:updated", {"change": "inner"})
        assert not MissionEvent.objects.filter(mission=m, seq__gt=before + 1).exists()
    assert len(audit_writes(queries)) == 1
    rows = MissionEvent.objects.filter(mission=m, seq__gt=before).order_by("seq").values_list("payload", flat=True)
    assert [p["change"] for p in rows] == ["now", "outer", "inner"]


def test_events_of_two_missions_in_one_block_each_get_their_own_numbers(small_mission, alice):
    one = small_mission.mission
    two = Mission.objects.create(key="other", title="other", owner=alice)
    first, second = (Mission.objects.get(pk=m.pk).event_seq for m in (one, two))
    with transaction.atomic(), published_together():
        publish_on_commit(one, "mission:updated", {"change": "1a"})
        publish_on_commit(two, "mission:updated", {"change": "2a"})
        publish_on_commit(one, "mission:updated", {"change": "1b"})
    for mission, start, changes in ((one, first, ["1a", "1b"]), (two, second, ["2a"])):
        rows = MissionEvent.objects.filter(mission=mission, seq__gt=start).order_by("seq")
        assert [(r.seq, r.payload["change"]) for r in rows] == [(start + i + 1, c) for i, c in enumerate(changes)]
        assert [(e["seq"], e["change"]) for e in streamed(mission)[-len(changes) :]] == [
            (start + i + 1, c) for i, c in enumerate(changes)
        ]
