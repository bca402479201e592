"""`manage.py validate_feature FEATURE [--sync] [--validator PROFILE]`

Exit codes: 0 pass, 1 fail, 2 blocked or error."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from rich.console import Console

from missions.errors import DomainError
from missions.management.cli import feature_by_ref
from validation.management.runs import NOT_JUDGED, exit_code, print_run, wait_for_run
from validation.services.verdicts.admit import admit_or_raise


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
            admission = admit_or_raise(feature_id=target.pk, trigger="manual", cause="validate", profile_name=validator)
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        if admission.run is None:
            console.print(f"{target.key}: {admission.outcome} {admission.detail}")
            raise SystemExit(NOT_JUDGED)
        run = admission.run
        console.print(f"run {run.pk} for {target.key} ({admission.outcome}, validator {run.validator})")
        if run.revision_note:
            console.print(f"revision: {run.revision_note}")
        if admission.outcome == "started":
            run = wait_for_run(run, sync=sync, timeout=timeout, console=console)
        print_run(run, console)
        raise SystemExit(exit_code(run))
