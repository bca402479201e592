"""Mission actors: the `command` task executor. Services send to it by name
(`fusion_site.base.queue`), so this module may import them."""

from __future__ import annotations

import dramatiq

from missions.services.executor import task_execute


@dramatiq.actor(max_retries=0, time_limit=3_600_000, queue_name="fusion")
def execute_task(task_id: int) -> None:
    task_execute(task_id=task_id)
