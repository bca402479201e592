"""Executing one validator run: context, snapshot, judge, host validation, completion."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from missions.models import AssertionScope, Feature, Task, TaskStatus
from validation import journal, profiles
from validation.context import AssertionSpec, ValidationContext, ValidatorCrashed
from validation.models import RunScope, RunStatus, ValidatorRun
from validation.services.outcomes import run_complete, run_error
from validation.snapshots import SnapshotError, bounded_diff, snapshot
from validation.validators import judge
from validation.verdict import FrozenContext, HostValidatorDefect, Verdict, normalize, parse_candidate, run_host_validators

logger = logging.getLogger(__name__)


def run_assertions(run: ValidatorRun) -> list[AssertionSpec]:
    if run.scope == RunScope.MILESTONE:
        qs = run.milestone.assertions.order_by("order", "id")
    else:
        qs = run.feature.assertions.filter(scope=AssertionScope.FEATURE).order_by("order", "id")
    return [AssertionSpec(key=a.key, title=a.title, statement=a.statement, check=a.check_spec, scope=a.scope) for a in qs]


def _task_context(feature: Feature | None) -> tuple[str, str]:
    if feature is None:
        return "", ""
    task = Task.objects.filter(feature=feature, status=TaskStatus.DONE).order_by("-finished_at", "-id").first()
    if task is None:
        return "", ""
    return task.summary[:4000], task.log[-4000:]


def build_context(run: ValidatorRun, checkout, *, replay=None) -> ValidationContext:
    mission, feature = run.mission, run.feature
    summary, log_tail = _task_context(feature)
    return ValidationContext(
        run_id=run.pk, mission_key=mission.key, feature_key=feature.key if feature else f"milestone:{run.milestone.key}",
        feature_title=feature.title if feature else run.milestone.title,
        feature_description=feature.description if feature else run.milestone.description,
        assertions=run_assertions(run), revision=run.revision, checkout=checkout,
        profile={"name": run.validator, **run.validator_config}, task_summary=summary, log_tail=log_tail,
        diff=bounded_diff(mission.workspace, mission.base_revision, run.revision), replay=replay,
    )


def _claim(run_id: int) -> ValidatorRun | None:
    """Take the lease of a running run; a run that is no longer running is stale."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.FUSION_VALIDATOR_TIMEOUT)
    if not ValidatorRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(lease_until=lease, updated_at=now):
        return None
    return ValidatorRun.objects.select_related("mission", "feature", "milestone").get(pk=run_id)


def execute_run(run_id: int) -> str:
    """Judge one run and record its outcome. Returns the final run status (or 'stale')."""
    run = _claim(run_id)
    if run is None:
        return "stale"
    accepted = _accepted_earlier(run.pk)
    if accepted is not None:
        # Redelivered after the verdict was accepted but before the run was completed (the
        # worker lost its database or died): complete from the journal, judge nothing again.
        tokens = accepted.get("tokens", {})
        run_complete(run_id=run.pk, verdict=Verdict.model_validate(accepted["accepted_verdict"]),
                     tokens_in=tokens.get("in", 0), tokens_out=tokens.get("out", 0))
        return ValidatorRun.objects.filter(pk=run.pk).values_list("status", flat=True).get()
    try:
        profiles.get_profile(run.validator)
        with snapshot(run.mission.workspace, run.revision, label=f"run-{run.pk}") as checkout:
            ctx = build_context(run, checkout)
            judgement = judge(ctx)
            verdict = host_accept(run.pk, judgement.candidate, FrozenContext(keys=ctx.keys, checkout=checkout),
                                  tokens={"in": judgement.tokens_in, "out": judgement.tokens_out})
    except SnapshotError as exc:
        run_error(run_id=run.pk, message=str(exc), code="workspace_unavailable", retry=False)
        return RunStatus.ERROR
    except profiles.ProfileError as exc:
        run_error(run_id=run.pk, message=str(exc), code="misconfigured", retry=False)
        return RunStatus.ERROR
    except (ValidatorCrashed, HostValidatorDefect) as exc:
        code = getattr(exc, "code", "host_defect")
        # A spent token budget or a broken profile stops the same way on every retry.
        retry = getattr(exc, "retry", True) and code != "misconfigured"
        run_error(run_id=run.pk, message=str(exc), code=code, retry=retry)
        return RunStatus.ERROR
    except Exception as exc:  # noqa: BLE001 — a defect of ours: end the run now instead of leaving it running
        logger.exception("validator run %s crashed with an unexpected error", run.pk)
        run_error(run_id=run.pk, message=f"unexpected {type(exc).__name__}: {exc}", code="host_defect")
        return RunStatus.ERROR
    run_complete(run_id=run.pk, verdict=verdict, tokens_in=judgement.tokens_in, tokens_out=judgement.tokens_out)
    return ValidatorRun.objects.filter(pk=run.pk).values_list("status", flat=True).get()


def _accepted_earlier(run_id: int) -> dict | None:
    entry = journal.entries(run_id, kind="decision", key="final").order_by("-seq").first()
    if entry is None or entry.payload.get("verdict") != "accepted" or "accepted_verdict" not in entry.payload:
        return None
    return entry.payload


def host_accept(run_id: int, candidate: dict, frozen: FrozenContext, *, tokens: dict[str, int] | None = None):
    """Schema and host validators on the final candidate; a rejection here is an error
    (the agent and command validators repair before they hand a candidate over)."""
    verdict, problems = parse_candidate(candidate)
    if verdict is None:
        _decision(run_id, candidate, "rejected", {"schema": problems})
        raise ValidatorCrashed("the verdict does not follow the contract: " + "; ".join(problems), code="invalid_verdict")
    report = run_host_validators(verdict, frozen)
    if not report.ok:
        _decision(run_id, candidate, "rejected", report.problems)
        raise ValidatorCrashed("the verdict was rejected: " + "; ".join(report.reasons()), code="invalid_verdict")
    verdict = normalize(verdict)
    _decision(run_id, verdict.model_dump(), "accepted", {},
              extra={"accepted_verdict": verdict.model_dump(), "tokens": tokens or {"in": 0, "out": 0}})
    return verdict


def _decision(run_id: int, candidate: dict, verdict: str, failed: dict, *, extra: dict | None = None) -> None:
    with transaction.atomic():
        journal.append(run_id=run_id, kind="decision", key="final", payload={
            "verdict": verdict, "failed_validators": failed, "candidate_sha256": journal.sha256_of(candidate),
            "candidate_size": len(journal.canonical(candidate)), **(extra or {}),
        })
