"""Reads. Every query that depends on who asks goes through `visible_missions`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db import connections
from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from fusion_site.runtime import fast_paths
from missions import fastpaths
from missions.models import (
    AssertionScope,
    AssertionStatus,
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionFeature,
    RollupState,
    Task,
    TaskStatus,
    column,
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


ROLLUP_COUNTS = ("total", "passed", "failed", "blocked", "pending", "unlinked")


def rollup_counts(*, milestone_id: int) -> dict[str, int]:
    """The counts of a milestone's assertions (`ROLLUP_COUNTS`; `unlinked`: feature-scoped
    and linked to no feature); all zero for a milestone that does not exist."""
    found = _rollup_row(milestone_id)
    return found[0] if found else dict.fromkeys(ROLLUP_COUNTS, 0)


def _rollup_row(milestone_id: int) -> tuple[dict[str, int], tuple[int, str]] | None:
    """The counts of `rollup_counts` and the milestone's (mission id, stored rollup state),
    in one statement written out: every verdict recomputes them, and the ORM took five
    times as long to build this aggregate as to run it. None: no such milestone."""
    if not fast_paths.on():
        return _rollup_row_plain(milestone_id)
    connection = connections[ContractAssertion.objects.db]
    quote = connection.ops.quote_name
    table, links, milestones = (quote(m._meta.db_table) for m in (ContractAssertion, FeatureAssertion, Milestone))
    status, scope, pk, milestone = (quote(column(ContractAssertion, f)) for f in ("status", "scope", "id", "milestone"))
    mission, state, milestone_pk = (quote(column(Milestone, f)) for f in ("mission", "validation_state", "id"))
    link_to = quote(column(FeatureAssertion, "assertion"))
    linked = f"EXISTS (SELECT 1 FROM {links} l WHERE l.{link_to} = a.{pk})"
    sql = (
        f"SELECT COUNT(a.{pk}), "
        + ", ".join(f"SUM(CASE WHEN a.{status} = %s THEN 1 ELSE 0 END)" for _ in range(4))
        + f", SUM(CASE WHEN a.{scope} = %s AND NOT {linked} THEN 1 ELSE 0 END), m.{mission}, m.{state}"
        f" FROM {milestones} m LEFT JOIN {table} a ON a.{milestone} = m.{milestone_pk}"
        f" WHERE m.{milestone_pk} = %s GROUP BY m.{milestone_pk}, m.{mission}, m.{state}"
    )
    S = AssertionStatus
    with connection.cursor() as cursor:
        cursor.execute(sql, [S.PASSED, S.FAILED, S.BLOCKED, S.PENDING, AssertionScope.FEATURE, milestone_id])
        row = cursor.fetchone()
    if row is None:
        return None
    counts = {name: int(value or 0) for name, value in zip(ROLLUP_COUNTS, row[:-2], strict=True)}
    return counts, (int(row[-2]), str(row[-1]))


def _rollup_row_plain(milestone_id: int) -> tuple[dict[str, int], tuple[int, str]] | None:
    """`_rollup_row` through the ORM (`FUSION_FAST_PATHS` off)."""
    milestone = Milestone.objects.filter(pk=milestone_id).values_list("mission_id", "validation_state").first()
    if milestone is None:
        return None
    S = AssertionStatus
    unlinked = Q(~Exists(FeatureAssertion.objects.filter(assertion=OuterRef("pk"))), scope=AssertionScope.FEATURE)
    counts = ContractAssertion.objects.filter(milestone_id=milestone_id).aggregate(
        total=Count("pk"),
        **{
            name: Count("pk", filter=Q(status=status))
            for name, status in zip(ROLLUP_COUNTS[1:5], (S.PASSED, S.FAILED, S.BLOCKED, S.PENDING), strict=True)
        },
        unlinked=Count("pk", filter=unlinked),
    )
    return {name: int(counts[name] or 0) for name in ROLLUP_COUNTS}, (int(milestone[0]), str(milestone[1]))


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
    found = _rollup_row(milestone_id)
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
