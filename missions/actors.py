"""Mission actors: the `command` task executor. Services send to it by name
(`fusion_site.runtime.queue`), so this module may import them."""

from __future__ import annotations

import dramatiq

from missions.services.executor import task_execute

# A safety net only: the command has its own timeout (FUSION_EXECUTOR_TIMEOUT), and a task
# may first wait for the mission's previous task (one at a time) under a renewed lease.
TIME_LIMIT_MS = 24 * 3_600_000


@dramatiq.actor(max_retries=0, time_limit=TIME_LIMIT_MS, queue_name="fusion")
def execute_task(task_id: int) -> None:
    # Idempotent: a delivery for a task another delivery holds, or a finished one, is stale.
    task_execute(task_id=task_id)
