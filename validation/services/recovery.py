"""Recovery (docs/RELIABILITY.md): reap runs past their lease, re-drive every feature from its
persisted state, clean snapshots left by killed workers. Idempotent: a second sweep right
after the first changes nothing."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from fusion_site.repos import mirrors
from fusion_site.repos.mirrors import FULL_COMMIT
from fusion_site.repos.snapshots import sweep_snapshots
from fusion_site.repos.sources import SnapshotError, Source, SourceUnavailable
from missions.models import FeatureStatus, LoopState, MissionFeature, MissionStatus, StopReason, Task, TaskStatus
from missions.relay import redeliver_missing
from missions.services.executor_lease import executor_redrive
from validation import hooks
from validation.models import FixLineage, RunStatus, ValidatorRun
from validation.review.pipeline import live_snapshot_labels, reviews_redrive
from validation.selectors import feature_revision
from validation.services.autopilot import autopilot_redrive
from validation.services.fixes import fix_for_failure
from validation.services.queueing import queue_run, send_task_outcome
from validation.services.verdicts.admit import feature_admit
from validation.services.verdicts.complete import run_error

logger = logging.getLogger(__name__)


def reap_runs(now=None) -> list[int]:
    now = now or timezone.now()
    stale = ValidatorRun.objects.filter(status=RunStatus.RUNNING, lease_until__lt=now).values_list("pk", flat=True)
    reaped = []
    for run_id in list(stale):
        if run_error(run_id=run_id, message="the validator did not finish within its timeout; reaped", code="timeout"):
            reaped.append(run_id)
    return reaped


def redrive_unclaimed(*, startup: bool, now=None) -> list[int]:
    """Runs never picked up (a lost message) are sent again. At embedded start-up every
    running run is orphaned, whatever its lease says."""
    now = now or timezone.now()
    qs = ValidatorRun.objects.filter(status=RunStatus.RUNNING)
    if not startup:
        qs = qs.filter(lease_until__isnull=True, created_at__lt=now - timedelta(seconds=settings.FUSION_REDRIVE_GRACE))
    runs = list(qs.order_by("id"))
    if startup:  # no delivery of the previous process holds them any more
        ValidatorRun.objects.filter(pk__in=[r.pk for r in runs], status=RunStatus.RUNNING).update(
            claim_token="", lease_until=None
        )
    for run in runs:
        queue_run(run)
    return [run.pk for run in runs]


def _recent(moment) -> bool:
    grace = timedelta(seconds=settings.FUSION_REDRIVE_GRACE)
    return moment is not None and grace.total_seconds() > 0 and moment > timezone.now() - grace


def _active(qs):
    return qs.filter(mission__status=MissionStatus.ACTIVE)


def redrive_features() -> dict[str, list[int]]:
    done: dict[str, list[int]] = {"validating": [], "needs_fix": [], "implementing": [], "stranded_done": []}
    live = ValidatorRun.objects.filter(feature=OuterRef("pk"), status=RunStatus.RUNNING)
    for f in _active(MissionFeature.objects.filter(loop_state=LoopState.VALIDATING)).filter(~Exists(live)):
        if feature_admit(feature_id=f.pk, trigger="recovery", cause="recovery").outcome in (
            "started",
            "reused",
            "blocked",
        ):
            done["validating"].append(f.pk)
    fixed = FixLineage.objects.filter(source=OuterRef("pk"), run=OuterRef("last_run"))
    for f in _active(
        MissionFeature.objects.filter(
            loop_state=LoopState.NEEDS_FIX, mission__auto_fix=True, last_run__status=RunStatus.FAILED
        )
    ).filter(~Exists(fixed)):
        fix_for_failure(source_id=f.pk, run_id=f.last_run_id)
        done["needs_fix"].append(f.pk)
    for f in _active(MissionFeature.objects.filter(loop_state=LoopState.IMPLEMENTING)):
        task = Task.objects.filter(feature=f).order_by("-id").first()
        # A completion younger than the grace most likely has its message still queued:
        # re-sending it on every sweep only multiplies a backlog (duplicates are skipped).
        if task is not None and task.status == TaskStatus.DONE and not _recent(task.finished_at):
            send_task_outcome(task.pk)
            done["implementing"].append(f.pk)
    for f in _active(MissionFeature.objects.filter(status=FeatureStatus.DONE, loop_state=LoopState.IDLE)):
        feature_admit(feature_id=f.pk, trigger="recovery", cause="recovery")
        done["stranded_done"].append(f.pk)
    return done


def redrive_unavailable() -> list[int]:
    """Features blocked `workspace_unavailable` whose commit the source now has: judged by a
    new run. One refresh per source per sweep; a source still unreachable is skipped. A
    revision the workspace refused (its run ended `workspace_refused`: the commit is there,
    and judging it again would end the same way on every sweep) waits for a person."""
    blocked = (
        _active(
            MissionFeature.objects.filter(loop_state=LoopState.BLOCKED, stop_reason=StopReason.WORKSPACE_UNAVAILABLE)
        )
        .exclude(last_run__error__startswith="workspace_refused")
        .select_related("mission")
    )
    waiting: dict[Source, list[tuple[int, str]]] = {}
    for feature in blocked:
        revision = feature_revision(feature)
        with contextlib.suppress(SnapshotError):
            if FULL_COMMIT.match(revision):
                waiting.setdefault(feature.mission.source(), []).append((feature.pk, revision))
    done = []
    for source, features in waiting.items():
        present = _commits_present(source, {revision for _pk, revision in features})
        for pk, revision in features:
            if revision in present and feature_admit(
                feature_id=pk, trigger="recovery", cause="source_available"
            ).outcome in ("started", "reused"):
                done.append(pk)
    return done


def _commits_present(source: Source, commits: set[str]) -> set[str]:
    try:
        with mirrors.in_use(source):
            mirror = mirrors.ensure_mirror(source)
            mirrors.refresh(source, mirror)
            missing = [c for c in commits if not mirrors.has_commit(mirror, c)]
            # A commit on no branch (pushed to another ref) is asked for by id.
            for commit in missing:
                with contextlib.suppress(SourceUnavailable):
                    mirrors.ensure_commit(source, commit)
            return {c for c in commits if mirrors.has_commit(mirror, c)}
    except SnapshotError as exc:
        logger.info("recovery: %s", exc)
        return set()


def clean_snapshots() -> int:
    def live() -> set[str]:
        runs = ValidatorRun.objects.filter(status=RunStatus.RUNNING).values_list("pk", flat=True)
        return {f"run-{pk}" for pk in runs} | live_snapshot_labels()  # and reviews still running

    return sweep_snapshots(live_labels=live)


def recover(*, startup: bool = False) -> dict[str, Any]:
    report: dict[str, Any] = {"reaped": reap_runs(), "redriven_runs": redrive_unclaimed(startup=startup)}
    report["executor_redriven"] = executor_redrive(startup=startup)
    report.update(redrive_features())
    report["source_available"] = redrive_unavailable()
    report["snapshots_removed"] = clean_snapshots()
    report["autopilot"] = autopilot_redrive()
    report["reviews_redriven"] = reviews_redrive(startup=startup)
    # Committed audit events whose live send was lost with the process that committed them.
    report["events_redelivered"] = redeliver_missing(grace_seconds=max(settings.FUSION_REDRIVE_GRACE, 5))
    # The floors above sweep their own (forges: waiting webhook deliveries, the outbox's due sends).
    for _receiver, entries in hooks.recovery_swept.send_robust(sender=None, now=timezone.now(), startup=startup):
        if isinstance(entries, Exception):  # one floor's failed sweep stops no other; the next sweep retries
            logger.error("recovery sweep: %r", entries)
        elif entries:
            report.update(entries)
    return report
