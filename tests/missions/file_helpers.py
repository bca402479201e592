"""What the mission-file tests share: a sample file, a mission's rows as a comparable
snapshot (for "nothing changed"), a feature's links and the errors an invalid file reports."""

from __future__ import annotations

import pytest
import yaml

from missions.errors import Invalid
from missions.models import (
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
)
from missions.services.files import mission_import

SAMPLE = """\
mission: {key: shop, title: Shop checkout, status: active, repository: "https://git.example.com/shop.git",
          validator: composite, executor: manual, autopilot: true, auto_fix: true, retry_budget: 3}
milestones:
  - key: m1
    title: Cart
    description: |
      Everything about the cart.
      Second line — with unicode.
    assertions:
      - {key: VAL-CART-001, title: Empty cart total is zero,
         statement: "cart_total([]) == 0", check: {run: "pytest -q tests/test_cart.py::test_empty"}}
      - {key: VAL-CART-002, title: Totals add up, statement: "cart_total([1, 2]) == 3"}
      - {key: VAL-CART-M, title: Cart page loads, statement: "GET /cart answers 200", scope: milestone}
    slices:
      - key: s1
        title: Totals
        features:
          - {key: cart-total, title: Cart total, description: "sum of lines", assertions: [VAL-CART-001]}
          - {key: cart-sum, title: Cart sum, acceptance_criteria: "adds up", assertions: [VAL-CART-002, VAL-CART-001]}
  - key: m2
    title: Payment
    dependencies: [m1]
    assertions:
      - {key: VAL-PAY-001, title: Card is charged once, statement: "one charge per order"}
    slices:
      - key: s2
        title: Charge
        features:
          - {key: charge, title: Charge card, assertions: [VAL-PAY-001, VAL-CART-002]}
"""


def sample() -> dict:
    return yaml.safe_load(SAMPLE)


def snapshot(mission_key: str = "shop") -> dict:
    """Every row's updated_at, plus the link and dependency rows, for "nothing changed" checks."""
    mission = Mission.objects.get(key=mission_key)
    rows = {("mission", mission.pk): mission.updated_at}
    for model in (Milestone, Slice, MissionFeature, ContractAssertion):
        rows.update(
            {
                (model.__name__, pk): at
                for pk, at in model.objects.filter(mission=mission).values_list("pk", "updated_at")
            }
        )
    rows["links"] = sorted(FeatureAssertion.objects.filter(feature__mission=mission).values_list("pk", "updated_at"))
    rows["deps"] = sorted(
        Milestone.dependencies.through.objects.filter(from_milestone__mission=mission).values_list("pk", flat=True)
    )
    rows["events"] = MissionEvent.objects.filter(mission=mission).count()
    return rows


def links(feature_key: str) -> list[str]:
    return sorted(FeatureAssertion.objects.filter(feature__key=feature_key).values_list("assertion__key", flat=True))


def invalid_errors(document, **kwargs) -> list[str]:
    with pytest.raises(Invalid) as info:
        mission_import(document=document, **kwargs)
    assert info.value.code == "invalid_mission_file"
    return info.value.fields["errors"]


def mark_passed(feature: MissionFeature) -> None:
    """The feature passed, judged by a run over its current contract (as a verdict leaves it)."""
    from validation.models import RunStatus, ValidatorRun
    from validation.services.run_input import feature_assertion_specs

    run = ValidatorRun.objects.create(
        mission_id=feature.mission_id,
        feature=feature,
        milestone_id=feature.slice.milestone_id,
        status=RunStatus.PASSED,
        assertions=feature_assertion_specs(feature),
    )
    MissionFeature.objects.filter(pk=feature.pk).update(loop_state="passed", last_run=run)
