"""`manage.py transition_tables [--check]`: write the state machines' tables into the docs
(docs/ARCHITECTURE.md, docs/TRUTH.md) between their `<!-- transitions:NAME -->` markers,
from `missions/transitions/tables.py`; `--check` writes nothing and fails when a doc
differs from what it would write."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from missions.management.transition_docs import stale_docs


class Command(BaseCommand):
    help = "Write the state machines' tables into docs/ARCHITECTURE.md and docs/TRUTH.md (--check: only compare)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--check", action="store_true", help="write nothing; fail when a doc is out of date")

    def handle(self, *args, check: bool = False, **options) -> None:
        stale = stale_docs(settings.BASE_DIR, write=not check)
        if check and stale:
            raise CommandError(f"out of date (run manage.py transition_tables): {', '.join(stale)}")
        for relative in stale:
            self.stdout.write(f"wrote {relative}")
