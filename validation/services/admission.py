"""Admission (docs/TRUTH.md): under a lock on the feature row, decide whether a validator
run starts, an identical earlier pass is reused, or the feature is blocked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from fusion_site.base import sandbox
from fusion_site.base.prepared import Prepared
from fusion_site.base.snapshots import FULL_COMMIT, SnapshotError, pin_branch, pin_revision
from fusion_site.base.sources import UnknownRevision
from missions.environment_spec import declared_for, effective
from missions.errors import Conflict, Invalid
from missions.locks import lock_mission
from missions.models import AssertionScope, LoopState, MissionFeature, StopReason
from missions.outbox import publish_on_commit
from missions.services.judging import judges_of, mission_base
from missions.transitions import feature_transition
from validation import hooks, profiles
from validation.journal import canonical, sha256_of
from validation.models import RunScope, RunStatus, ValidatorRun
from validation.selectors import JUDGED, feature_revision
from validation.services.queueing import queue_run

IDENTICAL_FAILURE_LIMIT = 3


@dataclass
class Admission:
    # A feature's: started | reused | blocked | already_running | refused; a milestone's
    # (`milestones.milestone_judge`): started | already_running | complete | waiting | stopped.
    outcome: str
    run: ValidatorRun | None = None
    detail: str = ""


def feature_assertion_specs(feature: MissionFeature) -> list[dict[str, Any]]:
    """The feature's assertion set as a run freezes it: what it is judged by, nothing else
    (the frozen fields only, not the rows)."""
    return [dict(zip(_FROZEN_NAMES, row, strict=True)) for row in _SPECS.all(feature=feature.pk)]


# A frozen assertion's fields, by the model field each comes from: one list for both forms.
FROZEN_FIELDS = (
    ("key", "key"),
    ("title", "title"),
    ("statement", "statement"),
    ("check", "check_spec"),
    ("scope", "scope"),
)


_FROZEN_NAMES = [name for name, _field in FROZEN_FIELDS]
_SPECS: Prepared[tuple] = Prepared(
    lambda feature: (
        MissionFeature(pk=feature)
        .assertions.filter(scope=AssertionScope.FEATURE)
        .order_by("order", "id")
        .values_list(*(field for _name, field in FROZEN_FIELDS))
    )
)


def frozen_assertion(a) -> dict[str, Any]:
    return {name: getattr(a, field) for name, field in FROZEN_FIELDS}


def input_fingerprint(
    *,
    revision: str,
    assertions: list[dict[str, Any]],
    profile: dict[str, Any],
    protection: dict[str, Any] | None = None,
    sandbox_kind: str | None = None,
    environment: dict[str, Any] | None = None,
) -> str:
    """`sandbox_kind`: what the run's commands ran in ("bubblewrap", "none"); by default
    what they would run in here. Part of the key: a pass obtained unconfined is never
    reused for a run that would be confined (docs/SANDBOX.md). `environment`: the
    declared environment with its defaults (`run_environment`), so that a pass under
    another environment is never reused (docs/ENVIRONMENTS.md)."""
    judged = [{"key": a["key"], "statement": a["statement"], "check": a["check"]} for a in assertions]
    return sha256_of(
        {
            "revision": revision,
            "assertions": judged,
            "validator": profiles.public_config(profile),
            "sandbox": sandbox_kind or sandbox.status().kind,
            **({"protection": protection} if protection else {}),
            **({"environment": environment} if environment else {}),
        }
    )


def run_environment(mission, milestone) -> dict[str, Any] | None:
    """The environment a run of `milestone` uses: its own, else the mission's, with its defaults."""
    return effective(declared_for(mission.environment, milestone.environment))


def mission_protection(mission, assertions: list[dict[str, Any]]) -> dict[str, Any]:
    """The protection a run judges under (the mission's patterns, and the base a check's
    own `protect` restores from), frozen with the mission's pinned base (`base_commit`,
    set when a person set the base: never where a branch points now, which the judged
    work may have moved; docs/TRUTH.md)."""
    protects = any((a.get("check") or {}).get("protect") for a in assertions)
    if not mission.protected_paths and not protects:
        return {}
    base = mission_base(mission)
    return {
        "paths": list(mission.protected_paths),
        "on_change": mission.on_protected_change,
        "base": base,
        "runner_config": bool(mission.protect_runner_config),  # what decides how protected tests run (protect.py)
    }


def branch_revision(mission) -> tuple[str, str]:
    """(commit, branch name) of the line of work a mission's revisions are judged on when
    nothing landed one: the head of its `branch`, or of the repository's default branch,
    pinned now (`UnknownRevision` when the branch does not exist; docs/TRUTH.md)."""
    name, commit = pin_branch(mission.source(), mission.branch.strip())
    return commit, name


def judged_revision(feature: MissionFeature, revision: str | None = None, name: str = "") -> tuple[str, str]:
    """(commit, branch name) a validation of `feature` judges: the caller's `revision` (its
    `name`, when the caller carries a branch an earlier run named), else the revision the
    feature stands on (`feature_revision`), else its mission's branch; the name is '' but
    for a branch's head. ('', '') when there is nothing to judge (no repository)."""
    if revision:
        return _pinned(feature, revision), name
    standing = feature_revision(feature)
    if standing or not feature.mission.repository:
        return standing, ""
    return branch_revision(feature.mission)


def _pinned(feature: MissionFeature, revision: str) -> str:
    if FULL_COMMIT.match(revision) or not feature.mission.repository:
        return revision
    return pin_revision(feature.mission.source(), revision)


def _known_profile(name: str) -> None:
    """An unknown profile is told as such before it is told it is not allowed."""
    try:
        profiles.get_profile(name)
    except profiles.ProfileError as exc:
        raise Invalid(str(exc), code="unknown_validator", fields={"validator": [str(exc)]}) from exc


def _block(feature: MissionFeature, *, cause: str, reason: str, detail: str, actor_id: int | None) -> Admission:
    feature_transition(
        feature=feature.pk,
        old=feature.loop_state,
        new=LoopState.BLOCKED,
        cause=cause,
        actor_id=actor_id,
        reason=detail,
        fields={"stop_reason": reason, "stop_detail": detail, "stopped_at": timezone.now()},
    )
    return Admission("blocked", detail=detail)


# Only these leave `blocked` (docs/TRUTH.md): never a reuse, a task outcome or a fix.
UNBLOCKING_CAUSES = frozenset({"re_run", "resume", "source_available"})


def admit(
    *,
    feature_id: int,
    trigger: str,
    cause: str,
    actor_id: int | None = None,
    profile_name: str | None = None,
    revision: str | None = None,
    revision_name: str = "",
    force: bool = False,
    raise_conflict: bool = False,
    reason: str = "",
    mission_id: int | None = None,
) -> Admission:
    """Start (or reuse, or refuse) a validation of one feature, in the caller's transaction
    (which an exception dooms: a caller that goes on after one calls `feature_admit`).
    `revision`: what to judge instead of `judged_revision`'s choice (`revision_name`: the
    branch it was the head of, when an earlier run named one).
    `force` (operator re-run) skips fingerprint reuse and the identical-failure block.
    `mission_id`: the feature's mission, when the caller has it (one query fewer)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("admit runs inside a transaction: call feature_admit")
    if mission_id is None:
        mission_id = MissionFeature.objects.values_list("mission_id", flat=True).get(pk=feature_id)
    lock_mission(mission_id)
    feature = _LOCKED_FEATURE.get(pk=feature_id)
    if feature.mission_id != mission_id:  # a stale caller's id: lock the right mission, in order
        return feature_admit(
            feature_id=feature_id,
            trigger=trigger,
            cause=cause,
            actor_id=actor_id,
            profile_name=profile_name,
            revision=revision,
            revision_name=revision_name,
            force=force,
            raise_conflict=raise_conflict,
            reason=reason,
        )
    # Only the mission's own profiles judge it, whoever asks (docs/TRUTH.md).
    if profile_name and profile_name not in (judges := judges_of(feature.mission)):
        _known_profile(profile_name)
        raise Invalid(
            f"validator {profile_name!r} may not judge this mission; it allows: {', '.join(judges)}",
            code="validator_not_allowed",
            fields={"validator": [f"not one of the mission's profiles ({', '.join(judges)})"]},
            extra={"allowed": judges},
        )
    # Its id first (a run row carries its frozen input and verdict: large, and rarely wanted).
    running_ids = _RUNNING.all(feature=feature.pk)
    running = ValidatorRun.objects.get(pk=running_ids[0]) if running_ids else None
    if running is not None:
        if raise_conflict:
            raise Conflict(
                "a validation of this feature is already running",
                code="validation_already_running",
                extra={"run": running.pk},
            )
        return Admission("already_running", running)
    refused = _refusal(feature, cause)
    if refused is not None:
        if raise_conflict:
            raise refused
        return Admission("refused", detail=refused.detail)
    try:
        profile = profiles.get_profile(profile_name or feature.mission.validator)
    except profiles.ProfileError as exc:
        raise Invalid(str(exc), code="unknown_validator", fields={"validator": [str(exc)]}) from exc
    assertions = feature_assertion_specs(feature)
    try:
        revision, revision_name = judged_revision(feature, revision, revision_name)
        protection = mission_protection(feature.mission, assertions)
    except SnapshotError as exc:
        if raise_conflict:
            code = "unknown_revision" if isinstance(exc, UnknownRevision) else "workspace_unavailable"
            raise Invalid(str(exc), code=code) from exc
        return _block(
            feature,
            cause="workspace_unavailable",
            reason=StopReason.WORKSPACE_UNAVAILABLE,
            detail=str(exc)[:2000],
            actor_id=actor_id,
        )
    if not revision:
        raise Invalid(
            "nothing to validate: the feature has no landed task revision and the mission no repository",
            code="no_revision",
        )
    if not assertions:
        if raise_conflict:
            raise Invalid("the feature has no contract assertions to judge it by", code="no_assertions")
        return _block(
            feature,
            cause="no_assertions",
            reason=StopReason.NO_ASSERTIONS,
            detail="no contract assertions are linked: a feature never passes without them",
            actor_id=actor_id,
        )
    fingerprint = input_fingerprint(
        revision=revision,
        assertions=assertions,
        profile=profile,
        protection=protection,
        environment=run_environment(feature.mission, feature.slice.milestone),
    )
    if not force:
        # Every judged run on this input, newest first (a handful), in one query: the
        # newest decides a reuse, the failed ones count towards the block.
        judged = _JUDGED.all(feature=feature.pk, fingerprint=fingerprint)
        if judged and judged[0][1] == RunStatus.PASSED:
            reused = ValidatorRun.objects.get(pk=judged[0][0])
            return _reuse(feature, reused, trigger=trigger, actor_id=actor_id, revision_name=revision_name)
        if sum(1 for _pk, status in judged if status == RunStatus.FAILED) >= IDENTICAL_FAILURE_LIMIT:
            return _block(
                feature,
                cause="fingerprint_failures",
                reason=StopReason.FINGERPRINT,
                actor_id=actor_id,
                detail=f"the same input failed {IDENTICAL_FAILURE_LIMIT} times; change the code or the assertions",
            )
    run = start_run(
        feature=feature,
        trigger=trigger,
        cause=cause,
        profile=profile,
        revision=revision,
        revision_name=revision_name,
        fingerprint=fingerprint,
        actor_id=actor_id,
        reason=reason,
        assertions=assertions,
        protection=protection,
    )
    return Admission("started", run)


# The entry point: `admit` in a transaction of its own (a savepoint when nested).
feature_admit = transaction.atomic(admit)


def _locks_of() -> bool:
    return bool(connections[MissionFeature.objects.db].features.has_select_for_update_of)


def _locked_feature(pk: int):
    """The feature locked, with its mission and slice. `of`: the feature row is the one
    locked (the mission's is, by `lock_mission`; the slice's need not be)."""
    locked = MissionFeature.objects.select_for_update(of=("self",)) if _locks_of() else MissionFeature.objects
    return locked.select_related("mission", "slice__milestone").filter(pk=pk)


_LOCKED_FEATURE: Prepared[MissionFeature] = Prepared(_locked_feature)
_RUNNING: Prepared[int] = Prepared(
    lambda feature: ValidatorRun.objects.filter(feature_id=feature, status=RunStatus.RUNNING).values_list(
        "pk", flat=True
    )[:1]
)
# Every judged run on one input, newest first (a handful).
_JUDGED: Prepared[tuple[int, str]] = Prepared(
    lambda feature, fingerprint: (
        ValidatorRun.objects.filter(feature_id=feature, input_fingerprint=fingerprint, status__in=JUDGED)
        .order_by("-id")
        .values_list("pk", "status")
    ),
    fingerprint=str,
)


def _refusal(feature: MissionFeature, cause: str) -> Conflict | None:
    if feature.loop_state == LoopState.BLOCKED and cause not in UNBLOCKING_CAUSES:
        return Conflict(
            f"the feature is blocked ({feature.stop_reason or 'validator'}): clear or re-run it",
            code="feature_blocked",
            extra={"stop_reason": feature.stop_reason},
        )
    if feature.loop_state == LoopState.SUPERSEDED:
        return Conflict("the fix is superseded: its root passed", code="feature_superseded")
    return None


def new_run(
    *,
    feature: MissionFeature | None,
    milestone_id: int,
    trigger: str,
    validator: str,
    validator_config: dict[str, Any],
    revision: str,
    assertions: list[dict[str, Any]],
    protection: dict[str, Any],
    fingerprint: str = "",
    actor_id: int | None = None,
    mission_id: int | None = None,
    **fields: Any,
) -> ValidatorRun:
    """The one place a ValidatorRun row is made: every run carries its frozen input."""
    run_mission_id = feature.mission_id if feature else mission_id
    if run_mission_id is None:  # the column is NOT NULL: refuse before the insert fails
        raise ValueError("a milestone run (no feature) needs its mission_id")
    return ValidatorRun.objects.create(
        mission_id=run_mission_id,
        feature=feature,
        milestone_id=milestone_id,
        scope=RunScope.FEATURE if feature else RunScope.MILESTONE,
        trigger=trigger,
        validator=validator,
        validator_config=validator_config,
        revision=revision,
        input_fingerprint=fingerprint,
        assertions=assertions,
        protection=protection,
        requested_by_id=actor_id,
        sandbox=sandbox.status().record,
        **({"implementation_attempt": feature.implementation_attempts} if feature else {}),
        **fields,
    )


def run_started_event(run: ValidatorRun, *, actor_id: int | None = None, **extra: Any) -> None:
    publish_on_commit(
        run.mission_id,
        "validator-run:started",
        {
            "run": run.pk,
            "feature": run.feature_id,
            "milestone": run.milestone_id,
            "scope": run.scope,
            "trigger": run.trigger,
            "validator_attempt": run.validator_attempt,
            "implementation_attempt": run.implementation_attempt,
            "revision": run.revision,
            **({"revision_name": run.revision_name} if run.revision_name else {}),
            **extra,
        },
        actor_id=actor_id,
    )


def start_run(
    *,
    feature: MissionFeature,
    trigger: str,
    cause: str,
    profile: dict[str, Any],
    revision: str,
    fingerprint: str,
    actor_id: int | None,
    assertions: list[dict[str, Any]],
    protection: dict[str, Any],
    reason: str = "",
    revision_name: str = "",
) -> ValidatorRun:
    """Create the run, point the feature at it, move it to `validating`, queue the judge."""
    # No savepoint of its own: a refused insert refuses the whole admission, whose own
    # block (`feature_admit` is atomic: a savepoint when nested) rolls it back.
    try:
        run = new_run(
            feature=feature,
            milestone_id=feature.slice.milestone_id,
            trigger=trigger,
            validator=profile["name"],
            validator_config=profiles.public_config(profile),
            revision=revision,
            assertions=assertions,
            protection=protection,
            fingerprint=fingerprint,
            actor_id=actor_id,
            validator_attempt=feature.validator_attempts + 1,
            revision_name=revision_name,
        )
    except IntegrityError as exc:  # the database's own "one running run per feature"
        raise Conflict("a validation of this feature is already running", code="validation_already_running") from exc
    fields: dict[str, Any] = {"last_run_id": run.pk, "validator_attempts": feature.validator_attempts + 1}
    if feature.loop_state == LoopState.VALIDATING:
        MissionFeature.objects.filter(pk=feature.pk).update(
            updated_at=timezone.now(), last_run=run, validator_attempts=feature.validator_attempts + 1
        )
    else:
        fields.update(stop_reason="", stop_detail="", stopped_at=None)
        moved = feature_transition(
            feature=feature.pk,
            old=feature.loop_state,
            new=LoopState.VALIDATING,
            cause=cause,
            actor_id=actor_id,
            reason=reason,
            fields=fields,
            payload={"run": run.pk},
            mission_id=feature.mission_id,
        )
        if not moved:
            raise Conflict("the feature changed state meanwhile; try again", code="state_changed")
    run_started_event(run, actor_id=actor_id)
    queue_run(run)
    return run


def _judged(assertions: list[dict]) -> list[tuple]:
    return [(a["key"], a["statement"], canonical(a.get("check"))) for a in assertions]


def same_contract(current: list[dict], frozen: list[dict]) -> bool:
    """Whether two assertion sets judge the same thing (keys, statements, checks)."""
    return _judged(current) == _judged(frozen)


def _reuse(
    feature: MissionFeature, reused: ValidatorRun, *, trigger: str, actor_id: int | None, revision_name: str
) -> Admission:
    """`revision_name`: the branch this admission took the revision from (the reused run may have named none)."""
    now = timezone.now()
    run = new_run(
        feature=feature,
        milestone_id=feature.slice.milestone_id,
        trigger=trigger,
        validator=reused.validator,
        validator_config=reused.validator_config,
        revision=reused.revision,
        revision_name=revision_name,
        assertions=reused.assertions,
        protection=reused.protection,
        fingerprint=reused.input_fingerprint,
        actor_id=actor_id,
        status=RunStatus.PASSED,
        validator_attempt=feature.validator_attempts,
        verdict=reused.verdict,
        reused_from=reused,
        completed_at=now,
        summary=f"reused the pass of run {reused.pk} (identical input; no validator call)",
    )
    MissionFeature.objects.filter(pk=feature.pk).update(last_run=run, updated_at=now)
    feature.refresh_from_db()
    if feature.loop_state != LoopState.PASSED:  # already passed on this input: recorded, nothing moves
        # The pass's effects (fix lineage, the root's re-judgement, the autopilot) are the
        # outcome rules' (validation/services/outcomes.py), which admit runs themselves:
        # they subscribe to this hook instead of being imported (docs/ARCHITECTURE.md).
        hooks.pass_reused.send(sender=None, feature=feature, run=run, old_state=feature.loop_state)
    publish_on_commit(
        feature.mission_id,
        "validator-run:completed",
        {
            "run": run.pk,
            "feature": feature.pk,
            "status": run.status,
            "reused_from": reused.pk,
        },
    )
    return Admission("reused", run)
