"""`manage.py serve [ADDR:PORT]`: migrate, then Daphne (HTTP + WebSocket), the recovery
sweep at start-up and on a timer, and — in the embedded mode (no REDIS_URL) — a pool of
Dramatiq worker threads in this same process."""

from __future__ import annotations

import logging
import threading

from daphne.cli import CommandLineInterface
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from fusion_site.runtime import sandbox
from missions.management.workers import start_embedded_worker
from validation.services.recovery import recover

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Serve the site with Daphne; embedded mode also runs the Dramatiq workers in-process."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument(
            "--workers", type=int, default=None, help="Worker threads (embedded default: FUSION_WORKER_THREADS)."
        )
        parser.add_argument("--no-workers", action="store_true", help="Do not start in-process workers.")
        parser.add_argument("--no-migrate", action="store_true")

    def handle(self, *args, addrport: str, workers: int | None, no_workers: bool, no_migrate: bool, **options):
        host, _, port = addrport.rpartition(":")
        if not port.isdigit():
            raise CommandError(f"expected ADDR:PORT, got {addrport!r}")
        host = host or "127.0.0.1"
        if not no_migrate:
            call_command("migrate", interactive=False, verbosity=0)
        embedded = not settings.REDIS_URL
        worker = None
        if embedded and not no_workers:
            worker = start_embedded_worker(workers or settings.FUSION_WORKER_THREADS)
            self.stdout.write(f"in-process workers: {workers or settings.FUSION_WORKER_THREADS} threads")
        start_sweeper(startup=embedded)
        self._say_sandbox()
        self.stdout.write(
            self.style.SUCCESS(f"Fusion Missions on http://{host}:{port}/ (admin /admin/, API /api/, docs /api/docs/)")
        )
        try:
            CommandLineInterface().run(["-b", host, "-p", port, "--proxy-headers", "fusion_site.asgi:application"])
        finally:
            if worker is not None:
                worker.stop()

    def _say_sandbox(self) -> None:
        current = sandbox.status()
        if current.confined:
            self.stdout.write(f"checks run sandboxed: {current.record} (FUSION_SANDBOX={current.mode})")
            return
        self.stderr.write(
            self.style.WARNING(
                f"WARNING: checks run UNSANDBOXED ({current.detail}): the code under judgment can read and "
                "write everything this service's user can. See docs/SANDBOX.md."
            )
        )


def start_sweeper(*, startup: bool) -> threading.Thread:
    """Recovery at start-up and then every FUSION_SWEEP_INTERVAL seconds."""
    stop = threading.Event()

    def loop():
        first = True
        while not stop.is_set():
            close_old_connections()
            try:
                recover(startup=startup and first)
            except Exception:  # noqa: BLE001 — a failed sweep must not kill the server; the next one retries
                logger.exception("recovery sweep failed")
            finally:
                close_old_connections()
            first = False
            stop.wait(settings.FUSION_SWEEP_INTERVAL)

    thread = threading.Thread(target=loop, name="fusion-sweeper", daemon=True)
    thread.start()
    return thread
