"""`manage.py repair_feature FEATURE --mode clear|re_run --reason TEXT [--user NAME]`

The operator's repair (docs/TRUTH.md; docs/ARCHITECTURE.md, "State machines"): `clear` puts the feature back to implementing with
its counters and fix rounds reset; `re_run` starts a new validation run now (even on an
input that failed before). The reason and the user are written to the audit log.

Exit codes: 0 done; 1 refused by the rules (a run is in progress, nothing to repair, the
mission is not active for a re-run, …); 2 unknown feature or user.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from missions.errors import DomainError
from missions.management.cli import add_user_argument, find_feature, find_user, refused
from validation.services.operator import feature_repair


class Command(BaseCommand):
    help = (
        "Repair a blocked, passed or failed feature: clear it, or re-run its validation. "
        "Exit codes: 0 done, 1 refused by the rules, 2 unknown feature or user."
    )

    def add_arguments(self, parser):
        parser.add_argument("feature", help="feature id, key, or MISSION/KEY")
        parser.add_argument("--mode", required=True, choices=["clear", "re_run"])
        parser.add_argument("--reason", required=True, help="why (recorded in the audit log)")
        add_user_argument(parser)

    def handle(self, *args, feature: str, mode: str, reason: str, username: str | None, **options):
        target = find_feature(feature)
        user = find_user(username)
        name = f"{target.mission.key}/{target.key}"
        try:
            admission = feature_repair(feature=target, user=user, mode=mode, reason=reason)
        except DomainError as exc:
            raise refused(exc, prefix=f"cannot repair {name}: ") from exc
        target.refresh_from_db()
        if admission is None:
            self.stdout.write(f"feature {name}: {target.loop_state}; attempts and fix rounds reset")
        elif admission.run is not None and admission.outcome == "started":
            self.stdout.write(f"feature {name}: {target.loop_state}; validation run {admission.run.pk} started")
        else:
            detail = f" ({admission.detail})" if admission.detail else ""
            self.stdout.write(f"feature {name}: {target.loop_state}; {admission.outcome}{detail}")
