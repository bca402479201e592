"""Fixtures of the reliability suite: four kinds of users, one mission world with an
object of every kind the API serves (so every endpoint has something real to answer
about), a stranger's own mission, and a race helper (threads with their own database
connections, released together)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.authtoken.models import Token

from forges.models import Forge
from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    LoopState,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
    Task,
    TaskStatus,
)
from missions.outbox import publish_on_commit
from missions.services.rollup import milestone_rollup_refresh
from validation import journal
from validation.models import FixLineage, JournalEntry, Review, ReviewArtifact, ValidatorFailure, ValidatorRun

ROLES = ("anonymous", "member", "stranger", "staff")
REVIEW_PROFILE = {"candidates": ["test:c1", "test:c2", "test:c3"], "evaluator": "test:eval", "timeout": 60}
HELLO_CHECK = {"file": "hello.py", "contains": r"def hello\("}


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/reliability/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.reliability)


@pytest.fixture(autouse=True)
def _review_profiles(settings):
    settings.FUSION_REVIEW_PROFILES = {"default": dict(REVIEW_PROFILE)}


@pytest.fixture
def users(django_user_model):
    make = django_user_model.objects.create_user
    return SimpleNamespace(
        owner=make("owner"),
        member=make("member"),
        stranger=make("stranger"),
        staff=make("staff", is_staff=True, is_superuser=True),
    )


def user_of(users, role: str):
    return None if role == "anonymous" else getattr(users, role)


def token_of(user) -> str:
    return Token.objects.get_or_create(user=user)[0].key


def _run(feature: MissionFeature, status: str, *, revision: str, attempt: int) -> ValidatorRun:
    now = timezone.now()
    return ValidatorRun.objects.create(
        mission_id=feature.mission_id,
        feature=feature,
        milestone_id=feature.slice.milestone_id,
        status=status,
        trigger="task",
        implementation_attempt=1,
        validator_attempt=attempt,
        validator="composite",
        revision=revision,
        input_fingerprint=f"{attempt:064d}",
        summary=f"run {attempt}",
        completed_at=now,
        verdict={
            "status": "fail",
            "summary": "1 failed",
            "blocked_reason": "",
            "assertions": [
                {
                    "key": "VAL-1",
                    "verdict": "fail",
                    "message": "m",
                    "expected": "e",
                    "actual": "a",
                    "evidence": [{"kind": "other", "text": "t"}],
                }
            ],
        },
    )


def build_world(users, repo, *, key: str = "alpha") -> SimpleNamespace:
    """The member's mission (owned by `owner`, `member` is a member) with one object of
    every kind: milestones, a slice, features in several loop states, assertions (one
    with a check), tasks, failed runs with failures and a journal, a fix lineage, a
    review with artifacts and audit events. Also the stranger's own small mission."""
    revision = repo.git("rev-parse", "HEAD").strip()
    mission = Mission.objects.create(
        key=key,
        title="Alpha",
        owner=users.owner,
        status="active",
        auto_fix=False,
        repository=str(repo.path),
        executor_command="",
    )
    mission.members.set([users.member])
    Forge.objects.create(mission=mission, provider="github", repository="acme/alpha")
    m1 = Milestone.objects.create(mission=mission, key="m1", title="Milestone one", order=1)
    m2 = Milestone.objects.create(mission=mission, key="m2", title="Milestone two", order=2)
    s1 = Slice(milestone=m1, key="s1", title="Slice one")
    s1.save()
    s2 = Slice(milestone=m1, key="s2", title="Slice two (empty)")
    s2.save()
    f1 = MissionFeature(slice=s1, key="f1", title="Feature one", order=1, description="Say hello.")
    f1.save()
    f2 = MissionFeature(slice=s1, key="f2", title="Feature two", order=2)
    f2.save()
    f3 = MissionFeature(slice=s1, key="f3", title="Feature three", order=3)
    f3.save()
    a1 = ContractAssertion(
        milestone=m1,
        key="VAL-1",
        title="hello exists",
        statement="hello() exists",
        check_spec=dict(HELLO_CHECK),
        order=1,
    )
    a1.save()
    a2 = ContractAssertion(milestone=m1, key="VAL-2", title="Unlinked", statement="f2 works", order=2)
    a2.save()
    a3 = ContractAssertion(
        milestone=m1, key="VAL-M", title="Whole", statement="all works", scope=AssertionScope.MILESTONE, order=3
    )
    a3.save()
    FeatureAssertion.objects.create(feature=f1, assertion=a1)
    t1 = Task.objects.create(
        mission=mission,
        feature=f1,
        title="Implement f1",
        status=TaskStatus.DONE,
        revision=revision,
        finished_at=timezone.now(),
    )
    t2 = Task.objects.create(mission=mission, feature=f2, title="Implement f2")
    r0 = _run(f1, "failed", revision=revision, attempt=1)
    r1 = _run(f1, "failed", revision=revision, attempt=2)
    for run in (r0, r1):
        ValidatorFailure.objects.create(
            run=run,
            feature=f1,
            assertion=a1,
            assertion_key="VAL-1",
            message="m",
            expected="e",
            actual="a",
            evidence=[{"kind": "other", "text": "t"}],
        )
        journal.append(run_id=run.pk, kind="check", key="VAL-1", payload={"check": HELLO_CHECK, "result": "fail"})
        journal.append(run_id=run.pk, kind="decision", key="final", payload={"verdict": "accepted"})
    fx = MissionFeature(
        slice=s1, key="f1-fix-1", title="Fix: Feature one", order=4, generated_from=f1, generated_from_run=r0
    )
    fx.save()
    FeatureAssertion.objects.create(feature=fx, assertion=a1)
    lineage = FixLineage.objects.create(root=f1, source=f1, fix=fx, run=r0)
    lineage.failed_assertions.set([a1])
    MissionFeature.objects.filter(pk=f1.pk).update(
        loop_state=LoopState.NEEDS_FIX,
        status="in_progress",
        last_run=r1,
        implementation_attempts=1,
        validator_attempts=2,
        fix_rounds=1,
    )
    f1.refresh_from_db()
    event = publish_on_commit(mission, "mission:created", {"mission": mission.pk, "status": mission.status})
    from tests.review.support import request_body
    from validation.review.create import review_create

    review = review_create(body=request_body(mission=mission.pk), user=users.member).review
    milestone_rollup_refresh(milestone_ids=[m1.pk, m2.pk])

    theirs = Mission.objects.create(key=f"{key}-theirs", title="Theirs", owner=users.stranger)
    tm = Milestone.objects.create(mission=theirs, key="tm", title="Their milestone")
    ts = Slice(milestone=tm, key="ts", title="Their slice")
    ts.save()
    tf = MissionFeature(slice=ts, key="tf", title="Their feature")
    tf.save()
    return SimpleNamespace(
        mission=mission,
        m1=m1,
        m2=m2,
        s1=s1,
        s2=s2,
        f1=f1,
        f2=f2,
        f3=f3,
        fx=fx,
        a1=a1,
        a2=a2,
        a3=a3,
        t1=t1,
        t2=t2,
        r0=r0,
        r1=r1,
        lineage=lineage,
        event=event,
        review=review,
        revision=revision,
        repo=repo,
        failure=ValidatorFailure.objects.filter(run=r1).first(),
        theirs=theirs,
        their_feature=tf,
    )


WORLD_MODELS = (
    Mission,
    Milestone,
    Slice,
    MissionFeature,
    ContractAssertion,
    FeatureAssertion,
    Task,
    MissionEvent,
    ValidatorRun,
    ValidatorFailure,
    FixLineage,
    JournalEntry,
    Review,
    ReviewArtifact,
)


def mission_rows(mission_id: int) -> dict[str, list]:
    """Every row that belongs to one mission, with its `updated_at` where it has one: a
    write of any kind (insert, update, delete) to the mission changes this value."""
    out: dict[str, list] = {}
    for model in WORLD_MODELS:
        if model is Mission:
            qs = model.objects.filter(pk=mission_id)
        elif model is FeatureAssertion:
            qs = model.objects.filter(feature__mission_id=mission_id)
        elif model in (ValidatorFailure, JournalEntry):
            qs = model.objects.filter(run__mission_id=mission_id)
        elif model is FixLineage:
            qs = model.objects.filter(root__mission_id=mission_id)
        elif model is ReviewArtifact:
            qs = model.objects.filter(review__mission_id=mission_id)
        else:
            qs = model.objects.filter(mission_id=mission_id)
        fields = ["pk"] + (["updated_at"] if any(f.name == "updated_at" for f in model._meta.fields) else [])
        out[model.__name__] = sorted(qs.values_list(*fields))
    out["members"] = sorted(Mission.objects.get(pk=mission_id).members.values_list("pk", flat=True))
    return out


@pytest.fixture
def world(users, git_repo):
    git_repo.commit({"hello.py": "def hello():\n    return 'hi'\n"}, "hello")
    return build_world(users, git_repo)


def race(*fns, timeout: float = 120) -> list:
    """Run every callable in its own thread (its own database connection), all released
    at once by a barrier; their results in order, or the exception raised in its place."""
    barrier = threading.Barrier(len(fns))
    results: list = [None] * len(fns)

    def go(i, fn):
        try:
            barrier.wait(timeout=timeout)
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 — reported to the test as a value
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i, fn), name=f"racer-{i}") for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a racer hung (a lock never released?)"
    return results


@pytest.fixture
def build_mission(git_repo, alice):
    """A mission over `git_repo` with one feature per entry of `features`:
    {feature_key: [(assertion_key, check_or_None), ...]} (as in tests/validation)."""

    def build(
        features: dict,
        *,
        status="active",
        auto_fix=True,
        autopilot=False,
        retry_budget=3,
        validator="composite",
        key="m",
    ):
        mission = Mission.objects.create(
            key=key,
            title="Mission",
            status=status,
            auto_fix=auto_fix,
            autopilot=autopilot,
            retry_budget=retry_budget,
            validator=validator,
            owner=alice,
            repository=str(git_repo.path),
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
                    milestone=milestone, key=akey, title=f"{akey} holds", statement=akey, check_spec=check
                )
                assertion.save()
                feature.assertions.add(assertion)
        return mission

    return build
