"""`manage.py mission activate|pause|resume|autopilot-on|autopilot-off|status MISSION [--user NAME]`

MISSION is a mission key or id. The lifecycle rules are those of the API (docs/COMMANDS.md):
activate from planning or blocked, pause from active or blocked, resume all-or-nothing.

Exit codes: 0 done; 1 refused by the rules (a resume conflict lists every blocker on
standard error, with the repair that clears it); 2 unknown mission or user.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from missions.errors import DomainError
from missions.management.cli import add_user_argument, find_mission, find_user, refused
from missions.models import Mission
from missions.services import lifecycle

ACTIONS = {
    "activate": lambda mission, user: lifecycle.mission_activate(mission=mission, user=user),
    "pause": lambda mission, user: lifecycle.mission_pause(mission=mission, user=user),
    "resume": lambda mission, user: lifecycle.mission_resume(mission=mission, user=user),
    "autopilot-on": lambda mission, user: lifecycle.mission_set_autopilot(mission=mission, user=user, enabled=True),
    "autopilot-off": lambda mission, user: lifecycle.mission_set_autopilot(mission=mission, user=user, enabled=False),
}


def describe(mission: Mission) -> str:
    text = (
        f"mission {mission.key} (id {mission.pk}): {mission.status}, autopilot {'on' if mission.autopilot else 'off'}"
    )
    return f"{text} — {mission.status_reason}" if mission.status_reason else text


class Command(BaseCommand):
    help = (
        "Change a mission's lifecycle (activate, pause, resume) or its autopilot, or show its status. "
        "Exit codes: 0 done, 1 refused by the rules, 2 unknown mission or user."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=[*ACTIONS, "status"])
        parser.add_argument("mission", help="mission key or id")
        add_user_argument(parser)

    def handle(self, *args, action: str, mission: str, username: str | None, **options):
        target = find_mission(mission)
        user = find_user(username)
        if action == "status":
            self.stdout.write(describe(target))
            self._print_blockers(lifecycle.resume_blockers(target), self.stdout)
            return
        try:
            target = ACTIONS[action](target, user)
        except DomainError as exc:
            self._print_blockers(exc.extra.get("blockers") or [], self.stderr)
            raise refused(exc, prefix=f"cannot {action} mission {target.key}: ") from exc
        self.stdout.write(describe(target))

    def _print_blockers(self, blockers: list[dict], out) -> None:
        for b in blockers:
            out.write(
                f"  blocker: feature {b['key']} (id {b['feature']}): {b['reason']} since {b['since'] or 'unknown'}"
                f" — repair it: manage.py repair_feature {b['feature']} --mode clear|re_run --reason ..."
            )
