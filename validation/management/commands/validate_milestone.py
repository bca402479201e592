"""`manage.py validate_milestone MILESTONE [--mission KEY] [--sync] [--timeout S] [--user NAME]`

Validate one milestone now, as `POST /api/milestones/{id}/validate/` does (docs/TRUTH.md):
once every feature under it is done, its slices complete and a milestone run judges its
assertions; a pass completes the milestone, and the mission with its last milestone.
MILESTONE is an id, a key or MISSION/KEY; `--mission KEY` names the mission of a key.

Exit codes: 0 the milestone passed (or is complete without a new run), 1 its run failed,
2 blocked or error, or nothing was judged: the request was refused (a feature is not done,
the mission is not active, ...) or the milestone or user is unknown.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from rich.console import Console

from missions.errors import DomainError
from missions.management.cli import add_user_argument, find_milestone, find_user
from missions.models import Milestone
from validation.management.runs import NOT_JUDGED, exit_code, print_run, wait_for_run
from validation.services.operator import milestone_validate


class Command(BaseCommand):
    help = (
        "Validate one milestone now and print the verdict per assertion. "
        "Exit codes: 0 pass (or complete), 1 fail, 2 blocked, error, refused or unknown."
    )

    def add_arguments(self, parser):
        parser.add_argument("milestone", help="milestone id, key, or MISSION/KEY")
        parser.add_argument("--mission", default=None, help="the key of the milestone's mission")
        parser.add_argument("--sync", action="store_true", help="run the validator in this process")
        parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for a queued run")
        add_user_argument(parser)

    def handle(self, *args, milestone: str, mission: str | None, sync: bool, timeout: float, username, **options):
        # OutputWrapper is a file-like TextIOBase; typeshed's TextIOBase is no IO[str].
        console = Console(file=self.stdout, highlight=False)  # type: ignore[arg-type]
        target = find_milestone(milestone, mission)
        user = find_user(username)
        name = f"{target.mission.key}/{target.key}"
        try:
            step = milestone_validate(milestone_id=target.pk, actor_id=getattr(user, "pk", None))
        except DomainError as exc:
            raise CommandError(f"cannot validate {name}: {exc.detail} [{exc.code}]", returncode=NOT_JUDGED) from exc
        run = step.run
        if run is None:
            console.print(f"milestone {name}: {step.detail}")
            return
        console.print(f"run {run.pk} for milestone {name} ({step.outcome}, validator {run.validator})")
        if step.outcome != "complete":
            run = wait_for_run(run, sync=sync, timeout=timeout, console=console)
        print_run(run, console)
        after = Milestone.objects.select_related("mission").get(pk=target.pk)
        console.print(f"milestone {name}: {after.status}; mission {after.mission.key}: {after.mission.status}")
        raise SystemExit(exit_code(run))
