"""Fixtures for the missions tests: four kinds of users, an API client factory and
small mission trees built with the ORM (so the API under test builds none of them)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Slice,
    Task,
)
from missions.outbox import publish_on_commit
from missions.services.rollup import milestone_rollup_refresh
from validation.models import FixLineage, JournalEntry, ValidatorFailure, ValidatorRun


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("staff", is_staff=True)


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user("owner")


@pytest.fixture
def member(django_user_model):
    return django_user_model.objects.create_user("member")


@pytest.fixture
def stranger(django_user_model):
    return django_user_model.objects.create_user("stranger")


@pytest.fixture
def api():
    """`api(user)` -> an APIClient authenticated as `user`; `api(None)` -> anonymous."""

    def make(user=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make


@pytest.fixture
def make_tree():
    """`make_tree(owner, key, members=())` -> a namespace with one mission:

    milestone m1 (slice s1: features f1, f2) and milestone m2 (empty); assertions of m1:
    VAL-001 linked to f1, VAL-002 feature-scoped and unlinked, VAL-M01 milestone-scoped;
    one task for f1 and one audit event. Stored rollups are refreshed.
    """

    def make(owner_user, key: str, members=()) -> SimpleNamespace:
        mission = Mission.objects.create(key=key, title=f"Mission {key}", owner=owner_user)
        mission.members.set(members)
        milestone = Milestone.objects.create(mission=mission, key="m1", title="Milestone one", order=1)
        milestone2 = Milestone.objects.create(mission=mission, key="m2", title="Milestone two", order=2)
        slice_ = Slice(milestone=milestone, key="s1", title="Slice one")
        slice_.save()
        f1 = MissionFeature(slice=slice_, key="f1", title="Feature one", order=1)
        f1.save()
        f2 = MissionFeature(slice=slice_, key="f2", title="Feature two", order=2)
        f2.save()
        a_linked = ContractAssertion(milestone=milestone, key="VAL-001", title="Linked", statement="f1 works", order=1)
        a_linked.save()
        a_unlinked = ContractAssertion(
            milestone=milestone, key="VAL-002", title="Unlinked", statement="f2 works", order=2
        )
        a_unlinked.save()
        a_milestone = ContractAssertion(
            milestone=milestone,
            key="VAL-M01",
            title="Whole",
            statement="all works",
            scope=AssertionScope.MILESTONE,
            order=3,
        )
        a_milestone.save()
        FeatureAssertion.objects.create(feature=f1, assertion=a_linked)
        task = Task.objects.create(mission=mission, feature=f1, title="Implement f1")
        event = publish_on_commit(mission, "mission:created", {"mission": mission.pk, "status": mission.status})
        milestone_rollup_refresh(milestone_ids=[milestone.pk, milestone2.pk])
        milestone.refresh_from_db()
        return SimpleNamespace(
            mission=mission,
            milestone=milestone,
            milestone2=milestone2,
            slice=slice_,
            f1=f1,
            f2=f2,
            a_linked=a_linked,
            a_unlinked=a_unlinked,
            a_milestone=a_milestone,
            task=task,
            event=event,
        )

    return make


@pytest.fixture
def tree(make_tree, owner, member):
    """The mission under test: owned by `owner`, `member` is a member."""
    return make_tree(owner, "alpha", members=[member])


@pytest.fixture
def other_tree(make_tree, stranger):
    """A mission of `stranger` that owner and member cannot see."""
    return make_tree(stranger, "beta")


COUNTED = (
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
)


@pytest.fixture
def counts():
    """`counts()` -> {model name: row count} for every table an API write could touch."""

    def snapshot() -> dict[str, int]:
        return {model.__name__: model.objects.count() for model in COUNTED}

    return snapshot
