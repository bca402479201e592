"""Operator actions on a feature or a milestone (docs/TRUTH.md); each names the user in
the audit log."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q

from missions.errors import Conflict, Invalid, NotFound
from missions.locks import lock_mission
from missions.models import LoopState, Milestone, Mission, MissionFeature, MissionStatus, SliceStatus
from missions.services.verdict_settings import same_base
from missions.transitions import feature_transition, slice_transition
from missions.transitions.progress import milestone_activate, mission_complete, slice_activate
from validation.models import FixLineage, RunStatus, ValidatorRun
from validation.services.fixes import fix_for_failure
from validation.services.milestones import milestone_advance, open_dependencies, open_features
from validation.services.queueing import autopilot_notify
from validation.services.run_input import feature_assertion_specs, same_contract
from validation.services.runs import Admission
from validation.services.verdicts.admit import admit_or_raise, feature_admit, rerun

REPAIRABLE = (LoopState.BLOCKED, LoopState.PASSED, LoopState.NEEDS_FIX)


def _require_active(mission: Mission) -> None:
    if mission.status != MissionStatus.ACTIVE:
        raise Conflict(f"the mission is {mission.status}; activate or resume it first", code="mission_not_active")


def feature_validate(*, feature: MissionFeature, user, profile: str | None = None) -> Admission:
    _require_active(feature.mission)
    return admit_or_raise(
        feature_id=feature.pk,
        trigger="manual",
        cause="validate",
        actor_id=getattr(user, "pk", None),
        profile_name=profile,
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
        _require_active(feature.mission)
        return rerun(feature_id=feature.pk, trigger="manual", cause="re_run", actor_id=actor_id, reason=reason)
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


@transaction.atomic
def milestone_validate(*, milestone_id: int, actor_id: int | None) -> Admission:
    """A person asks for a milestone's validation: what the autopilot does for one
    milestone, on request. Refused, changing nothing, unless the mission is active, the
    milestones this one depends on are complete and every feature under it is done. Then
    its slices complete (a pending one starts first, with its milestone, as the autopilot
    starts it) and `milestone_advance` decides: `complete` (no assertions, or a run over
    exactly its current input passed), `already_running`, or `started` (a new milestone
    run; also after a failed, blocked or errored run over the same input: a person asked
    again); a milestone being judged is under way (`active`). A milestone that completes here, or when its run passes
    (`milestones.milestone_run_completed`), completes the mission when it was the last."""
    mission_id = Milestone.objects.filter(pk=milestone_id).values_list("mission_id", flat=True).first()
    if mission_id is None:
        raise NotFound(f"no milestone {milestone_id}")
    lock_mission(mission_id)
    milestone = Milestone.objects.select_related("mission").get(pk=milestone_id)
    _require_active(milestone.mission)
    _require_ready(milestone)
    for slice_ in milestone.slices.exclude(status=SliceStatus.COMPLETE).order_by("order", "id"):
        if slice_.status == SliceStatus.PENDING:
            slice_activate(slice_=slice_, actor_id=actor_id)
        slice_transition(
            slice_=slice_.pk, old=SliceStatus.ACTIVE, new=SliceStatus.COMPLETE, cause="complete", actor_id=actor_id
        )
    step = milestone_advance(milestone=milestone, asked=True, actor_id=actor_id)
    if step.outcome == "complete":
        done = mission_complete(mission_id=mission_id, actor_id=actor_id)
        step.detail = f"milestone {milestone.key} is complete" + ("; so is the mission" if done else "")
        return step
    milestone_activate(milestone_id=milestone.pk, actor_id=actor_id)  # under way (no slice started it)
    if step.run is not None:  # started, or already running
        step.detail = f"milestone run {step.run.pk} judges {milestone.key} at {step.run.revision[:12]}"
    return step


def _require_ready(milestone: Milestone) -> None:
    deps = list(open_dependencies(milestone).order_by("order", "id").values("id", "key", "status"))
    if deps:
        raise Conflict(
            f"milestone {milestone.key} depends on milestones that are not complete: "
            + ", ".join(f"{d['key']} ({d['status']})" for d in deps),
            code="dependencies_open",
            extra={"dependencies": deps},
        )
    features = list(open_features(milestone).order_by("slice__order", "order", "id").values("id", "key", "loop_state"))
    if features:
        shown = ", ".join(f"{f['key']} ({f['loop_state']})" for f in features[:20])
        more = f" and {len(features) - 20} more" if len(features) > 20 else ""
        raise Conflict(
            f"features of milestone {milestone.key} are not done (passed, or superseded): {shown}{more}",
            code="features_open",
            extra={"features": features},
        )


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
