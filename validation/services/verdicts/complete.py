"""Step 5, complete, and step 6, follow up (the order: `verdicts/__init__.py`; docs/TRUTH.md).

The runner (`validation/services/runner.py`, step 4) hands over a verdict (`run_complete`)
or an error (`run_error`). The run ends by a compare-and-swap on `running`
(`run_state.run_finish`), then the feature moves only if its `last_run` names this run: a
late result after a reap changes nothing. What follows a verdict runs in a savepoint of
its own (`follow_up`): a fix, a newer revision judged, a milestone's consequences, the
autopilot; what follows a pass is `admit.apply_pass`'s."""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fusion_site.runtime.redact import bounded
from missions.locks import lock_mission
from missions.models import AssertionStatus, ContractAssertion, LoopState, Mission, MissionFeature, StopReason
from missions.outbox import publish_on_commit, published_together
from missions.services.rollup import milestone_rollup_refresh
from missions.services.verdict_settings import same_base
from missions.transitions import assertion_transition, feature_transition
from validation import fastpaths, journal, unfetched
from validation.models import RunStatus, ValidatorFailure, ValidatorRun
from validation.selectors import consecutive_errors, feature_revision, lineage_fix_ids
from validation.services.fixes import fix_create
from validation.services.follow_up import follow_up
from validation.services.milestones import milestone_run_completed, milestone_run_errored
from validation.services.queueing import autopilot_notify
from validation.services.run_input import feature_assertion_specs, same_contract
from validation.services.run_state import run_finish
from validation.services.runs import announce_completed, clone_run, launch
from validation.services.verdicts.admit import apply_pass, feature_admit
from validation.subversion import PREFIX as SUSPECTED
from validation.verdict import Verdict

RUN_STATUS = {"pass": RunStatus.PASSED, "fail": RunStatus.FAILED, "blocked": RunStatus.BLOCKED}
ASSERTION_STATUS = {"pass": AssertionStatus.PASSED, "fail": AssertionStatus.FAILED, "blocked": AssertionStatus.BLOCKED}
ERROR_LIMIT = 3


@transaction.atomic
@published_together()
def run_complete(
    *,
    run_id: int,
    verdict: Verdict,
    tokens_in: int = 0,
    tokens_out: int = 0,
    decision: dict | None = None,
    run: ValidatorRun | None = None,
    journal_first: Sequence[journal.Entry] = (),
) -> bool:
    """`decision`: the host's accepted decision, journaled in this transaction (whatever
    the compare-and-swap finds: the journal says what the host accepted), after
    `journal_first` (the run's check results, held back by the runner), in one statement.
    `run`: the run as the worker that judged it loaded it, not read again: the fields read
    here never change once a run is created, and its status is the compare-and-swap's. Its
    mission is read again when needed (its settings may have changed while the run was
    judged)."""
    if run is None or run.pk != run_id:
        run = ValidatorRun.objects.select_related("mission").get(pk=run_id)
    else:
        ValidatorRun.mission.field.delete_cached_value(run)
    entries = [*journal_first, *([("decision", "final", decision)] if decision is not None else [])]
    if entries:
        lock_mission(run.mission_id)  # before the run's row (the journal's lock): one lock order
        journal.append_many(run_id=run_id, entries=entries)
    status = RUN_STATUS[verdict.status]
    if not run_finish(
        run=run,
        status=status,
        cause="verdict",
        verdict=verdict.model_dump(),
        summary=bounded(verdict.summary, 4000),
        blocked_reason=bounded(verdict.blocked_reason, 2000),
        tokens_in=tokens_in,
        tokens_out=tokens_out,
    ):
        return False  # reaped or completed elsewhere: exactly one terminal write
    failures = _record_assertions(run, verdict)
    announce_completed(run, counts=_counts(verdict), tokens=tokens_in + tokens_out)
    if failures:
        publish_on_commit(
            run.mission_id,
            "validator-run:failures-recorded",
            {
                "run": run.pk,
                "feature": run.feature_id,
                "count": len(failures),
                "assertions": [f.assertion_key for f in failures],
            },
        )
    if run.feature_id is not None:
        _move_feature(run, verdict)
    else:
        milestone_run_completed(run=run, verdict=verdict)
    return True


def _owns_feature(run: ValidatorRun) -> MissionFeature | None:
    if run.feature_id is None:
        return None  # a milestone run moves no feature
    feature = fastpaths.feature_locked(feature_id=run.feature_id)
    return feature if feature.last_run_id == run.pk and feature.loop_state == LoopState.VALIDATING else None


def _move_feature(run: ValidatorRun, verdict: Verdict) -> None:
    feature = _owns_feature(run)
    if feature is None:
        return
    fixes = lineage_fix_ids(feature)  # read once, under the mission's lock: no fix is made meanwhile
    if _readmit_newer_revision(feature, run, fixes):
        return
    if verdict.status == "pass":
        apply_pass(feature=feature, run=run, cause="pass", old_state=LoopState.VALIDATING, fixes=fixes)
    elif verdict.status == "fail":
        _needs_fix(feature, run)
    else:
        _stopped(feature, run, verdict)


def _needs_fix(feature: MissionFeature, run: ValidatorRun) -> None:
    """A fail: the feature waits for its fix, made now when the mission has `auto_fix`."""
    feature_transition(
        feature=feature.pk,
        old=LoopState.VALIDATING,
        new=LoopState.NEEDS_FIX,
        cause="fail",
        payload={"run": run.pk},
        mission_id=feature.mission_id,
    )
    if run.mission.auto_fix:
        follow_up(run.mission_id, "fix_create", lambda: fix_create(source_id=feature.pk, run_id=run.pk))
    else:
        publish_on_commit(
            run.mission_id,
            "fix-feature:report-only",
            {"mission": run.mission_id, "feature": feature.pk, "run": run.pk},
        )


def _stopped(feature: MissionFeature, run: ValidatorRun, verdict: Verdict) -> None:
    """A blocked verdict: the feature is blocked until a person looks."""
    feature_transition(
        feature=feature.pk,
        old=LoopState.VALIDATING,
        new=LoopState.BLOCKED,
        cause="blocked",
        reason=verdict.blocked_reason[:500],
        payload={"run": run.pk},
        fields={
            "stop_reason": blocked_stop_reason(run, verdict),
            "stop_detail": bounded(verdict.blocked_reason, 2000),
            "stopped_at": timezone.now(),
        },
    )
    autopilot_notify(run.mission_id)


def _readmit_newer_revision(feature: MissionFeature, run: ValidatorRun, fixes: list[int] | None = None) -> bool:
    """The run judged older code or an older contract than the feature now has (a task
    landed, or an assertion was linked, unlinked or edited, while it ran): its verdict is
    recorded on the run, but it decides nothing; the feature's current revision and set
    are judged now (docs/TRUTH.md) — an old pass never stands for what came after it."""

    landed = feature_revision(feature, fixes=fixes)
    # Nothing landed: the run's own revision again, with the branch it was the head of.
    standing, name = (landed, "") if landed else (run.revision, run.revision_name)
    if standing == run.revision and same_contract(feature_assertion_specs(feature), run.assertions) and _same_base(run):
        return False
    follow_up(
        run.mission_id,
        "newer_revision",
        lambda: feature_admit(
            feature_id=feature.pk, trigger=run.trigger, cause="newer_revision", revision=standing, revision_name=name
        ),
    )
    return True


def _same_base(run: ValidatorRun) -> bool:
    """Whether the run was judged against the mission's base as it stands: a person who
    moved the base while the run judged makes its verdict one over an old input."""
    if not (run.protection or {}).get("base"):
        return True
    current = Mission.objects.filter(pk=run.mission_id).values_list("base_commit", flat=True).first() or ""
    return same_base(run.protection, current)


def blocked_stop_reason(run: ValidatorRun, verdict: Verdict) -> str:
    """Why a blocked run stops its feature: `suspected_tampering` when a scan of the changed
    files blocked an assertion (validation/subversion.py: a person looks first); missing
    content a check needed (a submodule, an LFS object: what to enable,
    docs/REPOSITORIES.md); or the validator's block."""
    if any(a.verdict == "blocked" and a.message.startswith(SUSPECTED) for a in verdict.assertions):
        return StopReason.SUSPECTED_TAMPERING
    checked = [a["key"] for a in run.assertions if a.get("check")]
    return unfetched.stop_code(verdict, checked) or StopReason.VALIDATOR_BLOCKED


def _counts(verdict: Verdict) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "blocked": 0}
    for a in verdict.assertions:
        counts[a.verdict] += 1
    return counts


def _record_assertions(run: ValidatorRun, verdict: Verdict) -> list[ValidatorFailure]:
    by_key = {
        a.key: a
        # No ordering: a mapping by key (the model's default ordering costs its compile).
        for a in ContractAssertion.objects.filter(
            mission_id=run.mission_id, key__in=[v.key for v in verdict.assertions]
        ).order_by()
    }
    failures = []
    for item in verdict.assertions:
        assertion = by_key.get(item.key)
        if assertion is not None:
            _record_assertion_status(assertion, ASSERTION_STATUS[item.verdict], run)
        if item.verdict == "fail":
            failures.append(
                ValidatorFailure.objects.create(
                    run=run,
                    feature_id=run.feature_id,
                    assertion=assertion,
                    assertion_key=item.key,
                    message=bounded(item.message, 4000),
                    expected=bounded(item.expected, 4000),
                    actual=bounded(item.actual, 4000),
                    evidence=[{"kind": e.kind, "text": bounded(e.text, 4000)} for e in item.evidence],
                )
            )
    milestone_rollup_refresh(milestone_ids={a.milestone_id for a in by_key.values()} | {run.milestone_id})
    return failures


def _record_assertion_status(assertion: ContractAssertion, status: str, run: ValidatorRun) -> None:
    """The assertion's status is the verdict's (the last verdict recorded wins); the same
    status again is no move."""
    while assertion.status != status:
        if not assertion_transition(
            assertion=assertion,
            old=assertion.status,
            new=status,
            cause="verdict",
            payload={"key": assertion.key, "milestone": assertion.milestone_id, "run": run.pk},
        ):
            assertion.refresh_from_db(fields=["status"])  # another writer won: judge from its state


# The stop reason of a feature whose runs keep ending `error` with this code (else
# `validator_unavailable`).
ERROR_STOP_REASONS = {
    "workspace_unavailable": StopReason.WORKSPACE_UNAVAILABLE,
    "workspace_refused": StopReason.WORKSPACE_UNAVAILABLE,
    "sandbox_unavailable": StopReason.SANDBOX_UNAVAILABLE,
    "environment_failed": StopReason.ENVIRONMENT_FAILED,
}


@transaction.atomic
def run_error(*, run_id: int, message: str, code: str = "validator_error", retry: bool = True) -> bool:
    """The validator crashed, timed out or stayed invalid: the run is `error`; the feature
    stays `validating` and gets a new run with backoff, or after 3 consecutive errors is
    blocked as `validator_unavailable`."""
    run = ValidatorRun.objects.select_related("mission").get(pk=run_id)
    text = bounded(message, 4000)
    if not run_finish(run=run, status=RunStatus.ERROR, cause="error", error=f"{code}: {text}", summary=text[:500]):
        return False
    announce_completed(run, error=code)
    if run.feature_id is None:
        milestone_run_errored(run=run, retry=retry)
        return True
    feature = _owns_feature(run)
    if feature is None:
        return True
    errors = consecutive_errors(ValidatorRun.objects.filter(feature_id=feature.pk))
    if not retry or errors >= ERROR_LIMIT:
        reason = ERROR_STOP_REASONS.get(code, StopReason.VALIDATOR_UNAVAILABLE)
        feature_transition(
            feature=feature.pk,
            old=LoopState.VALIDATING,
            new=LoopState.BLOCKED,
            cause=reason,
            reason=text[:500],
            payload={"run": run.pk, "errors": errors},
            fields={"stop_reason": reason, "stop_detail": text, "stopped_at": timezone.now()},
        )
        autopilot_notify(run.mission_id)
        return True
    _retry(feature, run, errors)
    return True


def _retry(feature: MissionFeature, failed: ValidatorRun, errors: int) -> None:
    attempts = feature.validator_attempts + 1
    run = clone_run(failed, feature=feature, validator_attempt=attempts)
    MissionFeature.objects.filter(pk=feature.pk).update(
        last_run=run, validator_attempts=attempts, updated_at=timezone.now()
    )
    launch(run, retry_of=failed.pk, delay_ms=int(settings.FUSION_RETRY_BACKOFF_MS * (2 ** (errors - 1))))
