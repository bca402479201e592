"""`ValidatorRun.status` (docs/ARCHITECTURE.md, "State machines"): its table is
`missions.transitions.tables.RUN`, moved by the plan's engine (`missions.transitions.machine`).
A run is created `running` (or already `passed`, for a reused pass) by `runs.new_run`, and
ends once: by its verdict or its error (`verdicts/complete.py`), or cancelled when newer
evidence made it moot (`run_cancel`).

The end is a compare-and-swap on `running`: a late result after a reap or a cancel
changes nothing. The engine publishes no event for it: the caller publishes
`validator-run:completed` (`runs.announce_completed`) with what the end recorded, after it.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from missions.transitions import tables
from missions.transitions.machine import Machine, move
from validation.models import RunStatus, ValidatorRun
from validation.services.runs import announce_completed

RUN = Machine(name="run", model=ValidatorRun, field="status", table=tables.RUN, publishes=False)


def run_finish(*, run: ValidatorRun, status: str, cause: str, **fields: Any) -> bool:
    """End a running run with `status` by `cause` (`verdict`, `error` or `cancel`). False
    when it had ended already (another writer won); True when it ended now, and then `run`
    holds what was written. A status or cause the table does not allow raises
    `IllegalTransition`."""
    return move(
        RUN,
        pk=run.pk,
        old=RunStatus.RUNNING,
        new=status,
        cause=cause,
        fields={"completed_at": timezone.now(), **fields},
        mission_id=run.mission_id,
        instance=run,
    )


def run_cancel(*, run: ValidatorRun, reason: str) -> bool:
    """Newer evidence or a newer input makes a running judgement moot: it ends `cancelled`
    (spending nothing); its late result, if its worker is still on it, changes nothing."""
    if not run_finish(run=run, status=RunStatus.CANCELLED, cause="cancel", summary=reason[:500]):
        return False
    announce_completed(run, reason=reason[:300])
    return True
