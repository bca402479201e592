"""Reads. Every query that depends on who asks goes through `visible_missions`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db.models import Count, Q, QuerySet

from missions.models import (
    AssertionScope,
    AssertionStatus,
    ContractAssertion,
    Mission,
    MissionFeature,
    RollupState,
    Task,
    TaskStatus,
)


def visible_missions(*, user: AbstractUser | AnonymousUser | None) -> QuerySet[Mission]:
    if user is None or not user.is_authenticated:
        return Mission.objects.none()
    if user.is_staff:
        return Mission.objects.all()
    return Mission.objects.filter(Q(owner=user) | Q(members=user)).distinct()


def visible_mission_ids(*, user) -> QuerySet:
    if user is not None and user.is_authenticated and user.is_staff:
        return Mission.objects.values("id")
    return visible_missions(user=user).values("id")


def can_see_mission(*, user, mission_id: int) -> bool:
    return visible_missions(user=user).filter(pk=mission_id).exists()


# --- milestone rollup (README.md, "Rollup"): precedence not_started > failed > blocked >
# needs_coverage > passed > ready.


def rollup_counts(*, milestone_id: int) -> dict[str, int]:
    qs = ContractAssertion.objects.filter(milestone_id=milestone_id)
    return qs.aggregate(
        total=Count("id", distinct=True),
        passed=Count("id", filter=Q(status=AssertionStatus.PASSED), distinct=True),
        failed=Count("id", filter=Q(status=AssertionStatus.FAILED), distinct=True),
        blocked=Count("id", filter=Q(status=AssertionStatus.BLOCKED), distinct=True),
        pending=Count("id", filter=Q(status=AssertionStatus.PENDING), distinct=True),
        unlinked=Count("id", filter=Q(scope=AssertionScope.FEATURE, feature_links__isnull=True), distinct=True),
    )


def rollup_state(counts: dict[str, int]) -> str:
    if counts["total"] == 0:
        return RollupState.NOT_STARTED
    if counts["failed"]:
        return RollupState.FAILED
    if counts["blocked"]:
        return RollupState.BLOCKED
    if counts["unlinked"]:
        return RollupState.NEEDS_COVERAGE
    if counts["passed"] == counts["total"]:
        return RollupState.PASSED
    return RollupState.READY


def milestone_rollup(*, milestone_id: int) -> dict[str, Any]:
    counts = rollup_counts(milestone_id=milestone_id)
    return {"milestone": milestone_id, "state": rollup_state(counts), **counts}


def done_tasks(*, features: MissionFeature | Iterable[MissionFeature]) -> QuerySet[Task]:
    """The tasks that landed on a feature (or on any of `features`), the last one first:
    done, by when they finished. `.first()` is `latest_done_task`; a caller that needs a
    few of its fields asks for just those (`values_list`)."""
    one = isinstance(features, MissionFeature)
    qs = Task.objects.filter(**({"feature": features} if one else {"feature__in": features}))
    return qs.filter(status=TaskStatus.DONE).exclude(revision="").order_by("-finished_at", "-id")


def latest_done_task(*, features: MissionFeature | Iterable[MissionFeature]) -> Task | None:
    """The task that landed last on a feature (or on any of `features`): the newest done
    one, by when it finished. Every "what was implemented last" question asks this."""
    return done_tasks(features=features).first()
