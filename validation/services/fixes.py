"""Fix features and the retry budget (docs/TRUTH.md).

The budget is charged to the root of a lineage (fixes of fixes charge the root). Fix
creation is idempotent per (source, run): the database's unique constraint decides
between two concurrent workers, and the loser returns the winner's fix.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from fusion_site.runtime.redact import bounded
from missions.errors import Conflict
from missions.locks import assert_mission_locked, lock_mission
from missions.models import (
    AssertionScope,
    FeatureAssertion,
    LoopState,
    MissionFeature,
    MissionStatus,
    SliceStatus,
    StopReason,
)
from missions.outbox import publish_on_commit
from missions.selectors import latest_done_task
from missions.services.tasks import task_create
from missions.transitions import FEATURE, feature_transition, slice_transition
from missions.transitions.loop import DONE_STATES
from validation.models import FixLineage, RunScope, RunStatus, ValidatorFailure, ValidatorRun
from validation.services.queueing import autopilot_notify
from validation.services.run_state import run_cancel

CAUSE_LIMIT = 12_000


def lineage_root(feature: MissionFeature) -> MissionFeature:
    seen = {feature.pk}
    node = feature
    while node.generated_from_id is not None:
        if node.generated_from_id in seen:  # fail closed on a cycle: treat this node as the root
            break
        seen.add(node.generated_from_id)
        node = MissionFeature.objects.get(pk=node.generated_from_id)
    return node


def validation_cause(run: ValidatorRun, failures: list[ValidatorFailure]) -> str:
    lines = ["## Validation cause", "", f"Validator run {run.pk} (revision `{run.revision[:12]}`) failed:", ""]
    for f in failures:
        lines += [
            f"### {f.assertion_key}",
            f"- message: {f.message}",
            f"- expected: {f.expected}",
            f"- actual: {f.actual}",
        ]
        for e in f.evidence[:5]:
            lines.append(f"- evidence ({e.get('kind')}):\n\n```\n{e.get('text', '')[:1500]}\n```")
        lines.append("")
    return bounded("\n".join(lines), CAUSE_LIMIT)


def _fix_key(root: MissionFeature, round_no: int) -> str:
    base = f"{root.key[:100]}-fix-{round_no}"
    key, n = base, 1
    while MissionFeature.objects.filter(mission_id=root.mission_id, key=key).exists():
        n += 1
        key = f"{base}-{n}"
    return key


@transaction.atomic
def fix_create(
    *, source_id: int, run_id: int, actor_id: int | None = None, assertion_keys: list[str] | None = None
) -> MissionFeature | None:
    """`assertion_keys` narrows a milestone run's failures to those this source answers for."""
    lock_mission(MissionFeature.objects.values_list("mission_id", flat=True).get(pk=source_id))
    source = MissionFeature.objects.select_for_update().select_related("mission", "slice").get(pk=source_id)
    existing = FixLineage.objects.filter(source=source, run_id=run_id).select_related("fix").first()
    if existing is not None:
        return existing.fix
    run = ValidatorRun.objects.get(pk=run_id)
    if run.status != RunStatus.FAILED:
        raise Conflict("only a failed run can produce a fix", code="run_not_failed")
    root = lineage_root(source)
    if root.pk != source.pk:
        root = MissionFeature.objects.select_for_update().get(pk=root.pk)
    if root.fix_rounds >= source.mission.retry_budget:
        _exhaust(root, source, run, actor_id)
        return None
    failures = list(run.failures.select_related("assertion"))
    if assertion_keys is not None:
        failures = [f for f in failures if f.assertion_key in assertion_keys]
    try:
        with transaction.atomic():
            fix = _create_fix_feature(source, root, run, failures)
    except IntegrityError:
        return FixLineage.objects.get(source=source, run_id=run_id).fix
    MissionFeature.objects.filter(pk=root.pk).update(fix_rounds=root.fix_rounds + 1, updated_at=timezone.now())
    if source.loop_state == LoopState.NEEDS_FIX:
        feature_transition(
            feature=source.pk,
            old=LoopState.NEEDS_FIX,
            new=LoopState.IMPLEMENTING,
            cause="fix_created",
            actor_id=actor_id,
            payload={"fix": fix.pk, "run": run.pk},
        )
    publish_on_commit(
        source.mission_id,
        "fix-feature:created",
        {
            "feature": fix.pk,
            "source": source.pk,
            "root": root.pk,
            "run": run.pk,
            "round": root.fix_rounds + 1,
            "budget_left": max(source.mission.retry_budget - root.fix_rounds - 1, 0),
            "assertions": [f.assertion_key for f in failures],
        },
        actor_id=actor_id,
    )
    if source.mission.autopilot and source.mission.status == MissionStatus.ACTIVE:
        task_create(user=None, feature=fix)
    return fix


def fix_for_failure(*, source_id: int, run_id: int, actor_id: int | None = None) -> MissionFeature | None:
    """The fix a recorded failure calls for: a milestone run's failures narrowed to those
    this source answers for."""
    run = ValidatorRun.objects.select_related("milestone").get(pk=run_id)
    keys = None
    if run.scope == RunScope.MILESTONE:
        keys = next((k for f, k in regression_sources(run).items() if f.pk == source_id), [])
    return fix_create(source_id=source_id, run_id=run_id, actor_id=actor_id, assertion_keys=keys)


def _create_fix_feature(
    source: MissionFeature, root: MissionFeature, run: ValidatorRun, failures: list[ValidatorFailure]
) -> MissionFeature:
    """Called while holding the mission lock (`fix_create`)."""
    assert_mission_locked(source.mission_id)
    description = f"{source.description.strip()}\n\n{validation_cause(run, failures)}".strip()
    fix = MissionFeature(
        slice=source.slice,
        key=_fix_key(root, root.fix_rounds + 1),
        title=f"Fix: {source.title}"[:200],
        description=description,
        acceptance_criteria=source.acceptance_criteria,
        order=source.order,
        generated_from=source,
        generated_from_run=run,
    )
    fix.save()
    lineage = FixLineage.objects.create(root=root, source=source, fix=fix, run=run)
    failed = [f.assertion for f in failures if f.assertion is not None]
    lineage.failed_assertions.set(failed)
    to_link = [a for a in failed if a.scope == AssertionScope.FEATURE]
    if not to_link:
        # Only milestone-scoped failures: the fix is judged by its source's own contract
        # (it must not regress it); the milestone run then judges the rest again.
        to_link = list(source.assertions.filter(scope=AssertionScope.FEATURE))
    FeatureAssertion.objects.bulk_create(
        [FeatureAssertion(feature=fix, assertion=a) for a in to_link], ignore_conflicts=True
    )
    if source.slice.status == SliceStatus.COMPLETE:  # a regression reopens the slice it lands in
        slice_transition(
            slice_=source.slice_id,
            old=SliceStatus.COMPLETE,
            new=SliceStatus.ACTIVE,
            cause="fix_created",
            payload={"feature": fix.pk, "source": source.pk},
        )
    return fix


def _exhaust(root: MissionFeature, source: MissionFeature, run: ValidatorRun, actor_id: int | None) -> None:
    """Called while holding the mission lock (`fix_create`)."""
    assert_mission_locked(root.mission_id)
    detail = f"retry budget of {source.mission.retry_budget} fix rounds is used up (last failing run {run.pk})"
    fields = {"stop_reason": StopReason.BUDGET_EXHAUSTED, "stop_detail": detail, "stopped_at": timezone.now()}
    for feature in {root.pk: root, source.pk: source}.values():
        feature.refresh_from_db()
        if FEATURE.allows(feature.loop_state, LoopState.BLOCKED, "budget_exhausted"):
            feature_transition(
                feature=feature.pk,
                old=feature.loop_state,
                new=LoopState.BLOCKED,
                cause="budget_exhausted",
                actor_id=actor_id,
                reason=detail,
                fields=fields,
                payload={"run": run.pk, "root": root.pk},
            )
    publish_on_commit(
        root.mission_id,
        "fix-feature:budget-exhausted",
        {"mission": root.mission_id, "feature": root.pk, "run": run.pk},
        actor_id=actor_id,
    )
    autopilot_notify(root.mission_id)


def cancel_running(feature: MissionFeature, *, reason: str) -> None:
    """Newer evidence makes a running judgement moot: it ends `cancelled`; its late result
    (the worker may still be on it) changes nothing, as the feature no longer names it."""
    for run in ValidatorRun.objects.filter(feature=feature, status=RunStatus.RUNNING):
        run_cancel(run=run, reason=reason)


def close_lineage(*, root: MissionFeature) -> None:
    """The root passed: every fix of its lineage that has not passed is closed as
    superseded, with its cause; a running judgement of it is cancelled (it spends nothing).
    Called while holding the mission lock."""
    assert_mission_locked(root.mission_id)
    open_fixes = MissionFeature.objects.filter(lineage_as_fix__root=root).exclude(loop_state__in=DONE_STATES).distinct()
    for fix in open_fixes:
        cancel_running(fix, reason=f"root {root.key} passed")
        detail = f"closed: its root {root.key} passed"
        feature_transition(
            feature=fix.pk,
            old=fix.loop_state,
            new=LoopState.SUPERSEDED,
            cause="superseded",
            reason=detail,
            payload={"root": root.pk},
            fields={"stop_reason": "", "stop_detail": detail, "stopped_at": timezone.now()},
        )


def regression_sources(run: ValidatorRun) -> dict[MissionFeature, list[str]]:
    roots = MissionFeature.objects.filter(slice__milestone=run.milestone, generated_from__isnull=True)
    sources: dict[MissionFeature, list[str]] = {}
    for failure in run.failures.select_related("assertion"):
        assertion = failure.assertion
        if assertion is not None and assertion.scope == AssertionScope.FEATURE:
            linked = list(roots.filter(assertions=assertion).order_by("id")) or list(
                assertion.features.order_by("id")[:1]
            )
        else:
            task = latest_done_task(features=roots)
            linked = [task.feature] if task and task.feature else list(roots.order_by("-id")[:1])
        for feature in linked:
            sources.setdefault(feature, []).append(failure.assertion_key)
    return sources
