"""New or moved work reopens every complete node above it (docs/TRUTH.md, "A slice, a
milestone, a mission is complete when"): a feature created in a complete slice, a slice
in a complete milestone, a milestone in a complete mission, a feature moved into a
complete slice, through the API, a mission file and the admin. Each action publishes
exactly its own event and the reopenings, each naming its cause; the autopilot then
picks the new work up (and completes again what is honestly done)."""

from __future__ import annotations

from contextlib import contextmanager

import dramatiq
import pytest
import yaml

from missions.models import Milestone, Mission, MissionEvent, MissionFeature, Slice, Task
from missions.services.files import mission_export, mission_file_import
from missions.services.lifecycle import mission_activate
from tests.conftest import WorkerHandle
from tests.missions.loop_helpers import add_slice, feature, make_mission, open_task
from tests.validation.test_truth_milestones import completed_mission, land, last_seq, statuses
from validation.models import RunScope, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)

REOPENED = ["slice:reopened", "milestone:reopened", "mission:reopened"]


def _started(broker) -> dramatiq.Worker:
    started = dramatiq.Worker(broker, worker_threads=4, worker_timeout=50)
    started.start()
    return started


@pytest.fixture
def worker(transactional_db):
    """The real worker of `tests/conftest.py`, which `held` may stop and start again."""
    broker = dramatiq.get_broker()
    broker.flush_all()
    handle = WorkerHandle(broker, _started(broker))
    try:
        yield handle
    finally:
        handle.worker.stop()
        broker.flush_all()


@contextmanager
def held(worker: WorkerHandle):
    """No worker runs while the action does, so that the events read after it are the
    action's alone; what it sent waits in the queue for the worker started after it."""
    worker.worker.stop()
    try:
        yield
    finally:
        worker.worker = _started(worker.broker)


def published(mission: Mission, *, after: int) -> list[tuple[str, str | None]]:
    """(type, cause) of every event after `after`, in order."""
    rows = MissionEvent.objects.filter(mission=mission, seq__gt=after).order_by("seq")
    return [(e.type, e.payload.get("cause")) for e in rows]


def reopened_by(cause: str, types: list[str] = REOPENED) -> list[tuple[str, str]]:
    return [(t, cause) for t in types]


def test_a_feature_created_in_a_complete_slice_reopens_slice_milestone_and_mission(worker, alice, git_repo, api_for):
    mission = completed_mission(worker, alice, git_repo)
    s1 = Slice.objects.get(mission=mission)
    seq = last_seq(mission)
    with held(worker):
        response = api_for(alice).post(
            "/api/features/", {"slice": s1.pk, "key": "c", "title": "Feature c"}, format="json"
        )
        assert response.status_code == 201, response.json()
        assert published(mission, after=seq) == [("feature:updated", None), *reopened_by("feature_created")]
        assert statuses(mission) == ("active", "active", "active")
    c = MissionFeature.objects.get(pk=response.json()["id"])
    reopened = MissionEvent.objects.filter(mission=mission, seq__gt=seq, type__in=REOPENED)
    assert {e.payload["feature_id"] for e in reopened} == {c.pk}
    worker.drain()
    assert open_task(feature(mission, "c")) is not None  # the autopilot picked the new work up
    assert mission.status == "active"


def test_a_slice_created_in_a_complete_milestone_reopens_it_and_the_mission(worker, alice, git_repo, api_for):
    mission = completed_mission(worker, alice, git_repo)
    m1 = Milestone.objects.get(mission=mission)
    seq = last_seq(mission)
    with held(worker):
        response = api_for(alice).post(
            "/api/slices/", {"milestone": m1.pk, "key": "s2", "title": "S2", "order": 1}, format="json"
        )
        assert response.status_code == 201, response.json()
        assert published(mission, after=seq) == [
            ("slice:created", None),
            *reopened_by("slice_created", ["milestone:reopened", "mission:reopened"]),
        ]
        m1.refresh_from_db()
        mission.refresh_from_db()
        assert (m1.status, mission.status) == ("active", "active")
    # The autopilot takes the new slice up; being empty, it is done at once, and the
    # milestone (its input unchanged) and the mission complete again.
    worker.drain()
    s2 = Slice.objects.get(mission=mission, key="s2")
    later = [t for t, _cause in published(mission, after=seq)]
    assert "slice:activated" in later and s2.status == "complete"
    mission.refresh_from_db()
    assert mission.status == "complete"


def test_a_milestone_created_in_a_complete_mission_reopens_it(worker, alice, git_repo, api_for):
    mission = completed_mission(worker, alice, git_repo)
    seq = last_seq(mission)
    with held(worker):
        response = api_for(alice).post(
            "/api/milestones/", {"mission": mission.pk, "key": "m2", "title": "M2", "order": 1}, format="json"
        )
        assert response.status_code == 201, response.json()
        assert published(mission, after=seq) == [
            ("milestone:created", None),
            ("milestone:validation:updated", None),
            ("mission:reopened", "milestone_created"),
        ]
        mission.refresh_from_db()
        assert mission.status == "active"
    reopened = MissionEvent.objects.get(mission=mission, seq__gt=seq, type="mission:reopened")
    assert reopened.payload["milestone_id"] == response.json()["id"]
    # The autopilot looks again: the new milestone is empty, so done at once, and the
    # mission completes again.
    worker.drain()
    mission.refresh_from_db()
    assert mission.status == "complete"
    assert Milestone.objects.get(mission=mission, key="m2").status == "complete"


def statuses_of(mission: Mission) -> set[str]:
    """The statuses of the mission, every milestone and the slice s1."""
    mission.refresh_from_db()
    milestones = set(Milestone.objects.filter(mission=mission).values_list("status", flat=True))
    return {mission.status, Slice.objects.get(mission=mission, key="s1").status} | milestones


def two_milestones(worker, alice, git_repo) -> Mission:
    """m1 (slice s1: a) complete; m2 (slice s2: b) active, b's task open, not landed."""
    mission = make_mission(alice, git_repo.path, autopilot=True)
    add_slice(mission, "m1", "s1", ["a"], milestone_order=0)
    add_slice(mission, "m2", "s2", ["b"], milestone_order=1)
    mission_activate(mission=mission, user=alice)
    worker.drain()
    land(worker, alice, git_repo, mission, "a")
    assert Slice.objects.get(key="s1").status == "complete" and Milestone.objects.get(key="m1").status == "complete"
    assert open_task(feature(mission, "b")) is not None
    return mission


def test_an_unfinished_feature_moved_into_a_complete_slice_reopens_it_and_is_judged_there(
    worker, alice, git_repo, api_for
):
    mission = two_milestones(worker, alice, git_repo)
    s1 = Slice.objects.get(key="s1")
    b = feature(mission, "b")
    seq = last_seq(mission)
    with held(worker):
        response = api_for(alice).patch(f"/api/features/{b.pk}/", {"slice": s1.pk}, format="json")
        assert response.status_code == 200, response.json()
        # m2, which it left, is active: nothing to reopen there; the mission was not complete.
        assert published(mission, after=seq) == [
            ("feature:updated", None),
            *reopened_by("feature_moved", ["slice:reopened", "milestone:reopened"]),
        ]
        assert Slice.objects.get(key="s1").status == "active" and Milestone.objects.get(key="m1").status == "active"
    worker.drain()
    land(worker, alice, git_repo, mission, "b")
    assert {f.loop_state for f in MissionFeature.objects.filter(mission=mission)} == {"passed"}
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason


def test_a_passed_feature_moved_into_a_complete_slice_reopens_both_milestones_and_is_judged_again(
    worker, alice, git_repo, api_for
):
    """Moving a done feature keeps every slice done, but both milestones' revisions come
    from their features: both are judged again before the mission completes again."""
    mission = two_milestones(worker, alice, git_repo)
    b_rev = land(worker, alice, git_repo, mission, "b")
    mission.refresh_from_db()
    assert mission.status == "complete"
    s1 = Slice.objects.get(key="s1")
    m1_runs = ValidatorRun.objects.filter(milestone__key="m1", scope=RunScope.MILESTONE)
    assert m1_runs.count() == 1 and m1_runs.get().revision != b_rev
    seq = last_seq(mission)
    with held(worker):
        response = api_for(alice).patch(f"/api/features/{feature(mission, 'b').pk}/", {"slice": s1.pk}, format="json")
        assert response.status_code == 200, response.json()
        assert published(mission, after=seq) == [
            ("feature:updated", None),
            *reopened_by("feature_moved"),
            ("milestone:reopened", "feature_moved"),  # m2, which it left
        ]
        assert statuses_of(mission) == {"active"}
    worker.drain()
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    assert m1_runs.count() == 2 and m1_runs.order_by("-id").first().revision == b_rev


def test_a_mission_file_adding_a_feature_to_a_complete_slice_reopens_it(worker, alice, git_repo):
    mission = completed_mission(worker, alice, git_repo)
    document = yaml.safe_load(mission_export(mission=mission))
    document["milestones"][0]["slices"][0]["features"].append({"key": "c", "title": "Feature c"})
    seq = last_seq(mission)
    with held(worker):
        assert mission_file_import(document=document, user=alice).changed
        assert published(mission, after=seq) == [
            ("milestone:validation:updated", None),
            *reopened_by("feature_created"),
            ("mission:imported", None),
        ]
        assert statuses(mission) == ("active", "active", "active")
    worker.drain()
    assert open_task(feature(mission, "c")) is not None


def test_the_admin_adding_a_feature_to_a_complete_slice_reopens_it(worker, alice, git_repo, admin_client):
    mission = completed_mission(worker, alice, git_repo)
    s1 = Slice.objects.get(mission=mission)
    seq = last_seq(mission)
    with held(worker):
        response = admin_client.post(
            "/admin/missions/missionfeature/add/",
            {
                "slice": s1.pk,
                "key": "c",
                "title": "Feature c",
                "order": "0",
                "assertion_links-TOTAL_FORMS": "0",
                "assertion_links-INITIAL_FORMS": "0",
                "tasks-TOTAL_FORMS": "0",
                "tasks-INITIAL_FORMS": "0",
            },
        )
        assert response.status_code == 302, response.content.decode()[:2000]
        assert published(mission, after=seq) == reopened_by("feature_created")
        assert statuses(mission) == ("active", "active", "active")
    worker.drain()
    assert Task.objects.filter(feature__key="c").exists()
