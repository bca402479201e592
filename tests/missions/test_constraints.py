"""What the database itself guarantees: keys unique per mission, one running run per
feature, unique lineage and journal positions, cascades, `updated_at`."""

from __future__ import annotations

import datetime

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from missions.models import (
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
    Task,
)
from validation.models import FixLineage, JournalEntry, RunStatus, ValidatorFailure, ValidatorRun

pytestmark = pytest.mark.django_db


def run_for(feature: MissionFeature, status: str = RunStatus.RUNNING) -> ValidatorRun:
    return ValidatorRun.objects.create(
        mission_id=feature.mission_id, feature=feature, milestone=feature.slice.milestone, status=status
    )


def assert_database_refuses(fn) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        fn()


# --------------------------------------------------------------------------- keys


def test_keys_are_unique_per_mission(tree):
    m = tree.milestone
    assert_database_refuses(lambda: Milestone.objects.create(mission=tree.mission, key="m1", title="again"))
    assert_database_refuses(lambda: Slice(milestone=tree.milestone2, key="s1", title="again").save())
    assert_database_refuses(lambda: MissionFeature(slice=tree.slice, key="f1", title="again").save())
    assert_database_refuses(
        lambda: ContractAssertion(milestone=tree.milestone2, key="VAL-001", title="again", statement="s").save()
    )
    assert_database_refuses(lambda: Mission.objects.create(key="alpha", title="again"))
    assert_database_refuses(lambda: FeatureAssertion.objects.create(feature=tree.f1, assertion=tree.a_linked))
    assert_database_refuses(lambda: MissionEvent.objects.create(mission=tree.mission, seq=tree.event.seq, type="x"))
    assert Milestone.objects.filter(mission=tree.mission).count() == 2 and m.key == "m1"


def test_the_same_keys_in_two_missions_are_fine(tree, stranger):
    other = Mission.objects.create(key="other", title="Other", owner=stranger)
    m = Milestone.objects.create(mission=other, key="m1", title="same key")
    s = Slice(milestone=m, key="s1", title="same key")
    s.save()
    MissionFeature(slice=s, key="f1", title="same key").save()
    ContractAssertion(milestone=m, key="VAL-001", title="same key", statement="s").save()
    for model in (Milestone, Slice, MissionFeature, ContractAssertion):
        assert set(model.objects.filter(mission=other).values_list("key", flat=True)) <= set(
            model.objects.filter(mission=tree.mission).values_list("key", flat=True)
        )
        assert model.objects.filter(mission=other).count() == 1
    assert MissionFeature.objects.filter(key="f1").count() == 2


def test_mission_is_derived_from_the_parent_on_save(tree, other_tree):
    s = Slice(milestone=other_tree.milestone2, key="moved", title="x")
    s.mission_id = tree.mission.pk  # a wrong value is corrected, not trusted
    s.save()
    assert s.mission_id == other_tree.mission.pk
    f = MissionFeature(slice=s, key="fx", title="x")
    f.save()
    a = ContractAssertion(milestone=other_tree.milestone2, key="A-X", title="x", statement="s")
    a.save()
    assert f.mission_id == a.mission_id == other_tree.mission.pk


# --------------------------------------------------------------------------- runs, lineage, journal


def test_one_running_run_per_feature(tree):
    run_for(tree.f1)
    assert_database_refuses(lambda: run_for(tree.f1))
    assert ValidatorRun.objects.filter(feature=tree.f1).count() == 1
    run_for(tree.f2)  # another feature may run at the same time


def test_finished_and_running_runs_coexist(tree):
    for status in (RunStatus.PASSED, RunStatus.FAILED, RunStatus.ERROR, RunStatus.CANCELLED, RunStatus.BLOCKED):
        run_for(tree.f1, status)
    running = run_for(tree.f1)
    ValidatorRun.objects.filter(pk=running.pk).update(status=RunStatus.PASSED)
    run_for(tree.f1)  # once the first finished, the next may run
    assert ValidatorRun.objects.filter(feature=tree.f1, status=RunStatus.RUNNING).count() == 1


def test_one_running_milestone_run(tree):
    make = lambda: ValidatorRun.objects.create(mission=tree.mission, milestone=tree.milestone, scope="milestone")  # noqa: E731
    make()
    assert_database_refuses(make)
    ValidatorRun.objects.create(mission=tree.mission, milestone=tree.milestone2, scope="milestone")


def test_fix_lineage_is_unique_per_source_and_run(tree):
    run = run_for(tree.f1, RunStatus.FAILED)
    fix = MissionFeature(
        slice=tree.slice, key="fix-f1", title="Fix: f1", generated_from=tree.f1, generated_from_run=run
    )
    fix.save()
    FixLineage.objects.create(root=tree.f1, source=tree.f1, fix=fix, run=run)
    other_fix = MissionFeature(slice=tree.slice, key="fix-f1-b", title="Fix again")
    other_fix.save()
    assert_database_refuses(lambda: FixLineage.objects.create(root=tree.f1, source=tree.f1, fix=other_fix, run=run))
    second_run = run_for(tree.f1, RunStatus.FAILED)
    FixLineage.objects.create(root=tree.f1, source=tree.f1, fix=other_fix, run=second_run)  # a new run: fine
    assert FixLineage.objects.count() == 2


def test_journal_positions_are_unique_per_run(tree):
    run = run_for(tree.f1)
    JournalEntry.objects.create(run=run, seq=1, kind="note", payload={}, sha256="a" * 64)
    assert_database_refuses(
        lambda: JournalEntry.objects.create(run=run, seq=1, kind="note", payload={}, sha256="b" * 64)
    )
    other = run_for(tree.f2)
    JournalEntry.objects.create(run=other, seq=1, kind="note", payload={}, sha256="c" * 64)
    assert JournalEntry.objects.count() == 2


# --------------------------------------------------------------------------- cascades


def _populate_loop_rows(t) -> None:
    run = run_for(t.f1, RunStatus.FAILED)
    MissionFeature.objects.filter(pk=t.f1.pk).update(last_run=run)
    ValidatorFailure.objects.create(
        run=run, feature=t.f1, assertion=t.a_linked, assertion_key=t.a_linked.key, message="m", expected="e", actual="a"
    )
    fix = MissionFeature(slice=t.slice, key="fix-f1", title="Fix: f1", generated_from=t.f1, generated_from_run=run)
    fix.save()
    lineage = FixLineage.objects.create(root=t.f1, source=t.f1, fix=fix, run=run)
    lineage.failed_assertions.set([t.a_linked])
    JournalEntry.objects.create(run=run, seq=1, kind="decision", payload={"verdict": "accepted"}, sha256="0" * 64)
    ValidatorRun.objects.create(mission=t.mission, milestone=t.milestone, scope="milestone", status=RunStatus.PASSED)


def _rows_of(mission_id: int) -> dict[str, int]:
    return {
        "milestones": Milestone.objects.filter(mission_id=mission_id).count(),
        "slices": Slice.objects.filter(mission_id=mission_id).count(),
        "features": MissionFeature.objects.filter(mission_id=mission_id).count(),
        "assertions": ContractAssertion.objects.filter(mission_id=mission_id).count(),
        "links": FeatureAssertion.objects.filter(feature__mission_id=mission_id).count(),
        "tasks": Task.objects.filter(mission_id=mission_id).count(),
        "events": MissionEvent.objects.filter(mission_id=mission_id).count(),
        "runs": ValidatorRun.objects.filter(mission_id=mission_id).count(),
        "failures": ValidatorFailure.objects.filter(run__mission_id=mission_id).count(),
        "lineage": FixLineage.objects.filter(run__mission_id=mission_id).count(),
        "journal": JournalEntry.objects.filter(run__mission_id=mission_id).count(),
    }


def test_deleting_a_mission_cascades_to_everything_below(tree, other_tree):
    for t in (tree, other_tree):
        _populate_loop_rows(t)
    before_other = _rows_of(other_tree.mission.pk)
    assert all(_rows_of(tree.mission.pk).values())
    lineage_links = FixLineage.failed_assertions.through.objects.count()

    pk = tree.mission.pk
    tree.mission.delete()

    assert set(_rows_of(pk).values()) == {0}
    assert FixLineage.failed_assertions.through.objects.count() == lineage_links // 2
    assert _rows_of(other_tree.mission.pk) == before_other  # the other mission is untouched


def test_deleting_a_mission_through_the_api_cascades(api, owner, tree):
    _populate_loop_rows(tree)
    pk = tree.mission.pk
    assert api(owner).delete(f"/api/missions/{pk}/").status_code == 204
    assert set(_rows_of(pk).values()) == {0}


def test_deleting_a_feature_cascades_to_its_runs_but_not_its_assertions(tree):
    _populate_loop_rows(tree)
    pk = tree.f1.pk
    assert ValidatorRun.objects.filter(feature_id=pk).exists()
    tree.f1.delete()
    assert not ValidatorRun.objects.filter(feature_id=pk).exists()
    assert not FixLineage.objects.exists() and not ValidatorFailure.objects.exists()
    assert JournalEntry.objects.count() == 0
    assert ValidatorRun.objects.filter(scope="milestone").count() == 1  # the milestone's run stays
    assert ContractAssertion.objects.filter(pk=tree.a_linked.pk).exists()
    assert not FeatureAssertion.objects.filter(assertion=tree.a_linked).exists()


def test_deleting_a_feature_with_a_running_task_needs_force(api, member, tree):
    Task.objects.filter(pk=tree.task.pk).update(status="in_progress")
    response = api(member).delete(f"/api/features/{tree.f1.pk}/")
    assert response.status_code == 409 and response.json()["code"] == "task_running"
    assert MissionFeature.objects.filter(pk=tree.f1.pk).exists() and Task.objects.filter(pk=tree.task.pk).exists()
    assert api(member).delete(f"/api/features/{tree.f1.pk}/?force=1").status_code == 204
    assert (
        not MissionFeature.objects.filter(pk=tree.f1.pk).exists() and not Task.objects.filter(pk=tree.task.pk).exists()
    )


# --------------------------------------------------------------------------- updated_at


@pytest.mark.parametrize("name", ["mission", "milestone", "slice", "f1", "a_linked", "task"])
def test_updated_at_changes_on_save(tree, name):
    obj = getattr(tree, name)
    past = timezone.now() - datetime.timedelta(hours=1)
    type(obj).objects.filter(pk=obj.pk).update(updated_at=past)
    obj.refresh_from_db()
    assert obj.updated_at == past
    created = obj.created_at
    obj.title = "changed"
    obj.save()
    obj.refresh_from_db()
    assert obj.updated_at > past and obj.updated_at > created - datetime.timedelta(seconds=1)
    assert obj.created_at == created
