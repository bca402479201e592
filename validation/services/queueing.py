"""Every message the validation services send, by actor name after commit
(`fusion_site.runtime.queue`): the actor modules import the services, never the reverse."""

from __future__ import annotations

from django.conf import settings

from fusion_site.runtime.queue import send_on_commit
from missions.locks import autopilot_running_under_lock
from validation.models import ValidatorRun


def run_time_limit_ms(run: ValidatorRun) -> int:
    """The actor's time limit for one run, derived from what it may legitimately take: its
    checks' own limits (run one after another at worst) plus the validator's timeout."""
    checks = sum(
        min(float((a.get("check") or {}).get("timeout", settings.FUSION_CHECK_TIMEOUT)), 3600)
        for a in run.assertions
        if (a.get("check") or {}).get("run")
    )
    return int((settings.FUSION_VALIDATOR_TIMEOUT + checks + 60) * 1000)


def queue_run(run: ValidatorRun, delay_ms: int = 0) -> None:
    """Judge `run` (after `delay_ms`), with the actor's time limit derived from the run."""
    send_on_commit("run_validator", run.pk, delay_ms=delay_ms or None, time_limit=run_time_limit_ms(run))


def autopilot_notify(mission_id: int) -> None:
    """Let the autopilot look at the mission again (a no-op when it is off or the mission
    is not active: `autopilot_advance` checks under the mission's lock).

    A caller that holds the mission's lock sends nothing when the autopilot is off or the
    mission is not active (every verdict notifies: a message per feature for nothing).
    What it reads cannot change before it commits: switching the autopilot on, activating,
    resuming or reopening the mission writes the mission's row, so it waits for this
    transaction, and notifies after its own commit, which sees this one's changes."""
    if autopilot_running_under_lock(mission_id) is False:
        return
    send_on_commit("autopilot_advance", mission_id)


def send_task_outcome(task_id: int) -> None:
    send_on_commit("process_task_outcome", task_id)
