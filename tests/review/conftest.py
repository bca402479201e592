from __future__ import annotations

import pytest

from missions.models import ContractAssertion, Milestone, Mission, MissionEvent, MissionFeature, Slice
from tests.review.support import Evaluator, Reviewer, candidate_answer, finding
from validation.review import llm

PROFILE = {"candidates": ["test:c1", "test:c2", "test:c3"], "evaluator": "test:eval", "timeout": 60}


@pytest.fixture(autouse=True)
def review_profiles(settings):
    settings.FUSION_REVIEW_PROFILES = {"default": dict(PROFILE)}
    return settings


@pytest.fixture
def models():
    """`models(c1=Reviewer(...), ..., eval=Evaluator(...))` registers the four test models."""
    registered: list[str] = []

    def register(**bodies):
        for name, body in bodies.items():
            llm.TEST_MODELS[f"test:{name}"] = body.model()
            registered.append(f"test:{name}")
        return bodies

    yield register
    for name in registered:
        llm.TEST_MODELS.pop(name, None)


@pytest.fixture
def standard(models):
    """Three valid reviewers (two agree on app.py:1) and a correct evaluator."""
    bodies = dict(
        c1=Reviewer(
            candidate_answer(
                [finding("hello() returns the wrong word", location="app.py:1")], verified=["hello() exists"]
            )
        ),
        c2=Reviewer(
            candidate_answer(
                [
                    finding("Wrong greeting text", location="app.py:1", severity="critical"),
                    finding("No test for hello()", location="tests/", severity="minor"),
                ]
            )
        ),
        c3=Reviewer(candidate_answer([], verified=["hello() exists"], limitations=["Did not run the app."])),
        eval=Evaluator(),
    )
    return models(**bodies)


@pytest.fixture
def mission(git_repo, alice):
    git_repo.commit({"app.py": "def hello():\n    return 'hello'\n"}, "add hello")
    mission = Mission.objects.create(
        key="shop", title="Shop", status="active", owner=alice, repository=str(git_repo.path)
    )
    milestone = Milestone.objects.create(mission=mission, key="m1", title="Milestone 1")
    slice_ = Slice(milestone=milestone, key="s1", title="Slice 1")
    slice_.save()
    feature = MissionFeature(slice=slice_, key="greet", title="Greeting", description="Say hi.")
    feature.save()
    assertion = ContractAssertion(
        milestone=milestone, key="VAL-GREET-001", title="hello says hi", statement="hello() returns 'hi'"
    )
    assertion.save()
    feature.assertions.add(assertion)
    mission.repo = git_repo
    mission.feature = feature
    return mission


def progress_events(mission_id: int) -> list[dict]:
    qs = MissionEvent.objects.filter(mission_id=mission_id, type="review:progress").order_by("seq")
    return [e.payload for e in qs]


def event_names(mission_id: int) -> list[str]:
    return [p["event"] if p["event"] != "state" else f"state:{p['state']}" for p in progress_events(mission_id)]
