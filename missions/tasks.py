"""Mission actors: the autopilot and the `command` task executor."""

from __future__ import annotations

import dramatiq


@dramatiq.actor(max_retries=5, min_backoff=500, max_backoff=10_000, time_limit=120_000, queue_name="fusion")
def autopilot_advance(mission_id: int) -> None:
    from missions.services.autopilot import autopilot_advance as advance

    # Each step may unlock the next (slice complete -> next slice); loop until it rests.
    for _ in range(20):
        if advance(mission_id=mission_id) not in ("activated", "complete_slice"):
            break


@dramatiq.actor(max_retries=0, time_limit=3_600_000, queue_name="fusion")
def execute_task(task_id: int) -> None:
    from missions.services.executor import task_execute

    task_execute(task_id=task_id)
