"""One source for every state rule: `missions/transitions/tables.py`.

The docs' tables are written from it (`manage.py transition_tables`) and must match; every
table names exactly its field's choices; and the validation floor's machines
(`ValidatorRun.status`, `Review.state`) move by the plan's engine: a pair the table does
not hold raises `IllegalTransition` and changes nothing, a legal one records its row in
the audit log. The plan's own machines are enumerated pair by pair in
`tests/missions/test_transitions.py`."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from missions.errors import IllegalTransition
from missions.event_catalogue import EVENT_TYPES
from missions.management.transition_docs import DOCS, render, stale_docs
from missions.models import Milestone, Mission, MissionEvent, MissionFeature, Slice
from missions.transitions import ASSERTION, FEATURE, MILESTONE, MILESTONE_VALIDATION, MISSION, SLICE, TASK
from missions.transitions.machine import Machine, move
from missions.transitions.tables import TRANSITIONS
from validation.models import Review, ValidatorRun
from validation.review.state import REVIEW, transition
from validation.services.run_state import RUN, run_finish
from validation.services.runs import announce_completed

ROOT = Path(__file__).resolve().parents[2]
MACHINES = {
    "feature": FEATURE,
    "task": TASK,
    "mission": MISSION,
    "milestone": MILESTONE,
    "milestone_validation": MILESTONE_VALIDATION,
    "slice": SLICE,
    "assertion": ASSERTION,
    "run": RUN,
    "review": REVIEW,
}


def test_the_committed_docs_are_the_generated_tables():
    assert stale_docs(ROOT, write=False) == [], "run: python manage.py transition_tables"
    call_command("transition_tables", "--check")
    for name in TRANSITIONS:
        assert any(f"<!-- transitions:{name} -->" in (ROOT / doc).read_text() for doc in DOCS), name


def test_check_fails_on_a_hand_edited_table_and_writing_restores_it(tmp_path):
    for doc in DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    path = tmp_path / "docs/ARCHITECTURE.md"
    original = path.read_text()
    path.write_text(original.replace("| `todo` | `in_progress` | `start` |", "| `done` | `in_progress` | `start` |"))
    assert stale_docs(tmp_path, write=False) == ["docs/ARCHITECTURE.md"]
    assert stale_docs(tmp_path, write=True) == ["docs/ARCHITECTURE.md"]
    assert path.read_text() == original and stale_docs(tmp_path, write=False) == []


def test_check_command_refuses_stale_docs(tmp_path, settings):
    for doc in DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / doc).write_text(f"<!-- transitions:run -->\nhand-written\n<!-- /transitions:run -->\n{doc}\n")
    settings.BASE_DIR = tmp_path
    with pytest.raises(CommandError, match="out of date"):
        call_command("transition_tables", "--check")
    call_command("transition_tables")
    assert render("run") in (tmp_path / DOCS[0]).read_text()


@pytest.mark.parametrize("name", list(MACHINES))
def test_every_table_is_its_machine_and_names_only_its_fields_choices(name):
    machine = MACHINES[name]
    field, table = TRANSITIONS[name]
    assert machine.table is table and field == f"{machine.model.__name__}.{machine.field}"
    named = set(table) | {new for moves in table.values() for new in moves}
    assert named <= set(machine.states), named - set(machine.states)


def test_allows_reads_the_table():
    assert FEATURE.allows("idle", "implementing", "task_linked")
    assert not FEATURE.allows("idle", "implementing", "clear")
    assert FEATURE.allows("validating", "blocked") and not FEATURE.allows("superseded", "idle")
    assert MISSION.allows("complete", "active", "anything_that_undid_it")
    assert not MISSION.names("complete", "active", "activate") and MISSION.names("paused", "active", "resume")
    assert [s for s in TASK.states if TASK.allows(s, "failed", "fail")] == ["todo", "in_progress"]
    assert TASK.open_states == ["todo", "in_progress"] and FEATURE.open_states == [
        s for s in FEATURE.states if s != "superseded"
    ]


# --- the validation floor's machines, pair by pair --------------------------------------


@pytest.fixture
def plan(db):
    mission = Mission.objects.create(key="st", title="State tables")
    milestone = Milestone.objects.create(mission=mission, key="m1", title="M1")
    slice_ = Slice(milestone=milestone, key="s1", title="S1")
    slice_.save()
    feature = MissionFeature(slice=slice_, key="f1", title="F1")
    feature.save()
    return mission, milestone, feature


def rows(mission: Mission, before: int = 0) -> list[MissionEvent]:
    return list(MissionEvent.objects.filter(mission=mission, seq__gt=before).order_by("seq"))


def last_seq(mission: Mission) -> int:
    return max([e.seq for e in rows(mission)], default=0)


def pairs(machine: Machine):
    return [pytest.param(old, new, id=f"{old}->{new}") for old, new in itertools.product(machine.states, repeat=2)]


def the_cause(machine: Machine, old: str, new: str) -> str | None:
    causes = machine.causes(old, new)
    return "any" if causes is None else next(iter(sorted(causes)), None)


@pytest.mark.django_db
@pytest.mark.parametrize(("old", "new"), pairs(RUN))
def test_every_pair_of_the_run_machine(plan, old, new):
    mission, milestone, feature = plan
    run = ValidatorRun.objects.create(mission=mission, milestone=milestone, feature=feature, status=old)
    before = last_seq(mission)
    cause = the_cause(RUN, old, new)
    if cause is None:
        with pytest.raises(IllegalTransition) as raised:
            move(RUN, pk=run.pk, old=old, new=new, cause="verdict", mission_id=mission.pk)
        assert raised.value.code == "illegal_transition"
        assert ValidatorRun.objects.get(pk=run.pk).status == old and rows(mission, before) == []
        return
    # The one writer: the end of a running run, then its event with what it recorded.
    assert run_finish(run=run, status=new, cause=cause, summary="ended")
    announce_completed(run, reason="test")
    stored = ValidatorRun.objects.get(pk=run.pk)
    assert (stored.status, stored.summary, stored.completed_at is not None) == (new, "ended", True)
    (row,) = rows(mission, before)
    assert (row.type, row.payload["run"], row.payload["status"], row.payload["reason"]) == (
        "validator-run:completed",
        run.pk,
        new,
        "test",
    )
    # It ends once: a late second end changes nothing.
    assert not run_finish(run=run, status=new, cause=cause)


@pytest.mark.django_db
def test_run_finish_refuses_a_status_or_cause_the_table_does_not_hold(plan):
    mission, milestone, feature = plan
    run = ValidatorRun.objects.create(mission=mission, milestone=milestone, feature=feature)
    for status, cause in [("running", "verdict"), ("passed", "cancel"), ("cancelled", "verdict")]:
        with pytest.raises(IllegalTransition):
            run_finish(run=run, status=status, cause=cause)
    assert ValidatorRun.objects.get(pk=run.pk).status == "running"


@pytest.mark.django_db
@pytest.mark.parametrize(("old", "new"), pairs(REVIEW))
def test_every_pair_of_the_review_machine(plan, old, new):
    mission, _milestone, feature = plan
    review = Review.objects.create(mission=mission, feature=feature, request={"q": 1}, state=old)
    before = last_seq(mission)
    if the_cause(REVIEW, old, new) is None:
        with pytest.raises(IllegalTransition) as raised:
            transition(review.pk, old=old, new=new)
        assert raised.value.code == "illegal_transition"
        assert Review.objects.get(pk=review.pk).state == old and rows(mission, before) == []
        return
    assert transition(review.pk, old=old, new=new)
    assert Review.objects.get(pk=review.pk).state == new
    recorded = rows(mission, before)
    assert {e.type for e in recorded} == {"review:progress"}
    moved = recorded[0].payload
    assert (moved["review"], moved["event"], moved["previous"], moved["state"]) == (review.pk, "state", old, new)
    ends = {"completed", "failed", "cancelled"}
    assert [e.payload["event"] for e in recorded[1:]] == ([new] if new in ends else [])
    # A lost compare-and-swap (the review moved on): no move, no row.
    assert not transition(review.pk, old=old, new=new)
    assert len(rows(mission, before)) == len(recorded)


@pytest.mark.django_db
def test_a_review_without_a_mission_moves_without_a_stream(db):
    review = Review.objects.create(request={"q": 1})
    assert transition(review.pk, old="initializing", new="candidates_running")
    assert Review.objects.get(pk=review.pk).state == "candidates_running"
    assert not MissionEvent.objects.exists()


def test_every_tables_event_is_in_the_catalogue():
    named = {
        event
        for _field, table in TRANSITIONS.values()
        for moves in table.values()
        for entry in moves.values()
        for event in ([entry] if isinstance(entry, str) else entry.values())
    }
    assert named <= EVENT_TYPES.keys(), named - EVENT_TYPES.keys()
