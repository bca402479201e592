"""`manage.py plan SPEC.md [--profile NAME]`: a mission file drafted from a specification by
the configured model, printed as YAML for a person to review; it never applies anything
(docs/MISSION_FILES.md, "Drafting a file")."""

from __future__ import annotations

import pathlib
import sys

from django.core.management.base import BaseCommand, CommandError

from validation.profiles import ProfileError
from validation.services.drafting import mission_draft


class Command(BaseCommand):
    help = (
        "Draft a mission file from a specification (a text file; - reads standard input) with the model of an "
        "agent validator profile (--profile; default: the default profile's agent) and print it as YAML. "
        "Nothing is imported: review it, then plan and apply it (POST /api/missions/plan/, MCP mission_plan) or "
        "import it (import_mission)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("spec", help="path of the specification, or - for standard input")
        parser.add_argument("--profile", default=None, help="the agent validator profile whose model drafts")

    def handle(self, *args, spec: str, profile: str | None, **options) -> None:
        try:
            text = sys.stdin.read() if spec == "-" else pathlib.Path(spec).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {spec}: {exc}") from exc
        if not text.strip():
            raise CommandError(f"{spec}: the specification is empty")
        try:
            draft = mission_draft(spec=text, profile=profile)
        except ProfileError as exc:
            raise CommandError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 — the model's client: its failure, said in one line
            raise CommandError(f"the model did not draft a mission file: {type(exc).__name__}: {exc}") from exc
        self.stdout.write(draft.text, ending="")
