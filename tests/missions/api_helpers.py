"""What the API tests share: a tree's rows as a comparable snapshot (a refused write
leaves it unchanged) and a small mission file."""

from __future__ import annotations

from typing import Any

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


def snapshot_tree(t) -> dict[str, Any]:
    """Every row of a tree with its title and updated_at, plus links and dependencies."""
    out: dict[str, Any] = {}
    for model in (Mission, Milestone, Slice, MissionFeature, ContractAssertion, Task):
        path = "pk" if model is Mission else "mission"
        out[model.__name__] = sorted(
            model.objects.filter(**{path: t.mission.pk}).values_list("pk", "title", "updated_at")
        )
    out["links"] = sorted(
        FeatureAssertion.objects.filter(feature__mission=t.mission).values_list("feature_id", "assertion_id")
    )
    out["deps"] = sorted(
        Milestone.dependencies.through.objects.filter(from_milestone__mission=t.mission).values_list(
            "from_milestone_id", "to_milestone_id"
        )
    )
    out["checks"] = sorted(ContractAssertion.objects.filter(mission=t.mission).values_list("pk", "check_spec"))
    out["executor_command"] = Mission.objects.get(pk=t.mission.pk).executor_command
    out["members"] = sorted(t.mission.members.values_list("pk", flat=True))
    out["events"] = MissionEvent.objects.filter(mission=t.mission).count()
    return out


MISSION_FILE = """\
mission: {key: shop, title: Shop checkout, validator: composite, executor: manual, retry_budget: 2}
milestones:
  - key: m1
    title: Cart
    assertions:
      - {key: VAL-CART-001, title: Empty cart total is zero, statement: "cart_total([]) == 0"}
      - {key: VAL-CART-002, title: Totals add up, statement: "cart_total([1, 2]) == 3"}
    slices:
      - key: s1
        title: Totals
        features:
          - {key: cart-total, title: Cart total, description: "sum", assertions: [VAL-CART-001, VAL-CART-002]}
"""
