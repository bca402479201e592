"""Step 3, start (the order: `verdicts/__init__.py`): an admitted feature's run is made,
the feature points at it and is `validating`, and the run goes to the runner after commit
(step 4, `validation/services/runner.py`)."""

from __future__ import annotations

from django.db import IntegrityError
from django.utils import timezone

from missions.errors import Conflict
from missions.models import LoopState, MissionFeature
from missions.transitions.loop import feature_transition
from validation.models import ValidatorRun
from validation.services.run_input import RunInput
from validation.services.runs import launch, new_run


def start_run(
    *,
    feature: MissionFeature,
    judged: RunInput,
    trigger: str,
    cause: str,
    actor_id: int | None,
    reason: str = "",
) -> ValidatorRun:
    """Create the run, point the feature at it, move it to `validating`, and hand the run
    to the runner (`runs.launch`, after commit)."""
    # No savepoint of its own: a refused insert refuses the whole admission, whose own
    # block (`feature_admit` is atomic: a savepoint when nested) rolls it back.
    try:
        run = new_run(
            feature=feature,
            milestone_id=feature.slice.milestone_id,
            trigger=trigger,
            judged=judged,
            actor_id=actor_id,
            validator_attempt=feature.validator_attempts + 1,
        )
    except IntegrityError as exc:  # the database's own "one running run per feature"
        raise Conflict("a validation of this feature is already running", code="validation_already_running") from exc
    attempts = feature.validator_attempts + 1
    if feature.loop_state == LoopState.VALIDATING:
        MissionFeature.objects.filter(pk=feature.pk).update(
            updated_at=timezone.now(), last_run=run, validator_attempts=attempts
        )
    elif not feature_transition(
        feature=feature.pk,
        old=feature.loop_state,
        new=LoopState.VALIDATING,
        cause=cause,
        actor_id=actor_id,
        reason=reason,
        fields={
            "last_run_id": run.pk,
            "validator_attempts": attempts,
            "stop_reason": "",
            "stop_detail": "",
            "stopped_at": None,
        },
        payload={"run": run.pk},
        mission_id=feature.mission_id,
    ):
        raise Conflict("the feature changed state meanwhile; try again", code="state_changed")
    launch(run, actor_id=actor_id)
    return run
