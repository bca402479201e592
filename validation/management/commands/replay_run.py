"""`manage.py replay_run RUN [--json]`: re-run a validator run from its journal alone.

Exit codes: 0 the replay reproduced the run (same outcome, same verdict hash);
1 it did not (a request missing from the journal, a divergent decision, another hash);
2 the journal's hash chain does not verify (the first bad entry is named)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from validation.journal import JournalIntegrityError
from validation.models import ValidatorRun
from validation.replay import replay_run


class Command(BaseCommand):
    help = "Replay a validator run from its journal (no live model, tool or check call) and verify its verdict hash."

    def add_arguments(self, parser):
        parser.add_argument("run", type=int, help="validator run id")
        parser.add_argument("--json", action="store_true", help="print a machine-readable result")

    def handle(self, *args, run: int, json: bool, **options):
        if not ValidatorRun.objects.filter(pk=run).exists():
            raise CommandError(f"no validator run {run}")
        try:
            report = replay_run(run)
        except JournalIntegrityError as exc:
            self._integrity(run, exc, as_json=json)
            raise SystemExit(2) from None  # reported just above
        if json:
            self.stdout.write(_dumps(report.as_dict()))
        else:
            self._print(report)
        raise SystemExit(0 if report.ok else 1)

    def _integrity(self, run: int, exc: JournalIntegrityError, *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(_dumps({"run": run, "ok": False, "integrity_error": str(exc), "first_bad_seq": exc.seq}))
        else:
            self.stderr.write(f"run {run}: journal integrity error: {exc}")

    def _print(self, report) -> None:
        head = "reproduced" if report.ok else "NOT reproduced"
        self.stdout.write(
            f"run {report.run}: {head} (recorded {report.recorded_status}, replayed {report.replayed}"
            + (f" {report.error_code}" if report.error_code else "")
            + ")"
        )
        self.stdout.write(f"journal: {report.chain_entries} entries, chain verified")
        if report.verdict_sha256:
            self.stdout.write(f"verdict sha256: {report.verdict_sha256}")
            self.stdout.write(f"accepted sha256: {report.recorded_sha256 or '(none journaled)'}")
        for problem in report.problems:
            self.stdout.write(f"problem: {problem}")
        for note in report.notes:
            self.stdout.write(f"note: {note}")


def _dumps(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True)
