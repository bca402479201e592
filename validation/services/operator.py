"""Operator actions on a feature (docs/TRUTH.md); each names the user in the audit log."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q

from missions.errors import Conflict, Invalid
from missions.events import lock_mission
from missions.models import LoopState, MissionFeature, MissionStatus
from missions.services.judging import same_base
from missions.transitions.loop import feature_transition
from validation.models import FixLineage, RunStatus, ValidatorRun
from validation.services.admission import Admission, feature_admit, feature_assertion_specs, same_contract
from validation.services.fixes import fix_for_failure
from validation.services.queueing import autopilot_notify

REPAIRABLE = (LoopState.BLOCKED, LoopState.PASSED, LoopState.NEEDS_FIX)


def _require_active(feature: MissionFeature) -> None:
    if feature.mission.status != MissionStatus.ACTIVE:
        raise Conflict(
            f"the mission is {feature.mission.status}; activate or resume it first", code="mission_not_active"
        )


def feature_validate(*, feature: MissionFeature, user, profile: str | None = None) -> Admission:
    _require_active(feature)
    return feature_admit(
        feature_id=feature.pk,
        trigger="manual",
        cause="validate",
        actor_id=getattr(user, "pk", None),
        profile_name=profile,
        raise_conflict=True,
    )


@transaction.atomic
def feature_repair(*, feature: MissionFeature, user, mode: str, reason: str = "") -> Admission | None:
    lock_mission(feature.mission_id)
    feature = MissionFeature.objects.select_for_update().select_related("mission").get(pk=feature.pk)
    actor_id = getattr(user, "pk", None)
    if ValidatorRun.objects.filter(feature=feature, status=RunStatus.RUNNING).exists():
        raise Conflict("a validation of this feature is running; wait for it", code="validation_already_running")
    if feature.loop_state not in REPAIRABLE:
        raise Conflict(
            f"a feature that is {feature.loop_state} needs no repair",
            code="not_repairable",
            extra={"loop_state": feature.loop_state},
        )
    if mode == "clear":
        has_task = feature.tasks.exists()
        feature_transition(
            feature=feature.pk,
            old=feature.loop_state,
            new=LoopState.IMPLEMENTING,
            cause="clear",
            actor_id=actor_id,
            reason=reason,
            fields={
                "implementation_attempts": 1 if has_task else 0,
                "validator_attempts": 0,
                "fix_rounds": 0,
                "stop_reason": "",
                "stop_detail": "",
                "stopped_at": None,
            },
        )
        autopilot_notify(feature.mission_id)  # it makes the new task when the mission runs itself
        return None
    if mode == "re_run":
        _require_active(feature)
        return feature_admit(
            feature_id=feature.pk,
            trigger="manual",
            cause="re_run",
            actor_id=actor_id,
            force=True,
            raise_conflict=True,
            reason=reason,
        )
    raise Invalid("mode must be clear or re_run", code="invalid_mode", fields={"mode": ["must be clear or re_run"]})


@transaction.atomic
def feature_create_fix(*, feature: MissionFeature, user) -> MissionFeature:
    lock_mission(feature.mission_id)
    feature = MissionFeature.objects.select_for_update().get(pk=feature.pk)
    run = feature.last_run
    if feature.loop_state != LoopState.NEEDS_FIX or run is None or run.status != RunStatus.FAILED:
        raise Conflict("only a feature whose last validation failed needs a fix", code="no_failure")
    if FixLineage.objects.filter(source=feature, run=run).exists():
        raise Conflict("a fix for this failure exists already", code="fix_exists")
    fix = fix_for_failure(source_id=feature.pk, run_id=run.pk, actor_id=getattr(user, "pk", None))
    if fix is None:
        raise Conflict("the retry budget is used up; the feature is blocked", code="budget_exhausted")
    return fix


def revalidate_changed_contracts(*, milestone_ids: list[int], cause: str) -> list[int]:
    """A `passed` feature whose linked assertion set (keys, statements, checks) is no
    longer the one its passing run judged is not passed any more (docs/TRUTH.md): it is
    judged again now when its mission is active, else it waits `idle` (its status stays
    done, so the recovery sweep judges it once the mission is active)."""
    candidates = (
        MissionFeature.objects.filter(loop_state=LoopState.PASSED, last_run__isnull=False)
        .filter(Q(slice__milestone_id__in=milestone_ids) | Q(assertions__milestone_id__in=milestone_ids))
        .select_related("mission", "last_run")
        .distinct()
    )
    moved = []
    for feature in candidates:
        judged = feature.last_run
        assert judged is not None  # last_run__isnull=False above
        # Its assertions, or the base its protected files are compared with (a person moved it).
        if same_contract(feature_assertion_specs(feature), judged.assertions) and same_base(
            judged.protection, feature.mission.base_commit
        ):
            continue
        if not feature_transition(
            feature=feature.pk,
            old=LoopState.PASSED,
            new=LoopState.IDLE,
            cause="contract_changed",
            reason=f"what it is judged by changed ({cause}); it is judged again",
        ):
            continue
        moved.append(feature.pk)
        if feature.mission.status == MissionStatus.ACTIVE:
            feature_admit(feature_id=feature.pk, trigger="manual", cause="contract_changed")
    return moved
