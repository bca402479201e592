"""The showcase: the demo mission runs end to end to `complete` on a real worker,
including one fail -> fix -> pass round."""

from __future__ import annotations

import pytest

from missions.management.commands.demo import create_demo
from missions.models import MissionFeature
from validation.models import FixLineage, JournalEntry, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_mission_runs_to_complete(worker, tmp_path, alice):
    mission = create_demo(directory=tmp_path / "demo-repo", user=alice)
    worker.drain(timeout=240)
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    discount = MissionFeature.objects.get(mission=mission, key="discount")
    assert discount.loop_state == "passed"
    lineage = FixLineage.objects.get(source=discount)
    assert lineage.fix.loop_state == "passed" and lineage.fix.title == "Fix: Percentage discount"
    statuses = list(ValidatorRun.objects.filter(feature=discount).order_by("id").values_list("status", flat=True))
    assert statuses == ["failed", "passed"]
    assert set(mission.milestones.values_list("status", flat=True)) == {"complete"}
    assert set(mission.assertions.values_list("status", flat=True)) == {"passed"}
    # Its declared environment (the wheel the repository carries) was built once, then reused.
    notes = JournalEntry.objects.filter(run__mission=mission, kind="note", key="environment")
    assert notes.exists() and all(n.payload["ok"] for n in notes)
    assert [n.payload["reused"] for n in notes].count(False) == 1
