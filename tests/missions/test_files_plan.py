"""Plan and apply a mission file (`missions/services/files/planning.py`): a dry run says what
the import would create, change or refuse and writes nothing; an apply imports exactly the
file a plan answered, against the state it answered it for."""

from __future__ import annotations

import pytest
import yaml

from missions.errors import Conflict, NotFound
from missions.models import (
    ContractAssertion,
    LoopState,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
)
from missions.services.files import mission_import
from missions.services.files.planning import mission_apply, mission_plan
from tests.missions.file_helpers import SAMPLE, sample

pytestmark = pytest.mark.django_db


def _rows() -> dict[str, int]:
    return {
        m.__name__: m.objects.count()
        for m in (Mission, Milestone, Slice, MissionFeature, ContractAssertion, MissionEvent)
    }


def _no_checks(data: dict) -> dict:
    for m in data["milestones"]:
        for a in m["assertions"]:
            a.pop("check", None)
    return data


def _keys(items: list[dict]) -> list[tuple[str, str]]:
    return [(i["kind"], i["key"]) for i in items]


def test_a_dry_run_from_nothing_lists_what_it_would_create_and_writes_nothing(owner, django_capture_on_commit_callbacks):
    before = _rows()
    with django_capture_on_commit_callbacks() as callbacks:
        plan = mission_plan(document=SAMPLE, user=None)
    assert _rows() == before and callbacks == []
    assert plan.applicable and plan.changed == [] and plan.unchanged == [] and plan.refused == []
    assert _keys(plan.created)[:4] == [
        ("mission", "shop"),
        ("milestone", "m1"),
        ("assertion", "VAL-CART-001"),
        ("assertion", "VAL-CART-002"),
    ]
    assert {"kind": "feature", "key": "cart-sum", "path": "milestones[0].slices[0].features[1]"} in plan.created
    assert len(plan.created) == 1 + 2 + 4 + 2 + 3
    assert plan.plan_hash.startswith(plan.state_version + ":")
