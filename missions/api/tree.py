"""The mission tree in a constant number of queries, whatever the mission's size.

One query per level (milestones, slices, features, assertion links, assertions with
their link counts) plus the mission; rollups are computed in Python from those rows
with the same rule as `missions.services.rollup`.

The reads are separate statements (not one snapshot under PostgreSQL's read committed):
a row written between two of them may reference one the earlier read did not return.
Such rows are left out, never looked up, so the tree is always whole and self-consistent
(the next read shows them).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from django.db.models import QuerySet

from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionFeature,
    Slice,
)
from missions.selectors import rollup_state

# A `.values()` row the tree extends with its own keys (rollup, slices, features, ...):
# django-stubs types each row as a closed TypedDict of the selected fields.
Row = dict[str, Any]

FEATURE_FIELDS = (
    "id",
    "slice_id",
    "key",
    "title",
    "status",
    "loop_state",
    "implementation_attempts",
    "validator_attempts",
    "fix_rounds",
    "generated_from_id",
    "stop_reason",
    "last_run_id",
    "updated_at",
)


def _assertion_rows(mission: Mission) -> tuple[list[Row], dict[int, list[str]], set[int]]:
    assertions = cast(
        list[Row],
        list(
            ContractAssertion.objects.filter(mission=mission)
            .order_by("milestone_id", "order", "id")
            .values("id", "milestone_id", "key", "scope", "status")
        ),
    )
    keys = {a["id"]: a["key"] for a in assertions}
    by_feature: dict[int, list[str]] = defaultdict(list)
    linked: set[int] = set()
    for feature_id, assertion_id in (
        FeatureAssertion.objects.filter(feature__mission=mission)
        .order_by("assertion__order", "assertion_id")
        .values_list("feature_id", "assertion_id")
    ):
        # The links are a second read: an assertion created (and linked) since the first
        # is left out here too, so a feature lists only assertions its milestone shows.
        if assertion_id not in keys:
            continue
        by_feature[feature_id].append(keys[assertion_id])
        linked.add(assertion_id)
    return assertions, by_feature, linked


def _rollups(assertions: list[Row], linked: set[int]) -> dict[int, dict[str, Any]]:
    counts: dict[int, dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(("total", "passed", "failed", "blocked", "pending", "unlinked"), 0)
    )
    for a in assertions:
        c = counts[a["milestone_id"]]
        c["total"] += 1
        c[a["status"]] += 1
        if a["scope"] == AssertionScope.FEATURE and a["id"] not in linked:
            c["unlinked"] += 1
    return {mid: {"state": rollup_state(c), **c} for mid, c in counts.items()}


def mission_tree(*, mission: Mission) -> dict[str, Any]:
    assertions, keys_by_feature, linked = _assertion_rows(mission)
    rollups = _rollups(assertions, linked)
    empty = {
        "state": rollup_state({"total": 0}),
        "total": 0,
        "passed": 0,
        "failed": 0,
        "blocked": 0,
        "pending": 0,
        "unlinked": 0,
    }
    features_by_slice: dict[int, list[Row]] = defaultdict(list)
    for f in MissionFeature.objects.filter(mission=mission).order_by("slice_id", "order", "id").values(*FEATURE_FIELDS):
        f["assertions"] = keys_by_feature.get(f["id"], [])
        f["budget_left"] = max(mission.retry_budget - f["fix_rounds"], 0)
        features_by_slice[f.pop("slice_id")].append(f)
    slices_by_milestone: dict[int, list[Row]] = defaultdict(list)
    slices = (
        Slice.objects.filter(mission=mission)
        .order_by("milestone_id", "order", "id")
        .values("id", "milestone_id", "key", "title", "status", "activated_at")
    )
    for sl in cast("QuerySet[Slice, Row]", slices):
        sl["features"] = features_by_slice.get(sl["id"], [])
        slices_by_milestone[sl.pop("milestone_id")].append(sl)
    assertion_keys: dict[int, list[str]] = defaultdict(list)
    for a in assertions:
        assertion_keys[a["milestone_id"]].append(a["key"])
    milestones: list[Row] = []
    milestone_rows = (
        Milestone.objects.filter(mission=mission)
        .order_by("order", "id")
        .values("id", "key", "title", "status", "validation_state", "order")
    )
    for m in cast("QuerySet[Milestone, Row]", milestone_rows):
        m["rollup"] = rollups.get(m["id"], empty)
        m["assertions"] = assertion_keys.get(m["id"], [])
        m["slices"] = slices_by_milestone.get(m["id"], [])
        milestones.append(m)
    return {
        "id": mission.pk,
        "key": mission.key,
        "title": mission.title,
        "status": mission.status,
        "autopilot": mission.autopilot,
        "retry_budget": mission.retry_budget,
        "milestones": milestones,
    }
