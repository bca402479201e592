"""`manage.py validate_feature FEATURE [--sync] [--validator PROFILE]`

Exit codes: 0 pass, 1 fail, 2 blocked or error."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from rich.console import Console
from rich.table import Table

from missions.errors import DomainError
from missions.management.cli import feature_by_ref
from validation.models import RunStatus, ValidatorRun
from validation.services.admission import feature_admit
from validation.services.runner import execute_run

# By run status (a str: the choices compare and hash as their values).
EXIT: dict[str, int] = {RunStatus.PASSED: 0, RunStatus.FAILED: 1}


class Command(BaseCommand):
    help = "Validate one feature now and print the verdict per assertion."

    def add_arguments(self, parser):
        parser.add_argument("feature", help="feature id, key, or MISSION/KEY")
        parser.add_argument("--sync", action="store_true", help="run the validator in this process")
        parser.add_argument("--validator", default=None, help="validator profile (overrides the mission's)")
        parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for a queued run")

    def handle(self, *args, feature: str, sync: bool, validator: str | None, timeout: float, **options):
        # OutputWrapper is a file-like TextIOBase; typeshed's TextIOBase is no IO[str].
        console = Console(file=self.stdout, highlight=False)  # type: ignore[arg-type]
        target = feature_by_ref(feature)
        try:
            admission = feature_admit(
                feature_id=target.pk, trigger="manual", cause="validate", profile_name=validator, raise_conflict=True
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        if admission.run is None:
            console.print(f"{target.key}: {admission.outcome} {admission.detail}")
            raise SystemExit(2)
        run = admission.run
        console.print(f"run {run.pk} for {target.key} ({admission.outcome}, validator {run.validator})")
        if run.revision_note:
            console.print(f"revision: {run.revision_note}")
        if admission.outcome == "started":
            run = self._wait(run, sync=sync, timeout=timeout, console=console)
        self._print(run, console)
        raise SystemExit(EXIT.get(run.status, 2))

    def _wait(self, run: ValidatorRun, *, sync: bool, timeout: float, console: Console) -> ValidatorRun:
        if sync:
            with console.status("validating…"):
                execute_run(run.pk)
            return ValidatorRun.objects.get(pk=run.pk)
        deadline = time.monotonic() + timeout
        with console.status("waiting for a worker…"):
            while time.monotonic() < deadline:
                run.refresh_from_db()
                if run.status != RunStatus.RUNNING:
                    return run
                time.sleep(0.5)
        raise CommandError(f"run {run.pk} is still running after {timeout:g}s (is a worker running?)")

    def _print(self, run: ValidatorRun, console: Console) -> None:
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
