"""`ValidatorRun.status` (docs/ARCHITECTURE.md, "State machines"): a run is created
`running` (or already `passed`, for a reused pass) by `runs.new_run`, and ends once.

    running -> passed | failed | blocked | error   (its verdict or its error: verdicts/complete.py)
    running -> cancelled                           (newer evidence made it moot: fixes.py)

The end is a compare-and-swap on `running`: a late result after a reap or a cancel
changes nothing. The callers publish `validator-run:completed` with what they recorded.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from missions.errors import IllegalTransition
from missions.events import lock_mission, publish_on_commit
from validation.models import RunStatus, ValidatorRun
from validation.services.runs import run_completed_payload

ENDS = frozenset({RunStatus.PASSED, RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.ERROR, RunStatus.CANCELLED})


def run_finish(*, run: ValidatorRun, status: str, **fields: Any) -> bool:
    """End a running run with `status`. False when it had ended already (another writer won);
    True when it ended now, and then `run` holds what was written."""
    if status not in ENDS:
        raise IllegalTransition(f"a run cannot go from running to {status}", extra={"from": "running", "to": status})
    lock_mission(run.mission_id)
    now = timezone.now()
    written = {"status": status, "completed_at": now, "updated_at": now, **fields}
    updated = ValidatorRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(**written)
    if updated:
        for name, value in written.items():
            setattr(run, name, value)
    return bool(updated)


def run_cancel(*, run: ValidatorRun, reason: str) -> bool:
    """Newer evidence or a newer input makes a running judgement moot: it ends `cancelled`
    (spending nothing); its late result, if its worker is still on it, changes nothing."""
    if not run_finish(run=run, status=RunStatus.CANCELLED, summary=reason[:500]):
        return False
    publish_on_commit(run.mission_id, "validator-run:completed", run_completed_payload(run, reason=reason[:300]))
    return True
