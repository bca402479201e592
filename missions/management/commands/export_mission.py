"""`manage.py export_mission MISSION [--output FILE]`: write a mission as its file (docs/MISSION_FILES.md)."""

from __future__ import annotations

import pathlib

from django.core.management.base import BaseCommand, CommandError

from missions.models import Mission
from missions.services.files import mission_export


class Command(BaseCommand):
    help = "Write a mission (by key or id) as a mission file (YAML) to standard output or --output."

    def add_arguments(self, parser) -> None:
        parser.add_argument("mission", help="mission key or id")
        parser.add_argument("--output", "-o", help="write to this file instead of standard output")

    def handle(self, *args, mission: str, output: str | None, **options) -> None:
        found = Mission.objects.filter(key=mission).first()
        if found is None and mission.isdigit():
            found = Mission.objects.filter(pk=int(mission)).first()
        if found is None:
            raise CommandError(f"no mission with key or id {mission!r}")
        text = mission_export(mission=found)
        if output is None:
            self.stdout.write(text, ending="")
            return
        try:
            pathlib.Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write {output}: {exc}") from exc
        self.stdout.write(f"exported mission {found.key} to {output}")
