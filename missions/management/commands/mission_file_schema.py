"""`manage.py mission_file_schema`: print the JSON schema of a mission file (docs/MISSION_FILES.md).

The committed copy is its output: `python manage.py mission_file_schema > docs/mission-file.schema.json`.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from missions.services.files import mission_file_json_schema


class Command(BaseCommand):
    help = "Print the JSON schema of a mission file, generated from its declaration (docs/mission-file.schema.json)."

    def handle(self, *args, **options) -> None:
        self.stdout.write(json.dumps(mission_file_json_schema(), indent=2))
