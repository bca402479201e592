"""Reads. Every query that depends on who asks goes through `visible_missions`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db.models import Q, QuerySet

from missions import fastpaths
from missions.fastpaths import ROLLUP_COUNTS
from missions.models import (
    Mission,
    MissionFeature,
    RollupState,
    Task,
    TaskStatus,
)


def _sees(user: AbstractUser | AnonymousUser | None) -> tuple[str, int]:
    """The one visibility rule: ("all", 0) for staff, ("none", 0) for nobody signed in,
    ("members", user id): the missions the user owns or is a member of (`_members_missions`)."""
    if user is None or not user.is_authenticated:
        return "none", 0
    return ("all", 0) if user.is_staff else ("members", int(user.pk))


def visible_missions(*, user: AbstractUser | AnonymousUser | None) -> QuerySet[Mission]:
    sees, user_id = _sees(user)
    if sees == "none":
        return Mission.objects.none()
    if sees == "all":
        return Mission.objects.all()
    return _members_missions(user_id).distinct()


def _members_missions(user_id: int) -> QuerySet[Mission]:
    """The missions a user who is not staff sees: those they own or are a member of."""
    return Mission.objects.filter(Q(owner_id=user_id) | Q(members=user_id))


def visible_task_with_mission(*, user: AbstractUser | AnonymousUser | None, pk: Any) -> Task | None:
    """The task `pk` (an id, or the URL's text of one) with its mission, or None when the
    user may not see it or it does not exist."""
    try:
        task_id = int(pk)
    except (TypeError, ValueError):
        return None
    sees, user_id = _sees(user)
    if not 0 < task_id < 2**63 or sees == "none":  # no such row (nor one the database could bind)
        return None
    # Every completion through the API reads one: a fast path (`missions.fastpaths`).
    return fastpaths.task_with_mission(task_id=task_id, user_id=None if sees == "all" else user_id)


def visible_mission_ids(*, user) -> QuerySet:
    if user is not None and user.is_authenticated and user.is_staff:
        return Mission.objects.values("id")
    return visible_missions(user=user).values("id")


def can_see_mission(*, user, mission_id: int) -> bool:
    return visible_missions(user=user).filter(pk=mission_id).exists()


# --- milestone rollup (docs/TRUTH.md): precedence not_started > failed > blocked >
# needs_coverage > passed > ready.


def rollup_counts(*, milestone_id: int) -> dict[str, int]:
    """The counts of a milestone's assertions (`ROLLUP_COUNTS`; `unlinked`: feature-scoped
    and linked to no feature); all zero for a milestone that does not exist."""
    found = fastpaths.milestone_rollup_row(milestone_id=milestone_id)
    return found[0] if found else dict.fromkeys(ROLLUP_COUNTS, 0)


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


def milestone_rollup_and_stored(*, milestone_id: int) -> tuple[dict[str, Any], tuple[int, str]] | None:
    """`milestone_rollup` and the milestone's (mission id, stored rollup state), read
    together; None: no such milestone."""
    found = fastpaths.milestone_rollup_row(milestone_id=milestone_id)
    if found is None:
        return None
    counts, stored = found
    return {"milestone": milestone_id, "state": rollup_state(counts), **counts}, stored


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
