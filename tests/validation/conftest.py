from __future__ import annotations

import pytest

from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice


@pytest.fixture
def build_mission(git_repo, alice):
    """A mission over `git_repo` with one feature per entry of `features`:
    {feature_key: [(assertion_key, check_or_None), ...]}."""

    def build(
        features: dict[str, list[tuple[str, dict | None]]],
        *,
        status="active",
        auto_fix=True,
        autopilot=False,
        retry_budget=3,
        validator="composite",
        workspace=None,
    ):
        mission = Mission.objects.create(
            key="m",
            title="Mission",
            status=status,
            auto_fix=auto_fix,
            autopilot=autopilot,
            retry_budget=retry_budget,
            validator=validator,
            owner=alice,
            repository=str(workspace or git_repo.path),
        )
        milestone = Milestone.objects.create(mission=mission, key="m1", title="Milestone 1")
        slice_ = Slice(milestone=milestone, key="s1", title="Slice 1")
        slice_.save()
        for i, (fkey, assertions) in enumerate(features.items()):
            feature = MissionFeature(
                slice=slice_, key=fkey, title=f"Feature {fkey}", description=f"Build {fkey}.", order=i
            )
            feature.save()
            for akey, check in assertions:
                assertion = ContractAssertion(
                    milestone=milestone, key=akey, title=f"{akey} holds", statement=f"{akey}", check_spec=check
                )
                assertion.save()
                feature.assertions.add(assertion)
        return mission

    return build
