"""A mission over a real git repository that follows a repository on the local forge
(`tests/support/forge.py`), and the steps of the loop driven by hand or by a worker."""

from __future__ import annotations

import pytest

from forges.models import Forge, PullRequest
from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice
from tests.support.forge import fake_forge  # noqa: F401 — fixture

GREETING = {"file": "hello.py", "contains": r"def hello\("}
POLITE = {"file": "hello.py", "contains": "please"}
GOOD = {"hello.py": "def hello():\n    return 'hi, please'\n"}
RUDE = {"hello.py": "def hello():\n    return 'hi'\n"}
BAD = {"hello.py": "def goodbye():\n    pass\n"}


@pytest.fixture
def forge_mission(git_repo, alice, fake_forge):  # noqa: F811 — the fixture imported above
    """A mission with one feature `hello` (assertions GREET and POLITE, checked on files)
    following `acme/shop` on the local forge as `provider`."""

    def build(*, provider: str = "github", auto_fix: bool = False, **forge_fields) -> Forge:
        mission = Mission.objects.create(
            key="m",
            title="Mission",
            status="active",
            auto_fix=auto_fix,
            autopilot=False,
            retry_budget=3,
            validator="composite",
            owner=alice,
            repository=str(git_repo.path),
        )
        milestone = Milestone.objects.create(mission=mission, key="m1", title="Milestone 1")
        slice_ = Slice(milestone=milestone, key="s1", title="Slice 1")
        slice_.save()
        feature = MissionFeature(slice=slice_, key="hello", title="Say hello", description="Build hello.", order=0)
        feature.save()
        for key, check in (("GREET", GREETING), ("POLITE", POLITE)):
            assertion = ContractAssertion(
                milestone=milestone, key=key, title=f"{key.lower()} holds", statement=key, check_spec=check
            )
            assertion.save()
            feature.assertions.add(assertion)
        fields = {"api_url": fake_forge.api_url(provider), "repository": "acme/shop", **forge_fields}
        return Forge.objects.create(mission=mission, provider=provider, **fields)

    return build


def follow_pull(forge: Forge, number: int = 7, *, head: str = "") -> PullRequest:
    feature = MissionFeature.objects.get(mission=forge.mission, key="hello")
    return PullRequest.objects.create(
        forge=forge, number=number, feature=feature, branch="hello", title="[hello] say hello", head=head
    )
