"""Reads over validator runs, and the dashboard's reads (which join the plan with its runs
and reviews). Constant query counts per page or fragment, whatever the mission's size."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

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
)
from missions.selectors import rollup_state, visible_mission_ids
from validation import fastpaths
from validation.models import FixLineage, Review, RunStatus, ValidatorRun

if TYPE_CHECKING:
    # Lint-only dependency (django-stubs-ext): names an annotated model for the type checker.
    from django_stubs_ext import WithAnnotations

# A `.values()` row the dashboard extends with its own keys (rollup, slices, features, ...):
# django-stubs types each row as a closed TypedDict of the selected fields.
Row = dict[str, Any]


def consecutive_errors(runs: QuerySet[ValidatorRun], *, window: int = 10) -> int:
    """How many of the newest runs in `runs` ended in `error`, back to the last one that did not."""
    count = 0
    for status in runs.order_by("-id").values_list("status", flat=True)[:window]:
        if status != RunStatus.ERROR:
            break
        count += 1
    return count


def lineage_fix_ids(feature) -> list[int]:
    """The fixes of the lineage whose root is `feature` (none for most features)."""
    return fastpaths.lineage_fix_ids(root_id=feature.pk)


def feature_revision(feature, *, fixes: list[int] | None = None) -> str:
    """The revision a feature stands on: the newest of its own tasks' landed revisions and
    the revisions at which its fixes passed. Every path that judges a feature uses this
    (docs/TRUTH.md): a root whose fix passed is never re-judged on its pre-fix code.
    `fixes`: `lineage_fix_ids(feature)`, when the caller has it."""
    candidates: list[tuple[datetime | None, str]] = []
    # Two fields of each row, not the rows (a task's log, a run's verdict: large, unused here).
    task = fastpaths.last_landed(feature_id=feature.pk)
    if task is not None:
        candidates.append(task)
    fixes = lineage_fix_ids(feature) if fixes is None else fixes
    fixed = (
        ValidatorRun.objects.filter(feature_id__in=fixes, status=RunStatus.PASSED)
        .exclude(revision="")
        .order_by("-completed_at", "-id")
        .values_list("completed_at", "revision")
        .first()
        if fixes
        else None
    )
    if fixed is not None:
        candidates.append(fixed)
    if not candidates:
        return ""
    # A done task has finished_at and a passed run completed_at (set by the services that
    # finish them); the cast only states that, it converts nothing.
    return max(candidates, key=lambda c: cast(datetime, c[0]))[1]


# --- dashboard reads (validation/views) ------------------------------------------------------------------
# Constant query counts per page or fragment, whatever the mission's size.

TERMINAL_RUN_STATUSES = ("passed", "failed", "blocked", "error")
ROUNDS_PER_MILESTONE = 40


class DashboardCounts(TypedDict):
    """What `dashboard_missions` annotates on each mission."""

    features_total: int
    features_passed: int
    features_blocked: int
    last_event_at: datetime | None
    last_event_type: str | None


def dashboard_missions(*, user) -> list[WithAnnotations[Mission, DashboardCounts]]:
    """The missions list: progress, blocked count and last activity in one query."""

    latest = MissionEvent.objects.filter(mission=OuterRef("pk")).order_by("-seq")
    return list(
        Mission.objects.filter(pk__in=visible_mission_ids(user=user))
        .annotate(
            features_total=Count("features", distinct=True),
            # A superseded fix is done: it counts with the passed ones (docs/TRUTH.md).
            features_passed=Count(
                "features", filter=Q(features__loop_state__in=[LoopState.PASSED, LoopState.SUPERSEDED]), distinct=True
            ),
            features_blocked=Count("features", filter=Q(features__loop_state=LoopState.BLOCKED), distinct=True),
            last_event_at=Subquery(latest.values("created_at")[:1]),
            last_event_type=Subquery(latest.values("type")[:1]),
        )
        .select_related("owner")
        .order_by("-updated_at", "-id")
    )


def _lineage_roots(features: dict[int, Row]) -> dict[int, int]:
    """feature id -> id of the root of its fix lineage (itself when it is no fix)."""
    roots: dict[int, int] = {}
    for fid in features:
        seen, current = set(), fid
        while features.get(current, {}).get("generated_from_id") in features and current not in seen:
            seen.add(current)
            current = features[current]["generated_from_id"]
        roots[fid] = current
    return roots


def _round_counts(verdict) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "blocked": 0}
    for item in (verdict or {}).get("assertions", []) if isinstance(verdict, dict) else []:
        if isinstance(item, dict) and item.get("verdict") in counts:
            counts[item["verdict"]] += 1
    return counts


def milestone_rounds(*, mission_id: int, milestone_ids: list[int]) -> dict[int, list[dict]]:
    """Finished validator runs per milestone, oldest first (the last ROUNDS_PER_MILESTONE)."""

    rounds: dict[int, list[dict]] = {mid: [] for mid in milestone_ids}
    rows = (
        ValidatorRun.objects.filter(
            mission_id=mission_id, milestone_id__in=milestone_ids, status__in=TERMINAL_RUN_STATUSES
        )
        .order_by("-id")
        .values("id", "milestone_id", "feature__key", "scope", "status", "completed_at", "verdict")
    )
    for row in rows[: ROUNDS_PER_MILESTONE * max(len(milestone_ids), 1)]:
        bucket = rounds[row["milestone_id"]]
        if len(bucket) < ROUNDS_PER_MILESTONE:
            bucket.append(
                {
                    "run": row["id"],
                    "status": row["status"],
                    "at": row["completed_at"],
                    "scope": row["scope"],
                    "feature": row["feature__key"],
                    **_round_counts(row["verdict"]),
                }
            )
    for bucket in rounds.values():
        bucket.reverse()
    return rounds


def mission_overview(*, mission: Mission, milestone_id: int | None = None) -> list[dict]:
    """Milestones -> slices -> features, with per-milestone rollup, coverage and rounds.

    With `milestone_id`, only that milestone (the fragment a live update re-renders)."""

    milestones = cast(
        list[Row],
        list(
            Milestone.objects.filter(mission=mission, **({"pk": milestone_id} if milestone_id else {}))
            .order_by("order", "id")
            .values("id", "key", "title", "status", "description")
        ),
    )
    ids = [m["id"] for m in milestones]
    slices = cast(
        list[Row],
        list(
            Slice.objects.filter(milestone_id__in=ids)
            .order_by("order", "id")
            .values("id", "milestone_id", "key", "title", "status", "activated_at")
        ),
    )
    # Every feature of the mission: fix lineages may cross milestones and their roots carry the budget.
    features: dict[int, Row] = {
        f["id"]: cast(Row, f)
        for f in MissionFeature.objects.filter(mission=mission)
        .order_by("order", "id")
        .values(
            "id",
            "slice_id",
            "slice__milestone_id",
            "key",
            "title",
            "status",
            "loop_state",
            "implementation_attempts",
            "validator_attempts",
            "fix_rounds",
            "generated_from_id",
            "stop_reason",
            "last_run_id",
            "last_run__status",
        )
    }
    roots = _lineage_roots(features)
    assertions = list(
        ContractAssertion.objects.filter(milestone_id__in=ids).values("id", "milestone_id", "scope", "status")
    )
    linked = set(
        FeatureAssertion.objects.filter(assertion__milestone_id__in=ids).values_list("assertion_id", flat=True)
    )
    running = set(
        ValidatorRun.objects.filter(mission=mission, status="running", feature__isnull=False).values_list(
            "feature_id", flat=True
        )
    )
    rounds = milestone_rounds(mission_id=mission.pk, milestone_ids=ids)

    by_slice: dict[int, list[Row]] = defaultdict(list)
    for f in features.values():
        if f["slice__milestone_id"] not in ids:
            continue
        root = features[roots[f["id"]]]
        f["budget_left"] = max(mission.retry_budget - root["fix_rounds"], 0)
        f["is_fix"] = f["generated_from_id"] is not None
        f["running"] = f["id"] in running
        by_slice[f["slice_id"]].append(f)
    by_milestone: dict[int, list[Row]] = defaultdict(list)
    for s in slices:
        s["features"] = by_slice.get(s["id"], [])
        by_milestone[s["milestone_id"]].append(s)
    for m in milestones:
        mine = [a for a in assertions if a["milestone_id"] == m["id"]]
        counts = {k: sum(1 for a in mine if a["status"] == k) for k in ("passed", "failed", "blocked", "pending")}
        feature_scoped = [a for a in mine if a["scope"] == AssertionScope.FEATURE]
        counts.update(total=len(mine), unlinked=sum(1 for a in feature_scoped if a["id"] not in linked))
        m["rollup"] = {"state": rollup_state(counts), **counts}
        m["coverage"] = {
            "linked": len(feature_scoped) - counts["unlinked"],
            "feature_scoped": len(feature_scoped),
            "milestone_scoped": len(mine) - len(feature_scoped),
        }
        m["slices"] = by_milestone.get(m["id"], [])
        m["keys"] = (
            [f"milestone:{m['id']}"]
            + [f"slice:{s['id']}" for s in m["slices"]]
            + [f"feature:{f['id']}" for s in m["slices"] for f in s["features"]]
        )
        m["rounds"] = rounds.get(m["id"], [])
    return milestones


def mission_assertions(*, mission: Mission) -> list[dict]:
    """The assertions panel: statement, check, status and the features linked to each."""

    links: dict[int, list[dict]] = defaultdict(list)
    for row in (
        FeatureAssertion.objects.filter(assertion__mission=mission)
        .order_by("feature__order", "feature_id")
        .values("assertion_id", "feature_id", "feature__key", "feature__loop_state")
    ):
        links[row["assertion_id"]].append(
            {"id": row["feature_id"], "key": row["feature__key"], "loop_state": row["feature__loop_state"]}
        )
    assertions = cast(
        list[Row],
        list(
            ContractAssertion.objects.filter(mission=mission)
            .order_by("milestone__order", "milestone_id", "order", "id")
            .values("id", "key", "title", "statement", "scope", "check_spec", "status", "milestone__key")
        ),
    )
    for assertion in assertions:
        assertion["features"] = links.get(assertion["id"], [])
    return assertions


def mission_feed(*, mission: Mission, limit: int = 30) -> list:

    return list(MissionEvent.objects.filter(mission=mission).select_related("actor").order_by("-seq")[:limit])


def feature_lineage(*, feature) -> dict:
    """The fix lineage the feature belongs to, as a chain from its root."""

    root = feature
    seen = {feature.pk}
    while root.generated_from_id and root.generated_from_id not in seen:
        seen.add(root.generated_from_id)
        parent = MissionFeature.objects.filter(pk=root.generated_from_id).first()
        if parent is None:
            break
        root = parent
    links = list(
        FixLineage.objects.filter(root=root)
        .select_related("fix", "run")
        .prefetch_related("failed_assertions")
        .order_by("id")
    )
    return {
        "root": root,
        "links": links,
        "budget_left": max(root.mission.retry_budget - root.fix_rounds, 0),
        "keys": sorted({f"feature:{root.pk}"} | {f"feature:{link.fix_id}" for link in links}),
    }


def feature_runs(*, feature, limit: int = 50) -> list:

    return list(
        ValidatorRun.objects.filter(feature=feature)
        .prefetch_related("failures")
        .select_related("requested_by")
        .order_by("-id")[:limit]
    )


def feature_assertions(*, feature) -> list:
    return list(feature.assertions.order_by("order", "id"))


def feature_tasks(*, feature) -> list:
    return list(feature.tasks.order_by("-id"))


def feature_reviews(*, feature) -> list:

    return list(Review.objects.filter(feature=feature).order_by("-id")[:20])


def run_journal(*, run, limit: int = 500) -> list:
    return list(run.journal.order_by("seq")[:limit])


def visible_runs(*, user) -> QuerySet:

    return ValidatorRun.objects.filter(mission__in=visible_mission_ids(user=user))


def visible_reviews(*, user) -> QuerySet:
    """Reviews of visible missions; a review outside any mission is its author's (and staff's)."""

    if user is None or not user.is_authenticated:
        return Review.objects.none()
    if user.is_staff:
        return Review.objects.all()
    return Review.objects.filter(
        Q(mission__in=visible_mission_ids(user=user)) | Q(mission__isnull=True, created_by=user)
    )
