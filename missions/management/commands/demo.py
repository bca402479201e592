"""`manage.py demo`: (re)create a real local git repository (a tiny shop with its tests),
a mission over it whose `command` executor replays prepared changes, and start it with
autopilot. The first commit (the tests) is the mission's base revision and `tests/**` are
protected paths. `--wait` runs it end to end in this process and prints where it got to."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from missions.demo import implementer
from missions.demo.project import MISSION, TESTS, WHEELS
from missions.management.cli import add_owner_argument, find_user
from missions.management.workers import start_embedded_worker
from missions.models import Mission
from missions.services.files import mission_import
from missions.services.lifecycle import mission_activate


def make_repository(path: Path) -> str:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for rel, text in TESTS.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    for rel, data in WHEELS.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Demo",
        "GIT_AUTHOR_EMAIL": "demo@localhost",
        "GIT_COMMITTER_NAME": "Demo",
        "GIT_COMMITTER_EMAIL": "demo@localhost",
    }
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "Tiny shop: tests first"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env, capture_output=True)
    return subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def create_demo(*, directory: Path | None = None, user=None) -> Mission:
    """The demo mission, owned by `user` (None: no owner, only staff see it), who starts it."""
    Mission.objects.filter(key=MISSION["mission"]["key"]).delete()
    repo = (directory or Path(settings.DATA_DIR) / "demo-repo").resolve()
    base = make_repository(repo)
    document = copy.deepcopy(MISSION)
    document["mission"].update(
        repository=str(repo),
        base_revision=base,
        executor_command=f"{sys.executable} {Path(implementer.__file__).resolve()}",
    )
    # Imported from the command line (trusted: its executor command), owned by `user`.
    mission, _changed = mission_import(document=document, user=None, owner=user)
    return mission_activate(mission=mission, user=user)


class Command(BaseCommand):
    help = (
        "Create the demo mission over a real local git repository and start it with autopilot. "
        "It belongs to --owner USERNAME, or else to the first superuser (none: only staff see it)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--if-missing", action="store_true", help="do nothing when the demo mission exists")
        parser.add_argument("--wait", action="store_true", help="run it to the end with in-process workers")
        parser.add_argument("--timeout", type=float, default=300)
        add_owner_argument(parser)

    def handle(self, *args, if_missing: bool, wait: bool, timeout: float, owner: str | None, **options):
        owner_user = find_user(owner)  # an unknown user: exit 2, nothing re-created
        if if_missing and Mission.objects.filter(key=MISSION["mission"]["key"]).exists():
            self.stdout.write("demo mission exists; not re-created")
            return
        if owner_user is None:
            owner_user = get_user_model().objects.filter(is_superuser=True).order_by("id").first()
        mission = create_demo(user=owner_user)
        owned = f"owned by {owner_user.get_username()}" if owner_user is not None else "no owner: only staff see it"
        self.stdout.write(f"demo mission {mission.key} (id {mission.pk}) started over {mission.repository}; {owned}")
        self.stdout.write(
            "The demo implementer replays prepared changes; set executor_command to a real coding agent instead."
        )
        if wait:
            self._wait(mission, timeout)

    def _wait(self, mission: Mission, timeout: float) -> None:
        if settings.REDIS_URL:
            raise CommandError(
                "--wait runs in-process workers; unset REDIS_URL or run rundramatiq workers and watch the API"
            )
        worker = start_embedded_worker(settings.FUSION_WORKER_THREADS)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                mission.refresh_from_db()
                if mission.status == "complete":
                    break
                time.sleep(0.5)
        finally:
            worker.stop()
        self.stdout.write(f"mission {mission.key}: {mission.status} {mission.status_reason}".rstrip())
        if mission.status != "complete":
            raise CommandError("the demo did not complete in time")
