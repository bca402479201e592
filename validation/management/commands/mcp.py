"""`manage.py mcp --user NAME [--mission KEY]`: the MCP server over stdio, for a local
agent. It acts as NAME, with exactly that user's permissions; `--mission` scopes the
connection to one mission (the one `fusion_validate` reviews and the default of every
loop tool). In the embedded configuration (no REDIS_URL) the process runs its own
Dramatiq workers, as `serve` does, so that the work it starts is judged."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from missions.management.workers import start_embedded_worker
from validation.mcp.context import Principal, find_mission
from validation.mcp.transports import run_stdio


class Command(BaseCommand):
    help = "Serve the MCP tools over stdio as a user (a local agent's one-line configuration)."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="The user the agent acts as.")
        parser.add_argument("--mission", help="Mission key or id this connection is scoped to.")
        parser.add_argument("--no-workers", action="store_true", help="Do not start in-process workers.")
        parser.add_argument("--workers", type=int, default=None, help="Worker threads (embedded mode).")

    def handle(self, *args, user: str, mission: str | None, no_workers: bool, workers: int | None, **options):
        found = get_user_model().objects.filter(username=user, is_active=True).first()
        if found is None:
            raise CommandError(f"no active user {user!r}")
        mission_id = None
        if mission:
            try:
                mission_id = find_mission(user=found, ref=mission).pk
            except Exception as exc:
                raise CommandError(f"no mission {mission!r} that {user} may see") from exc
        worker = None
        if not settings.REDIS_URL and not no_workers:
            worker = start_embedded_worker(workers or settings.FUSION_WORKER_THREADS)
        try:
            run_stdio(principal=Principal(user_id=found.pk, mission_id=mission_id))
        finally:
            if worker is not None:
                worker.stop()
