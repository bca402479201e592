"""A mission over a real git repository that follows a repository on the local forge
(`tests/support/forge.py`), and the steps of the loop driven by hand or by a worker."""

from __future__ import annotations

import pytest

from forges.models import Forge, PullRequest
from missions.models import MissionFeature
from tests.support.forge import fake_forge  # noqa: F401 — fixture
from tests.validation.conftest import build_mission  # noqa: F401 — fixture

GREETING = {"file": "hello.py", "contains": r"def hello\("}
POLITE = {"file": "hello.py", "contains": "please"}
GOOD = {"hello.py": "def hello():\n    return 'hi, please'\n"}
RUDE = {"hello.py": "def hello():\n    return 'hi'\n"}
BAD = {"hello.py": "def goodbye():\n    pass\n"}


@pytest.fixture
def forge_mission(build_mission, fake_forge):  # noqa: F811 — the fixtures imported above
    """A mission with one feature `hello` (assertions GREET and POLITE, checked on files)
    following `acme/shop` on the local forge as `provider`."""

    def build(*, provider: str = "github", auto_fix: bool = False, **forge_fields) -> Forge:
        mission = build_mission({"hello": [("GREET", GREETING), ("POLITE", POLITE)]}, auto_fix=auto_fix)
        fields = {"api_url": fake_forge.api_url(provider), "repository": "acme/shop", **forge_fields}
        return Forge.objects.create(mission=mission, provider=provider, **fields)

    return build


def follow_pull(forge: Forge, number: int = 7, *, head: str = "") -> PullRequest:
    feature = MissionFeature.objects.get(mission=forge.mission, key="hello")
    return PullRequest.objects.create(
        forge=forge, number=number, feature=feature, branch="hello", title="[hello] say hello", head=head
    )
