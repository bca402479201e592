"""Admission (DESIGN §4.3): under a lock on the feature row, decide whether a validator
run starts, an identical earlier pass is reused, or the feature is blocked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from missions.errors import Conflict, Invalid
from missions.events import lock_mission, publish_on_commit
from missions.models import AssertionScope, Feature, LoopState, StopReason, TaskStatus
from validation import profiles
from validation.journal import sha256_of
from validation.loop import feature_transition
from validation.models import RunScope, RunStatus, ValidatorRun

IDENTICAL_FAILURE_LIMIT = 3


@dataclass
class Admission:
    outcome: str  # started | reused | blocked | already_running
    run: ValidatorRun | None = None
    detail: str = ""


def feature_assertion_specs(feature: Feature) -> list[dict[str, Any]]:
    return [{"key": a.key, "statement": a.statement, "check": a.check_spec}
            for a in feature.assertions.filter(scope=AssertionScope.FEATURE).order_by("order", "id")]


def input_fingerprint(*, revision: str, assertions: list[dict[str, Any]], profile: dict[str, Any]) -> str:
    return sha256_of({"revision": revision, "assertions": assertions, "validator": profiles.public_config(profile)})


def latest_revision(feature: Feature) -> str:
    task = feature.tasks.filter(status=TaskStatus.DONE).exclude(revision="").order_by("-finished_at", "-id").first()
    if task is not None:
        return task.revision
    if feature.mission.workspace:
        from validation.snapshots import SnapshotError, head_revision

        try:
            return head_revision(feature.mission.workspace)
        except SnapshotError:
            return ""
    return ""


def _block(feature: Feature, *, cause: str, reason: str, detail: str, actor_id: int | None) -> Admission:
    feature_transition(feature=feature.pk, old=feature.loop_state, new=LoopState.BLOCKED, cause=cause, actor_id=actor_id,
                       reason=detail, fields={"stop_reason": reason, "stop_detail": detail, "stopped_at": timezone.now()})
    return Admission("blocked", detail=detail)


@transaction.atomic
def feature_admit(*, feature_id: int, trigger: str, cause: str, actor_id: int | None = None, profile_name: str | None = None,
                  revision: str | None = None, force: bool = False, raise_conflict: bool = False,
                  reason: str = "") -> Admission:
    """Start (or reuse, or refuse) a validation of one feature. `force` (operator re-run)
    skips fingerprint reuse and the identical-failure block."""
    lock_mission(Feature.objects.values_list("mission_id", flat=True).get(pk=feature_id))
    feature = Feature.objects.select_for_update().select_related("mission").get(pk=feature_id)
    running = ValidatorRun.objects.filter(feature=feature, status=RunStatus.RUNNING).first()
    if running is not None:
        if raise_conflict:
            raise Conflict("a validation of this feature is already running", code="validation_already_running",
                           extra={"run": running.pk})
        return Admission("already_running", running)
    try:
        profile = profiles.get_profile(profile_name or feature.mission.validator)
    except profiles.ProfileError as exc:
        raise Invalid(str(exc), code="unknown_validator", fields={"validator": [str(exc)]}) from exc
    revision = revision or latest_revision(feature)
    if not revision:
        raise Invalid("nothing to validate: the feature has no landed task revision and the mission no workspace",
                      code="no_revision")
    assertions = feature_assertion_specs(feature)
    if not assertions:
        if raise_conflict:
            raise Invalid("the feature has no contract assertions to judge it by", code="no_assertions")
        return _block(feature, cause="no_assertions", reason=StopReason.NO_ASSERTIONS,
                      detail="no contract assertions are linked: a feature never passes without them", actor_id=actor_id)
    fingerprint = input_fingerprint(revision=revision, assertions=assertions, profile=profile)
    prior = ValidatorRun.objects.filter(feature=feature, input_fingerprint=fingerprint)
    if not force:
        reused = prior.filter(status=RunStatus.PASSED).order_by("-id").first()
        if reused is not None:
            return _reuse(feature, reused, trigger=trigger, actor_id=actor_id)
        if prior.filter(status=RunStatus.FAILED).count() >= IDENTICAL_FAILURE_LIMIT:
            return _block(feature, cause="fingerprint_failures", reason=StopReason.FINGERPRINT, actor_id=actor_id,
                          detail=f"the same input failed {IDENTICAL_FAILURE_LIMIT} times; change the code or the assertions")
    run = start_run(feature=feature, trigger=trigger, cause=cause, profile=profile, revision=revision,
                    fingerprint=fingerprint, actor_id=actor_id, reason=reason)
    return Admission("started", run)


def start_run(*, feature: Feature, trigger: str, cause: str, profile: dict[str, Any], revision: str, fingerprint: str,
              actor_id: int | None, reason: str = "") -> ValidatorRun:
    """Create the run, point the feature at it, move it to `validating`, queue the judge."""
    try:
        with transaction.atomic():
            run = ValidatorRun.objects.create(
                mission_id=feature.mission_id, feature=feature, milestone_id=feature.slice.milestone_id, scope=RunScope.FEATURE,
                trigger=trigger, implementation_attempt=feature.implementation_attempts,
                validator_attempt=feature.validator_attempts + 1, validator=profile["name"],
                validator_config=profiles.public_config(profile), revision=revision, input_fingerprint=fingerprint,
                requested_by_id=actor_id,
            )
    except IntegrityError as exc:  # the database's own "one running run per feature"
        raise Conflict("a validation of this feature is already running", code="validation_already_running") from exc
    fields = {"last_run": run, "validator_attempts": feature.validator_attempts + 1}
    if feature.loop_state == LoopState.VALIDATING:
        Feature.objects.filter(pk=feature.pk).update(updated_at=timezone.now(), last_run=run,
                                                     validator_attempts=feature.validator_attempts + 1)
    else:
        fields.update(stop_reason="", stop_detail="", stopped_at=None)
        moved = feature_transition(feature=feature.pk, old=feature.loop_state, new=LoopState.VALIDATING, cause=cause,
                                   actor_id=actor_id, reason=reason, fields=fields, payload={"run": run.pk})
        if not moved:
            raise Conflict("the feature changed state meanwhile; try again", code="state_changed")
    publish_on_commit(feature.mission_id, "validator-run:started", {
        "run": run.pk, "feature": feature.pk, "trigger": trigger, "validator_attempt": run.validator_attempt,
        "implementation_attempt": run.implementation_attempt, "revision": revision,
    }, actor_id=actor_id)
    queue_run(run.pk)
    return run


def queue_run(run_id: int, delay_ms: int = 0) -> None:
    from validation.tasks import run_validator

    transaction.on_commit(lambda: run_validator.send_with_options(args=(run_id,), delay=delay_ms or None))


def _reuse(feature: Feature, reused: ValidatorRun, *, trigger: str, actor_id: int | None) -> Admission:
    from validation.services.outcomes import apply_pass

    now = timezone.now()
    run = ValidatorRun.objects.create(
        mission_id=feature.mission_id, feature=feature, milestone_id=feature.slice.milestone_id, trigger=trigger,
        status=RunStatus.PASSED, implementation_attempt=feature.implementation_attempts,
        validator_attempt=feature.validator_attempts, validator=reused.validator, validator_config=reused.validator_config,
        revision=reused.revision, input_fingerprint=reused.input_fingerprint, verdict=reused.verdict, reused_from=reused,
        summary=f"reused the pass of run {reused.pk} (identical input; no validator call)", completed_at=now,
    )
    Feature.objects.filter(pk=feature.pk).update(last_run=run, updated_at=now)
    feature.refresh_from_db()
    if feature.loop_state != LoopState.PASSED:  # already passed on this input: recorded, nothing moves
        apply_pass(feature=feature, run=run, cause="fingerprint_reuse", old_state=feature.loop_state)
    publish_on_commit(feature.mission_id, "validator-run:completed", {
        "run": run.pk, "feature": feature.pk, "status": run.status, "reused_from": reused.pk,
    })
    return Admission("reused", run)

