"""The audit log and live events of the loop: the exact MissionEvent
types each step writes, in `seq` order, and that nothing is sent before commit."""

from __future__ import annotations

import threading

import dramatiq
import pytest
from django.db import transaction

from missions import delivery
from missions.models import Mission, MissionEvent, MissionFeature
from missions.services.tasks import task_complete, task_create

GREETING = {"file": "hello.py", "contains": r"def hello\("}
GOOD = {"hello.py": "def hello():\n    return 'hi'\n"}
BAD = {"hello.py": "def goodbye():\n    pass\n"}


class Recorder:
    """Stands in for the transport (`missions.delivery.send_all`: the events of one commit)."""

    def __init__(self):
        self.sent: list[tuple[int, str, dict]] = []
        self._lock = threading.Lock()

    def __call__(self, events):
        with self._lock:
            self.sent.extend(events)

    def seqs(self) -> list[tuple[int, str]]:
        return sorted((data["seq"], type) for _mission, type, data in self.sent)


@pytest.fixture
def sent(monkeypatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(delivery, "send_all", recorder)
    return recorder


def types_after(seq: int = 0) -> list[str]:
    return list(MissionEvent.objects.filter(seq__gt=seq).order_by("seq").values_list("type", flat=True))


def last_seq() -> int:
    return MissionEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0


def rows() -> list[tuple[int, str]]:
    return list(MissionEvent.objects.order_by("seq").values_list("seq", "type"))


def loop_states(seq: int = 0) -> list[tuple[str, str, str]]:
    qs = MissionEvent.objects.filter(type="feature:updated", seq__gt=seq).order_by("seq")
    return [(e.payload["from"], e.payload["loop_state"], e.payload["cause"]) for e in qs]


@pytest.mark.django_db(transaction=True)
class TestLoopEvents:
    def test_task_create_and_complete(self, sent, build_mission, git_repo, alice):
        build_mission({"hello": [("VAL-1", GREETING)]})
        feature = MissionFeature.objects.get(key="hello")
        task = task_create(user=alice, feature=feature)
        assert types_after() == ["task:updated", "feature:updated"]
        assert loop_states() == [("idle", "implementing", "task_linked")]
        created = MissionEvent.objects.get(type="task:updated")
        assert created.payload == {
            "task": task.pk,
            "feature": feature.pk,
            "status": "todo",
            "revision": "",
            "change": "created",
        }
        assert created.actor_id == alice.pk
        seq = last_seq()
        rev = git_repo.commit(GOOD)
        task_complete(user=alice, task=task, revision=rev)
        assert types_after(seq) == ["task:updated"]
        done = MissionEvent.objects.get(seq=seq + 1)
        assert (
            done.payload["status"] == "done"
            and done.payload["revision"] == rev
            and done.payload["change"] == "completed"
        )
        assert [s for s, _t in sent.seqs()] == [1, 2, 3]
        assert sent.seqs() == rows()
        dramatiq.get_broker().flush_all()  # process_task_outcome was queued; no worker here

    def test_a_pass(self, sent, worker, build_mission, git_repo, alice):
        build_mission({"hello": [("VAL-1", GREETING)]})
        feature = MissionFeature.objects.get(key="hello")
        task = task_create(user=alice, feature=feature)
        # Read before the completion: the worker judges it as soon as it commits.
        seq = last_seq()
        task_complete(user=alice, task=task, revision=git_repo.commit(GOOD))
        worker.drain()
        assert types_after(seq) == [
            "task:updated",  # the completion
            "feature:updated",  # implementing -> validating
            "validator-run:started",
            "assertion:judged",  # the verdict moves the assertion: pending -> passed
            "milestone:validation:updated",  # the assertion's new status rolls up (same transaction)
            "validator-run:completed",
            "feature:updated",  # validating -> passed
        ]
        assert loop_states(seq) == [("implementing", "validating", "task_done"), ("validating", "passed", "pass")]
        by_type = {e.type: e.payload for e in MissionEvent.objects.filter(seq__gt=seq)}
        run_id = by_type["validator-run:started"]["run"]
        assert by_type["validator-run:completed"] == {
            "run": run_id,
            "feature": feature.pk,
            "milestone": feature.slice.milestone_id,
            "scope": "feature",
            "status": "passed",
            "counts": {"pass": 1, "fail": 0, "blocked": 0},
            "tokens": 0,
        }
        assert by_type["milestone:validation:updated"]["state"] == "passed"
        judged = by_type["assertion:judged"]
        assert (judged["key"], judged["from"], judged["status"], judged["cause"], judged["run"]) == (
            "VAL-1",
            "pending",
            "passed",
            "verdict",
            run_id,
        )
        # Every row was sent exactly once, with its own seq.
        assert sent.seqs() == rows()
        mission_id = Mission.objects.get().pk
        assert all(m == mission_id and data["mission"] == mission_id and data["type"] == t for m, t, data in sent.sent)

    def test_a_fail_with_auto_fix(self, sent, worker, build_mission, git_repo, alice):
        build_mission({"hello": [("VAL-1", GREETING)]})
        feature = MissionFeature.objects.get(key="hello")
        task = task_create(user=alice, feature=feature)
        # Read before the completion: the worker judges it as soon as it commits.
        seq = last_seq()
        task_complete(user=alice, task=task, revision=git_repo.commit(BAD))
        worker.drain()
        assert types_after(seq) == [
            "task:updated",  # the completion
            "feature:updated",  # implementing -> validating
            "validator-run:started",
            "assertion:judged",
            "milestone:validation:updated",
            "validator-run:completed",
            "validator-run:failures-recorded",
            "feature:updated",  # validating -> needs_fix
            "feature:updated",  # needs_fix -> implementing (the fix exists)
            "fix-feature:created",
        ]
        assert loop_states(seq) == [
            ("implementing", "validating", "task_done"),
            ("validating", "needs_fix", "fail"),
            ("needs_fix", "implementing", "fix_created"),
        ]
        fix = MissionFeature.objects.get(generated_from=feature)
        recorded = MissionEvent.objects.get(type="validator-run:failures-recorded").payload
        assert recorded["count"] == 1 and recorded["assertions"] == ["VAL-1"]
        created = MissionEvent.objects.get(type="fix-feature:created").payload
        assert created == {
            "feature": fix.pk,
            "source": feature.pk,
            "root": feature.pk,
            "run": recorded["run"],
            "round": 1,
            "budget_left": 2,
            "assertions": ["VAL-1"],
        }
        assert sent.seqs() == rows()

    def test_a_fail_report_only(self, sent, worker, build_mission, git_repo, alice):
        build_mission({"hello": [("VAL-1", GREETING)]}, auto_fix=False)
        feature = MissionFeature.objects.get(key="hello")
        task = task_create(user=alice, feature=feature)
        # Read before the completion: the worker judges it as soon as it commits.
        seq = last_seq()
        task_complete(user=alice, task=task, revision=git_repo.commit(BAD))
        worker.drain()
        assert types_after(seq) == [
            "task:updated",  # the completion
            "feature:updated",
            "validator-run:started",
            "assertion:judged",
            "milestone:validation:updated",
            "validator-run:completed",
            "validator-run:failures-recorded",
            "feature:updated",
            "fix-feature:report-only",
        ]
        assert MissionEvent.objects.get(type="fix-feature:report-only").payload["feature"] == feature.pk

    def test_nothing_is_sent_before_commit(self, sent, build_mission, git_repo, alice):
        build_mission({"hello": [("VAL-1", GREETING)]})
        feature = MissionFeature.objects.get(key="hello")
        before = last_seq()
        with transaction.atomic():
            task_create(user=alice, feature=feature)
            assert types_after(before) == ["task:updated", "feature:updated"]  # the audit rows exist already
            assert sent.sent == []
        assert sent.seqs() == [(before + 1, "task:updated"), (before + 2, "feature:updated")]

    def test_a_rolled_back_change_sends_nothing_and_leaves_no_row(self, sent, build_mission, git_repo, alice):
        build_mission({"hello": [("VAL-1", GREETING)]})
        feature = MissionFeature.objects.get(key="hello")
        before = last_seq()
        with pytest.raises(RuntimeError), transaction.atomic():
            task_create(user=alice, feature=feature)
            raise RuntimeError("changed my mind")
        assert sent.sent == [] and types_after(before) == []
        assert Mission.objects.get().event_seq == before
        feature.refresh_from_db()
        assert feature.loop_state == "idle"


@pytest.mark.django_db
def test_on_commit_callbacks_carry_the_rows_seq(
    sent, build_mission, git_repo, alice, django_capture_on_commit_callbacks
):
    build_mission({"hello": [("VAL-1", GREETING)]})
    feature = MissionFeature.objects.get(key="hello")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        task = task_create(user=alice, feature=feature)
        task_complete(user=alice, task=task, revision=git_repo.commit(GOOD))
    assert sent.sent == []  # still inside the test's transaction: nothing went out
    assert [t for _s, t in rows()] == ["task:updated", "feature:updated", "task:updated"]
    try:
        for callback in callbacks:
            callback()
    finally:
        dramatiq.get_broker().flush_all()  # the queued outcome job: no worker in this test
    assert sent.seqs() == rows()
    assert [data["seq"] for _m, _t, data in sent.sent] == [1, 2, 3]  # sent in commit order
