"""What the validating commands (`validate_feature`, `validate_milestone`) share: waiting
for a run's verdict, printing it, and the exit code it means (0 pass, 1 fail, 2 blocked
or error)."""

from __future__ import annotations

import time

from django.core.management.base import CommandError
from rich.console import Console
from rich.table import Table

from validation.models import RunStatus, ValidatorRun
from validation.services.runner import execute_run

# By run status (a str: the choices compare and hash as their values).
EXIT: dict[str, int] = {RunStatus.PASSED: 0, RunStatus.FAILED: 1}
NOT_JUDGED = 2  # blocked, error, or no verdict at all


def exit_code(run: ValidatorRun) -> int:
    return EXIT.get(run.status, NOT_JUDGED)


def wait_for_run(run: ValidatorRun, *, sync: bool, timeout: float, console: Console) -> ValidatorRun:
    """The run once it has ended: judged in this process (`sync`; a run another process
    is judging is waited for), or by a worker, within `timeout` seconds."""
    if sync:
        with console.status("validating…"):
            execute_run(run.pk)
    deadline = time.monotonic() + timeout
    with console.status("waiting for a worker…"):
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.status != RunStatus.RUNNING:
                return run
            time.sleep(0.5)
    raise CommandError(f"run {run.pk} is still running after {timeout:g}s (is a worker running?)")


def print_run(run: ValidatorRun, console: Console) -> None:
    table = Table(title=f"run {run.pk}: {run.status}")
    for column in ("assertion", "verdict", "message"):
        table.add_column(column)
    for item in (run.verdict or {}).get("assertions", []):
        table.add_row(item["key"], item["verdict"], item.get("message", "")[:120])
    console.print(table)
    if run.error:
        console.print(f"error: {run.error}")
    if run.blocked_reason:
        console.print(f"blocked: {run.blocked_reason}")
