"""`manage.py import_mission FILE.yaml [--owner USERNAME]`: create or update a mission from
its file (docs/MISSION_FILES.md)."""

from __future__ import annotations

import pathlib
import sys

from django.core.management.base import BaseCommand, CommandError

from missions.errors import DomainError
from missions.management.cli import add_owner_argument, find_user
from missions.services.files import mission_file_import


class Command(BaseCommand):
    help = (
        "Create or update a mission from a mission file (YAML or JSON); `-` reads standard input. "
        "--owner USERNAME makes that user the mission's owner (it sees the mission as if it had imported "
        "the file through the API); without it, a new mission has no owner (only staff see it) and an "
        "existing one keeps its owner. Every mistake of the file is printed, one per line."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="path of the mission file, or - for standard input")
        add_owner_argument(parser)

    def handle(self, *args, file: str, owner: str | None, **options) -> None:
        owner_user = find_user(owner)  # an unknown user: exit 2 before the file is read
        if file == "-":
            text, base_dir = sys.stdin.read(), pathlib.Path.cwd()
        else:
            path = pathlib.Path(file)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"cannot read {file}: {exc}") from exc
            base_dir = path.absolute().parent
        try:
            # user=None: the command line is trusted like staff (checks, executor commands).
            result = mission_file_import(document=text, base_dir=base_dir, user=None, owner=owner_user)
        except DomainError as exc:
            errors = exc.fields.get("errors") or []
            for line in errors:
                self.stderr.write(str(line))
            suffix = f" ({len(errors)} error{'s' if len(errors) != 1 else ''})" if errors else ""
            raise CommandError(f"{file}: {exc.detail}{suffix}") from exc
        outcome = "created" if result.created else "updated" if result.changed else "unchanged"
        self.stdout.write(f"imported mission {result.mission.key} ({outcome})")
