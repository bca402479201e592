"""A validator run's row and its two events (docs/ARCHITECTURE.md, "State machines").

`new_run` makes every run from its input (`run_input.RunInput`); `clone_run` makes one
over another run's frozen input (a reused pass, a retry after an error). Each event has
one payload builder: `run_started_payload`, `run_completed_payload` (published by `launch`
and `announce_completed`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusion_site.runtime import sandbox
from missions.models import MissionFeature
from missions.outbox import publish_on_commit
from missions.transitions.tables import RUN_EVENT
from validation import hooks, profiles
from validation.models import RunScope, ValidatorRun
from validation.services.queueing import queue_run
from validation.services.run_input import RunInput


@dataclass
class Admission:
    """The answer to a request for a run. A feature's (`verdicts/admit.py`): started |
    reused | blocked | already_running | refused; a milestone's (`milestones.milestone_advance`):
    started | already_running | complete | waiting | stopped."""

    outcome: str
    run: ValidatorRun | None = None
    detail: str = ""


def new_run(
    *,
    feature: MissionFeature | None,
    milestone_id: int,
    trigger: str,
    judged: RunInput,
    actor_id: int | None = None,
    mission_id: int | None = None,
    **fields: Any,
) -> ValidatorRun:
    """The one place a ValidatorRun row is made: every run carries its frozen input.
    `mission_id`: a milestone run's (a feature's run takes its feature's)."""
    return _create(
        feature=feature,
        mission_id=mission_id,
        milestone_id=milestone_id,
        trigger=trigger,
        validator=judged.profile["name"],
        validator_config=profiles.public_config(judged.profile),
        revision=judged.revision,
        revision_name=judged.revision_name,
        input_fingerprint=judged.fingerprint,
        assertions=judged.assertions,
        protection=judged.protection,
        requested_by_id=actor_id,
        **fields,
    )


def clone_run(source: ValidatorRun, *, feature: MissionFeature, **fields: Any) -> ValidatorRun:
    """A new run of `feature` over `source`'s frozen input (validator, revision, assertions,
    protection, fingerprint) and trigger; `fields` sets anything else, or overrides."""
    copied: dict[str, Any] = {
        "milestone_id": source.milestone_id,
        "trigger": source.trigger,
        "validator": source.validator,
        "validator_config": source.validator_config,
        "revision": source.revision,
        "revision_name": source.revision_name,
        "input_fingerprint": source.input_fingerprint,
        "assertions": source.assertions,
        "protection": source.protection,
    }
    return _create(feature=feature, mission_id=source.mission_id, **{**copied, **fields})


def _create(*, feature: MissionFeature | None, mission_id: int | None, **fields: Any) -> ValidatorRun:
    run_mission_id = feature.mission_id if feature else mission_id
    if run_mission_id is None:  # the column is NOT NULL: refuse before the insert fails
        raise ValueError("a milestone run (no feature) needs its mission_id")
    return ValidatorRun.objects.create(
        mission_id=run_mission_id,
        feature=feature,
        scope=RunScope.FEATURE if feature else RunScope.MILESTONE,
        sandbox=sandbox.status().record,
        **({"implementation_attempt": feature.implementation_attempts} if feature else {}),
        **fields,
    )


def run_started_payload(run: ValidatorRun, **extra: Any) -> dict[str, Any]:
    """`validator-run:started`: which run judges what (`extra`: `retry_of` for a retry)."""
    return {
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
    }


def run_completed_payload(run: ValidatorRun, **extra: Any) -> dict[str, Any]:
    """`validator-run:completed`: how the run ended (`extra`: `counts` and `tokens` of a
    verdict, `error` code, cancel `reason`, `reused_from`)."""
    return {
        "run": run.pk,
        "feature": run.feature_id,
        "milestone": run.milestone_id,
        "scope": run.scope,
        "status": run.status,
        **extra,
    }


def announce_completed(run: ValidatorRun, **extra: Any) -> None:
    """Publish the run's end after commit (`run_completed_payload`): every end of a run
    (a verdict, an error, a cancel, a reused pass) announces itself here, and to the floor
    above in the transaction (`hooks.run_ended`)."""
    publish_on_commit(run.mission_id, RUN_EVENT, run_completed_payload(run, **extra))
    hooks.run_ended.send(sender=ValidatorRun, run=run)


def launch(run: ValidatorRun, *, actor_id: int | None = None, delay_ms: int = 0, **extra: Any) -> None:
    """Announce a new running run (after commit; to the floor above in the transaction:
    `hooks.run_started`) and hand it to the runner after commit (`queueing.queue_run`)."""
    publish_on_commit(run.mission_id, "validator-run:started", run_started_payload(run, **extra), actor_id=actor_id)
    hooks.run_started.send(sender=ValidatorRun, run=run)
    queue_run(run, delay_ms=delay_ms)
