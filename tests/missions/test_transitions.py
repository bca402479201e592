"""Every state machine's table (docs/ARCHITECTURE.md, "State machines"): for each
machine, every (old, new) pair of its field's choices. A legal pair moves with exactly one
audit row, of the pair's named event; an illegal pair raises `IllegalTransition` and
changes nothing; a lost compare-and-swap returns False and changes nothing. And the event
catalogue (`missions.event_catalogue.EVENT_TYPES`) names every event the code publishes."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from django.template import engines

from missions.errors import IllegalTransition
from missions.event_catalogue import EVENT_TYPES, GLOBAL_TYPES
from missions.models import ContractAssertion, Milestone, Mission, MissionEvent, MissionFeature, Slice, Task
from missions.transitions import (
    assertion_transition,
    feature_transition,
    milestone_transition,
    milestone_validation_transition,
    mission_transition,
    slice_transition,
    task_transition,
)
from missions.transitions.loop import FEATURE
from missions.transitions.machine import Machine, move
from missions.transitions.moves import ASSERTION, MILESTONE, MILESTONE_VALIDATION, MISSION, SLICE, TASK
from missions.transitions.tables import LOOP_CAUSES

ROOT = Path(__file__).resolve().parents[2]
ANY_CAUSE = "test_cause"  # the cause used where a table entry allows any cause


@pytest.fixture
def rows(db):
    """One row of each machine's model, all in one mission (planning, pending, idle, todo)."""
    mission = Mission.objects.create(key="sm", title="State machines")
    milestone = Milestone.objects.create(mission=mission, key="m1", title="M1")
    slice_ = Slice(milestone=milestone, key="s1", title="S1")
    slice_.save()
    feature = MissionFeature(slice=slice_, key="f1", title="F1")
    feature.save()
    assertion = ContractAssertion(milestone=milestone, key="A-1", title="A", statement="works")
    assertion.save()
    task = Task.objects.create(mission=mission, feature=feature, title="T")
    return {
        Mission: mission,
        Milestone: milestone,
        Slice: slice_,
        MissionFeature: feature,
        ContractAssertion: assertion,
        Task: task,
    }


# machine -> its one public function, called as the services call it
PUBLIC = {
    MISSION: lambda pk, old, new, cause: mission_transition(mission=pk, old=old, new=new, cause=cause),
    MILESTONE: lambda pk, old, new, cause: milestone_transition(milestone=pk, old=old, new=new, cause=cause),
    MILESTONE_VALIDATION: lambda pk, old, new, cause: milestone_validation_transition(
        milestone=pk,
        old=old,
        new=new,
        rollup={
            "milestone": pk,
            "state": new,
            **dict.fromkeys(("total", "passed", "failed", "blocked", "pending", "unlinked"), 0),
        },
    ),
    SLICE: lambda pk, old, new, cause: slice_transition(slice_=pk, old=old, new=new, cause=cause),
    FEATURE: lambda pk, old, new, cause: feature_transition(feature=pk, old=old, new=new, cause=cause),
    TASK: lambda pk, old, new, cause: task_transition(task=pk, old=old, new=new, cause=cause),
    ASSERTION: lambda pk, old, new, cause: assertion_transition(assertion=pk, old=old, new=new, cause=cause),
}
MACHINES = list(PUBLIC)


def label(machine: Machine) -> str:
    return f"{machine.model.__name__}.{machine.field}"


PAIRS = [
    pytest.param(machine, old, new, id=f"{label(machine)}:{old}->{new}")
    for machine in MACHINES
    for old, new in itertools.product(machine.states, repeat=2)
]


def causes_of(machine: Machine, old: str, new: str) -> list[str]:
    """The causes to try for a pair: each cause the table names, or one for 'any cause';
    none for an illegal pair."""
    causes = machine.causes(old, new)
    return [ANY_CAUSE] if causes is None else sorted(causes)


ROLLUP_CAUSE = "rollup"


def put(machine: Machine, row, state: str) -> None:
    machine.model.objects.filter(pk=row.pk).update(**{machine.field: state})


def state_of(machine: Machine, row) -> str:
    return machine.model.objects.values_list(machine.field, flat=True).get(pk=row.pk)


def audit(mission: Mission) -> list[MissionEvent]:
    return list(MissionEvent.objects.filter(mission=mission).order_by("seq"))


@pytest.mark.django_db
@pytest.mark.parametrize(("machine", "old", "new"), PAIRS)
def test_every_pair_of_every_machine(rows, machine, old, new):
    row, mission = rows[machine.model], rows[Mission]
    for cause in causes_of(machine, old, new):
        put(machine, row, old)
        before = {e.pk for e in audit(mission)}
        assert PUBLIC[machine](row.pk, old, new, cause) is True
        assert state_of(machine, row) == new
        recorded = [e for e in audit(mission) if e.pk not in before]
        assert [e.type for e in recorded] == [machine.event(old, new, cause)], (cause, recorded)
        assert recorded[0].type in EVENT_TYPES
        payload = recorded[0].payload
        assert (payload[machine.name], payload["from"], payload[machine.field], payload["cause"]) == (
            row.pk,
            old,
            new,
            cause,
        )
    for cause in refused_causes(machine, old, new):
        put(machine, row, old)
        before = audit(mission)
        with pytest.raises(IllegalTransition) as raised:
            PUBLIC[machine](row.pk, old, new, cause)
        assert raised.value.code == "illegal_transition"
        assert raised.value.extra == {"from": old, "to": new, "cause": cause}
        assert state_of(machine, row) == old and audit(mission) == before


def refused_causes(machine: Machine, old: str, new: str) -> list[str]:
    """A pair the table allows for some causes refuses any other; a pair it does not
    hold refuses every cause."""
    allowed = machine.causes(old, new)
    if machine is MILESTONE_VALIDATION:  # its one writer always gives the cause `rollup`
        return [] if allowed else [ROLLUP_CAUSE]
    if allowed is None:
        return []
    return ["not_a_cause"] if allowed else ["not_a_cause", *sorted(_all_causes(machine))]


def _all_causes(machine: Machine) -> set[str]:
    found = {ANY_CAUSE}
    for moves in machine.table.values():
        for entry in moves.values():
            if not isinstance(entry, str):
                found |= set(entry)
    return found


LEGAL = [
    pytest.param(machine, old, new, id=f"{label(machine)}:{old}->{new}")
    for machine in MACHINES
    for old, new in itertools.product(machine.states, repeat=2)
    if causes_of(machine, old, new)
]


@pytest.mark.django_db
@pytest.mark.parametrize(("machine", "old", "new"), LEGAL)
def test_a_lost_compare_and_swap_returns_false_and_changes_nothing(rows, machine, old, new):
    row, mission = rows[machine.model], rows[Mission]
    winner = next(s for s in machine.states if s != old)  # another writer moved it first
    put(machine, row, winner)
    before = audit(mission)
    assert PUBLIC[machine](row.pk, old, new, causes_of(machine, old, new)[0]) is False
    assert state_of(machine, row) == winner and audit(mission) == before


def test_the_feature_machine_is_the_loop_table():
    """`feature_transition` keeps its table: the machine is built from it, cause by cause."""
    assert {
        (old, new, cause) for old, moves in LOOP_CAUSES.items() for new, causes in moves.items() for cause in causes
    } == {(old, new, cause) for old, moves in FEATURE.table.items() for new, entry in moves.items() for cause in entry}
    assert {FEATURE.event(*k) for k in [("idle", "implementing", "task_linked")]} == {"feature:updated"}


@pytest.mark.django_db
def test_halting_and_continuing_are_named_changes_of_the_reason(rows):
    mission = rows[Mission]
    Mission.objects.filter(pk=mission.pk).update(status="active", status_reason="")
    assert mission_transition(mission=mission.pk, old="active", new="active", cause="halt", reason="stuck")
    assert Mission.objects.get(pk=mission.pk).status_reason == "stuck"
    assert mission_transition(mission=mission.pk, old="active", new="active", cause="continue")
    assert Mission.objects.get(pk=mission.pk).status_reason == ""
    halted, continued = audit(mission)
    assert (halted.type, halted.payload["reason"], continued.type) == ("mission:halted", "stuck", "mission:continued")


@pytest.mark.django_db
def test_move_bumps_updated_at_and_writes_the_extra_fields(rows):
    slice_ = rows[Slice]
    before = Slice.objects.get(pk=slice_.pk).updated_at
    assert move(SLICE, pk=slice_.pk, old="pending", new="active", cause="activate", fields={"order": 7})
    after = Slice.objects.get(pk=slice_.pk)
    assert after.updated_at > before and after.order == 7


# --- the catalogue -------------------------------------------------------------------


def _published_names() -> set[tuple[str, str]]:
    """Every literal event name passed to `publish_on_commit` in the apps' code."""
    found = set()
    for path in [*ROOT.glob("missions/**/*.py"), *ROOT.glob("validation/**/*.py")]:
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "publish_on_commit"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                found.add((str(path.relative_to(ROOT)), node.args[1].value))
    return found


def test_the_catalogue_names_every_published_event():
    published = _published_names()
    assert published, "the scan found no publish_on_commit call"
    assert {(where, name) for where, name in published if name not in EVENT_TYPES} == set()
    machine_events = {
        entry if isinstance(entry, str) else event
        for machine in MACHINES
        for moves in machine.table.values()
        for entry in moves.values()
        for event in ([entry] if isinstance(entry, str) else entry.values())
    }
    assert machine_events <= EVENT_TYPES.keys()
    assert EVENT_TYPES.keys() >= GLOBAL_TYPES


def test_mission_updated_is_only_an_edit_of_the_missions_fields():
    assert [where for where, name in _published_names() if name == "mission:updated"] == [
        "missions/services/hierarchy.py"
    ]


def test_the_page_carries_the_catalogue():
    html = engines["django"].from_string("{% load live_events %}{% live_event_types %}").render({})
    assert html.startswith('<script id="live-event-types" type="application/json">')
    for name in EVENT_TYPES:
        assert f'"{name}"' in html
