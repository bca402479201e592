"""Dramatiq actors: thin, ids in, re-fetch, bail out when stale, explicit retries.

Services send to these by name (`fusion_site.runtime.queue.send_on_commit`), never by
importing this module, so the actors may import the services they wrap."""

from __future__ import annotations

import logging

import dramatiq
from django.conf import settings

from validation.services.autopilot import autopilot_advance as advance
from validation.services.recovery import recover
from validation.services.runner import execute_run
from validation.services.verdicts.task import task_outcome_process

logger = logging.getLogger(__name__)

# A run may first build its environment (docs/ENVIRONMENTS.md), then judge.
RUN_TIME_LIMIT_MS = (settings.FUSION_VALIDATOR_TIMEOUT + settings.FUSION_ENV_BUILD_TIMEOUT + 60) * 1000


@dramatiq.actor(max_retries=5, min_backoff=500, max_backoff=10_000, time_limit=120_000, queue_name="fusion")
def autopilot_advance(mission_id: int) -> None:
    # Each step may unlock the next (slice complete -> next slice); loop until it rests.
    for _ in range(20):
        if advance(mission_id=mission_id) not in ("activated", "complete_slice"):
            break


@dramatiq.actor(max_retries=3, min_backoff=1000, max_backoff=30_000, time_limit=120_000, queue_name="fusion")
def process_task_outcome(task_id: int) -> None:
    task_outcome_process(task_id=task_id)


@dramatiq.actor(max_retries=3, min_backoff=1000, max_backoff=30_000, time_limit=RUN_TIME_LIMIT_MS, queue_name="fusion")
def run_validator(run_id: int) -> None:
    execute_run(run_id)


@dramatiq.actor(max_retries=0, time_limit=300_000, queue_name="fusion")
def recovery_sweep(startup: bool = False) -> None:
    report = recover(startup=startup)
    if any(report.values()):
        logger.info("recovery sweep: %s", report)


# rundramatiq imports only this module: the review actors register by being imported here.
from validation.review.pipeline import review_candidate, review_evaluate, review_render, review_start  # noqa: E402,F401
