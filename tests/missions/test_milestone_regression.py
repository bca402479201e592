"""Milestone validation: a regression introduced by a later feature, and a failing
milestone-scoped assertion, each come back as fix features; the milestone completes only
when a milestone run passes."""

from __future__ import annotations

import sys

import pytest

from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice
from missions.services.lifecycle import mission_activate
from validation.models import FixLineage, RunScope, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)

IMPLEMENTER = """
import os, pathlib
key = os.environ["FUSION_FEATURE_KEY"]
changes = {
    "a": {"a.txt": "A1"},
    "b": {"b.txt": "B", "a.txt": "broken by b"},   # b regresses a's contract
    "a-fix-1": {"a.txt": "A1"},
    "c": {"c.txt": "C"},
    "c-fix-1": {"README.md": "# shop\\n"},
}
for rel, text in changes[key].items():
    pathlib.Path(rel).write_text(text)
"""


def _mission(tmp_path, git_repo, alice, key):
    script = tmp_path / "impl.py"
    script.write_text(IMPLEMENTER)
    return Mission.objects.create(
        key=key,
        title=key,
        owner=alice,
        repository=str(git_repo.path),
        autopilot=True,
        executor="command",
        executor_command=f"{sys.executable} {script}",
    )


def _feature(slice_, key, assertion):
    feature = MissionFeature(slice=slice_, key=key, title=key)
    feature.save()
    feature.assertions.add(assertion)
    return feature


def test_regression_by_a_later_feature_is_caught_and_fixed(worker, git_repo, alice, tmp_path):
    mission = _mission(tmp_path, git_repo, alice, "reg")
    milestone = Milestone.objects.create(mission=mission, key="m1", title="M1")
    slice_ = Slice(milestone=milestone, key="s1", title="S1")
    slice_.save()
    val_a = ContractAssertion(
        milestone=milestone,
        key="VAL-A",
        title="a",
        statement="a.txt says A1",
        check_spec={"file": "a.txt", "contains": "^A1$"},
    )
    val_b = ContractAssertion(
        milestone=milestone,
        key="VAL-B",
        title="b",
        statement="b.txt exists",
        check_spec={"file": "b.txt", "exists": True},
    )
    val_a.save()
    val_b.save()
    a = _feature(slice_, "a", val_a)
    _feature(slice_, "b", val_b)
    mission_activate(mission=mission, user=alice)
    worker.drain(timeout=120)
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    runs = list(ValidatorRun.objects.filter(milestone=milestone, scope=RunScope.MILESTONE).order_by("id"))
    assert [r.status for r in runs] == ["failed", "passed"]
    assert list(runs[0].failures.values_list("assertion_key", flat=True)) == ["VAL-A"]
    lineage = FixLineage.objects.get(run=runs[0])
    assert lineage.source == a and lineage.fix.key == "a-fix-1" and lineage.fix.loop_state == "passed"
    a.refresh_from_db()
    assert a.loop_state == "passed" and a.fix_rounds == 1
    assert list(ValidatorRun.objects.filter(feature=a).order_by("id").values_list("status", "trigger")) == [
        ("passed", "task"),
        ("passed", "fix"),
    ]
    assert Milestone.objects.get(pk=milestone.pk).status == "complete"


def test_failing_milestone_scoped_assertion_sends_a_fix_to_the_last_feature(worker, git_repo, alice, tmp_path):
    mission = _mission(tmp_path, git_repo, alice, "mscope")
    milestone = Milestone.objects.create(mission=mission, key="m1", title="M1")
    slice_ = Slice(milestone=milestone, key="s1", title="S1")
    slice_.save()
    val_c = ContractAssertion(
        milestone=milestone,
        key="VAL-C",
        title="c",
        statement="c.txt exists",
        check_spec={"file": "c.txt", "exists": True},
    )
    val_c.save()
    ContractAssertion(
        milestone=milestone,
        key="VAL-M",
        title="readme",
        statement="README names the shop",
        scope="milestone",
        check_spec={"file": "README.md", "contains": "shop"},
    ).save()
    c = _feature(slice_, "c", val_c)
    mission_activate(mission=mission, user=alice)
    worker.drain(timeout=120)
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    fix = MissionFeature.objects.get(generated_from=c)
    assert fix.key == "c-fix-1" and "VAL-M" in fix.description
    assert list(fix.assertions.values_list("key", flat=True)) == ["VAL-C"]  # judged by its source's own contract
    statuses = list(
        ValidatorRun.objects.filter(milestone=milestone, scope=RunScope.MILESTONE)
        .order_by("id")
        .values_list("status", flat=True)
    )
    assert statuses == ["failed", "passed"]
