"""The event catalogue (`missions/event_catalogue.py`): every type the code publishes is
declared with its payload's shape, docs/DASHBOARD.md lists exactly those types, an event
off its shape is refused, and a few actions emit exactly the events (type and checked
payload) expected."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from missions import event_catalogue
from missions.event_catalogue import EVENT_TYPES, GLOBAL_TYPES, PAYLOADS, EventShapeError, event_problems
from missions.models import AssertionScope, MissionEvent
from missions.outbox import publish_on_commit
from missions.services.hierarchy import (
    assertion_create,
    assertion_link,
    feature_create,
    milestone_create,
    mission_create,
    slice_create,
)
from missions.services.tasks import task_create

ROOT = Path(__file__).resolve().parents[2]
EVENT_NAME = re.compile(r"^[a-z-]+(:[a-z-]+)+$")


def _sources() -> list[Path]:
    return [
        path
        for path in [*ROOT.glob("missions/**/*.py"), *ROOT.glob("validation/**/*.py")]
        if "migrations" not in path.parts and path.name != "event_catalogue.py"
    ]


def _published_types() -> set[str]:
    """Every event type named in the apps' code: the literal type of a `publish_on_commit`
    call, and every module-level constant or state-machine table entry that looks like an
    event name (a call that passes a name, such as `move`'s `event`, takes it from those)."""
    found: set[str] = set()
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "publish_on_commit"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                found.add(node.args[1].value)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and EVENT_NAME.match(node.value)
                and node.value.split(":")[0] in {name.split(":")[0] for name in EVENT_TYPES}
            ):
                found.add(node.value)
    return found


def test_every_published_type_is_declared_with_a_payload():
    published = _published_types()
    assert "task:updated" in published and "validator-run:completed" in published
    assert published - EVENT_TYPES.keys() == set()
    assert PAYLOADS.keys() == EVENT_TYPES.keys()
    assert EVENT_TYPES.keys() >= GLOBAL_TYPES


def test_the_docs_list_exactly_the_catalogue():
    text = (ROOT / "docs" / "DASHBOARD.md").read_text()
    section = text[text.index("**Event types.**") :]
    listed = re.findall(r"^\| `([^`]+)` \|", section, re.M)
    assert listed == list(EVENT_TYPES)


@pytest.mark.django_db
def test_an_unknown_type_or_a_payload_off_its_shape_is_refused(tree):
    mission = tree.mission
    assert event_problems("mission:created", {"mission": 1, "status": "active"}) == []
    assert event_problems("mission:exploded", {}) == ["an unknown type"]
    assert event_problems("mission:created", {"mission": "1"}) == ["no 'status'", "'mission' is '1', not <class 'int'>"]
    assert event_problems("mission:created", {"mission": 1, "status": "a", "x": 2}) == ["'x' is not declared"]
    before = MissionEvent.objects.count()
    with pytest.raises(EventShapeError):
        publish_on_commit(mission, "mission:exploded", {})
    with pytest.raises(EventShapeError):
        publish_on_commit(mission, "mission:created", {"mission": mission.pk})
    assert MissionEvent.objects.count() == before  # refused before its audit row


@pytest.mark.django_db
def test_outside_strict_mode_an_event_off_its_shape_is_logged_and_sent(settings, tree, caplog):
    settings.FUSION_STRICT = False
    event = publish_on_commit(tree.mission, "mission:created", {"mission": tree.mission.pk})
    assert event.pk is not None
    assert "off the catalogue" in caplog.text and event_catalogue.__name__ in {r.name for r in caplog.records}


# --- what an action emits (type and payload) ---------------------------------------------


def _emitted(after: int) -> list[tuple[str, dict]]:
    rows = MissionEvent.objects.filter(seq__gt=after).order_by("mission_id", "seq")
    emitted = [(row.type, row.payload) for row in rows]
    for type, payload in emitted:
        assert event_problems(type, payload) == []
    return emitted


def _last_seq(mission) -> int:
    return MissionEvent.objects.filter(mission=mission).order_by("-seq").values_list("seq", flat=True).first() or 0


@pytest.mark.django_db
def test_building_a_plan_emits_exactly_these_events(owner):
    mission = mission_create(user=owner, key="m", title="M")
    milestone = milestone_create(user=owner, mission=mission, key="ms", title="MS")
    slice_ = slice_create(user=owner, milestone=milestone, key="sl", title="SL")
    feature = feature_create(user=owner, slice_=slice_, key="f", title="F")
    assertion = assertion_create(
        user=owner, milestone=milestone, key="VAL-1", title="t", statement="s", scope=AssertionScope.FEATURE
    )
    seq = _last_seq(mission)
    assertion_link(user=owner, feature=feature, assertion=assertion)
    emitted = _emitted(seq)
    assert [type for type, _p in emitted] == ["assertion:linked", "milestone:validation:updated"]
    assert emitted[0][1] == {
        "assertion": assertion.pk,
        "key": "VAL-1",
        "milestone": milestone.pk,
        "status": "pending",
        "scope": "feature",
        "feature": feature.pk,
    }
    types = list(MissionEvent.objects.filter(mission=mission).order_by("seq").values_list("type", flat=True))
    assert types[:3] == ["mission:created", "milestone:created", "milestone:validation:updated"]
    assert MissionEvent.objects.get(mission=mission, type="mission:created").payload == {
        "mission": mission.pk,
        "status": mission.status,
    }


@pytest.mark.django_db
def test_creating_a_task_emits_exactly_its_event(owner, tree):
    feature = tree.f2
    seq = _last_seq(tree.mission)
    task = task_create(user=owner, feature=feature)
    assert _emitted(seq) == [
        (
            "task:updated",
            {"task": task.pk, "status": "todo", "feature": feature.pk, "revision": "", "change": "created"},
        ),
        (
            "feature:updated",
            {
                "feature": feature.pk,
                "from": "idle",
                "loop_state": "implementing",
                "cause": "task_linked",
                "status": "in_progress",
                "task": task.pk,
            },
        ),
    ]
