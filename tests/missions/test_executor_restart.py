"""The `command` executor's lease: the actor claims a task by compare-and-swap and renews
its lease while the command runs; a redelivered message does nothing; a task whose
executor died (its lease passed, or the server restarted) is re-driven by the recovery
sweep, and fails with the reason past FUSION_EXECUTOR_ATTEMPTS. Last, the product's
issue itself: `make run` killed while the demo's executor runs a task, then `make run`
again — the task is done and the demo mission completes."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from datetime import UTC, timedelta
from pathlib import Path

import dramatiq
import pytest
from django.utils import timezone

from fusion_site.repos.snapshots import snapshot_root
from missions.demo import implementer
from missions.models import MissionEvent, Task
from missions.services import tasks as task_services
from missions.services.executor import task_execute
from missions.services.executor_lease import executor_redrive, worker_id
from missions.services.lifecycle import mission_activate
from missions.services.tasks import task_create
from tests.gitserver import free_port
from tests.missions.loop_helpers import add_slice, feature, make_mission, python_command, wait_for
from validation.services.recovery import recover

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
WAIT = float(os.environ.get("FUSION_RESTART_TEST_TIMEOUT", "420"))


@pytest.fixture(autouse=True)
def _attempts(settings):
    settings.FUSION_EXECUTOR_ATTEMPTS = 2  # the default, whatever the environment says


# The command: notes that it started (and its pid), blocks until the gate file exists,
# then implements its feature.
GATED = """
import os, pathlib, sys, time
marker, gate = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
key = os.environ["FUSION_FEATURE_KEY"]
with marker.open("a") as fh:
    fh.write(f"{key} {os.getpid()}\\n")
while not gate.exists():
    time.sleep(0.05)
pathlib.Path(key + ".txt").write_text("done " + key + "\\n")
print("implemented", key)
"""


class Gated:
    def __init__(self, tmp_path: Path, *, open_: bool):
        self.script, self.marker, self.gate = tmp_path / "gated.py", tmp_path / "started.txt", tmp_path / "gate"
        self.script.write_text(GATED)
        if open_:
            self.open()

    @property
    def command(self) -> str:
        return python_command(self.script, str(self.marker), str(self.gate))

    def open(self) -> None:
        self.gate.write_text("go\n")

    def runs(self) -> list[str]:
        return self.marker.read_text().splitlines() if self.marker.exists() else []


def started(owner, repo, tmp_path, gated: Gated, *, features=("a",), monkeypatch) -> list[Task]:
    """A mission whose tasks are started, their `execute_task` messages lost."""
    mission = make_mission(owner, repo.path, key="lease", executor="command", executor_command=gated.command)
    add_slice(mission, "m1", "s1", list(features))
    mission_activate(mission=mission, user=owner)
    with monkeypatch.context() as m:
        m.setattr(task_services, "send_on_commit", lambda *args, **kwargs: None)
        tasks = [task_create(user=owner, feature=feature(mission, key)) for key in features]
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {"in_progress"}
    return tasks


def claim_as(task: Task, *, by: str = "gone-host:4242:deadbeef", lease_until, attempts: int = 1) -> None:
    """What a worker that claimed the task and then died left behind."""
    Task.objects.filter(pk=task.pk).update(
        claim_token="f" * 32, claimed_by=by, lease_until=lease_until, executor_attempts=attempts
    )


def queued(broker, actor: str = "execute_task") -> list[tuple]:
    """The arguments of the `actor` messages waiting in the broker (sorted): the StubBroker's
    queue in the embedded pass, Redis's message hash in the PostgreSQL + Redis pass."""
    queue_name = broker.get_actor(actor).queue_name
    if hasattr(broker, "client"):  # RedisBroker: `<namespace>:<queue>.msgs` holds the messages
        messages = list(broker.client.hvals(f"{broker.namespace}:{queue_name}.msgs"))
    else:
        queue = broker.queues.get(queue_name)
        messages = [] if queue is None else list(queue.queue)
    decoded = [dramatiq.Message.decode(m) for m in messages]
    return sorted(tuple(m.args) for m in decoded if m.actor_name == actor)


# ---------------------------------------------------------------- the actor


def test_a_redelivered_message_does_nothing_while_the_task_is_held_or_once_it_is_finished(
    idle_broker, owner, git_repo, tmp_path, monkeypatch
):
    gated = Gated(tmp_path, open_=True)
    (task,) = started(owner, git_repo, tmp_path, gated, monkeypatch=monkeypatch)
    claim_as(task, lease_until=timezone.now() + timedelta(seconds=60))
    assert task_execute(task_id=task.pk) == "stale"  # another delivery holds it, alive
    assert gated.runs() == [] and Task.objects.get(pk=task.pk).executor_attempts == 1

    Task.objects.filter(pk=task.pk).update(claim_token="", lease_until=None, executor_attempts=0)
    assert task_execute(task_id=task.pk) == "done"
    assert task_execute(task_id=task.pk) == "stale"  # finished: the redelivery changes nothing
    task.refresh_from_db()
    assert (task.status, task.executor_attempts, len(gated.runs())) == ("done", 1, 1)
    assert task.claimed_by == worker_id()


def test_deliveries_sent_together_run_the_command_once(worker, owner, git_repo, tmp_path, monkeypatch):
    gated = Gated(tmp_path, open_=True)
    (task,) = started(owner, git_repo, tmp_path, gated, monkeypatch=monkeypatch)
    actor = dramatiq.get_broker().get_actor("execute_task")
    for _ in range(3):
        actor.send(task.pk)
    worker.drain(timeout=90)
    task.refresh_from_db()
    assert task.status == "done", task.summary
    assert task.executor_attempts == 1 and len(gated.runs()) == 1


def test_the_lease_is_renewed_while_the_command_runs(worker, owner, git_repo, tmp_path, settings):
    settings.FUSION_EXECUTOR_LEASE_SECONDS = 2  # a heartbeat every half second
    gated = Gated(tmp_path, open_=False)
    mission = make_mission(owner, git_repo.path, key="beat", executor="command", executor_command=gated.command)
    add_slice(mission, "m1", "s1", ["a"])
    mission_activate(mission=mission, user=owner)
    task = task_create(user=owner, feature=feature(mission, "a"))
    wait_for(lambda: gated.runs(), timeout=60, message="the command to start")
    first = Task.objects.get(pk=task.pk).lease_until
    assert first is not None
    wait_for(lambda: timezone.now() > first, timeout=30, message="the first lease to pass")
    wait_for(lambda: Task.objects.get(pk=task.pk).lease_until > timezone.now(), timeout=30, message="a renewal")
    assert executor_redrive(startup=False) == []  # past its first lease, but renewed: alive
    gated.open()
    worker.drain(timeout=90)
    task.refresh_from_db()
    assert (task.status, task.executor_attempts, len(gated.runs())) == ("done", 1, 1)


# ---------------------------------------------------------------- the recovery sweep


def test_a_task_whose_lease_passed_is_redriven_on_an_explicit_clock(worker, owner, git_repo, tmp_path, monkeypatch):
    gated = Gated(tmp_path, open_=True)
    (task,) = started(owner, git_repo, tmp_path, gated, monkeypatch=monkeypatch)
    now = timezone.now()
    claim_as(task, lease_until=now + timedelta(seconds=30))
    assert executor_redrive(startup=False, now=now) == []  # its lease is still good
    assert executor_redrive(startup=False, now=now + timedelta(seconds=31)) == [task.pk]
    worker.drain(timeout=90)
    task.refresh_from_db()
    assert task.status == "done", task.summary
    assert task.executor_attempts == 2 and task.claimed_by == worker_id()
    assert recover()["executor_redriven"] == []  # nothing left to re-drive


def test_past_the_attempts_the_task_fails_with_the_reason(idle_broker, owner, git_repo, tmp_path, monkeypatch):
    gated = Gated(tmp_path, open_=True)
    (task,) = started(owner, git_repo, tmp_path, gated, monkeypatch=monkeypatch)
    lease = timezone.now() - timedelta(seconds=5)
    claim_as(task, lease_until=lease, attempts=2)
    assert recover()["executor_redriven"] == [task.pk]
    task.refresh_from_db()
    last = (lease - timedelta(seconds=60)).astimezone(UTC)  # its last renewal: one lease before
    assert task.status == "failed" and task.finished_at is not None
    assert task.summary == (
        f"the executor died 2 times; last at {last:%Y-%m-%d %H:%M:%S} UTC on gone-host:4242:deadbeef"
    )
    # Through the task machine: the audit row says so, and nothing was sent again.
    failed = MissionEvent.objects.filter(type="task:updated", payload__task=task.pk, payload__change="failed")
    assert failed.get().payload["reason"] == task.summary
    assert queued(idle_broker) == [] and gated.runs() == []
    assert feature(task.mission, "a").loop_state == "implementing"
    assert recover()["executor_redriven"] == []


def test_with_attempts_left_a_dead_executor_is_sent_again(
    idle_broker, owner, git_repo, tmp_path, monkeypatch, settings
):
    settings.FUSION_EXECUTOR_ATTEMPTS = 3
    (task,) = started(owner, git_repo, tmp_path, Gated(tmp_path, open_=True), monkeypatch=monkeypatch)
    claim_as(task, lease_until=timezone.now() - timedelta(seconds=5), attempts=2)
    assert executor_redrive(startup=False) == [task.pk]
    task.refresh_from_db()
    assert (task.status, task.claim_token, task.lease_until) == ("in_progress", "", None)
    assert queued(idle_broker) == [(task.pk,)]


def test_at_startup_every_claim_of_another_process_is_orphaned(idle_broker, owner, git_repo, tmp_path, monkeypatch):
    theirs, ours = started(
        owner, git_repo, tmp_path, Gated(tmp_path, open_=True), features=("a", "b"), monkeypatch=monkeypatch
    )
    future = timezone.now() + timedelta(seconds=60)
    claim_as(theirs, by="previous-server:77:0badc0de", lease_until=future)
    claim_as(ours, by=worker_id(), lease_until=future)
    assert executor_redrive(startup=False) == []  # both leases look alive
    assert executor_redrive(startup=True) == [theirs.pk]  # the previous server is gone; we are not
    assert queued(idle_broker) == [(theirs.pk,)]
    assert Task.objects.get(pk=theirs.pk).claim_token == ""
    assert Task.objects.get(pk=ours.pk).claim_token == "f" * 32


def test_a_lost_message_is_sent_again_at_startup_or_after_the_grace(
    idle_broker, owner, git_repo, tmp_path, monkeypatch, settings
):
    (task,) = started(owner, git_repo, tmp_path, Gated(tmp_path, open_=True), monkeypatch=monkeypatch)
    settings.FUSION_REDRIVE_GRACE = 3600
    assert executor_redrive(startup=False) == []  # just started: its message is most likely queued
    assert executor_redrive(startup=True) == [task.pk]  # an embedded restart lost every message
    settings.FUSION_REDRIVE_GRACE = 0
    assert executor_redrive(startup=False) == [task.pk]
    assert queued(idle_broker) == [(task.pk,), (task.pk,)]  # duplicates end as stale


def test_the_folders_of_dead_executors_are_removed(idle_broker, owner, git_repo, tmp_path, monkeypatch):
    dead, live = started(
        owner, git_repo, tmp_path, Gated(tmp_path, open_=True), features=("a", "b"), monkeypatch=monkeypatch
    )
    claim_as(dead, lease_until=timezone.now() - timedelta(seconds=1))
    claim_as(live, lease_until=timezone.now() + timedelta(seconds=60))
    # The live task's current claim (token f…f) keeps its folder; the folder of its earlier,
    # dead claim goes like the dead task's.
    folders = {
        name: snapshot_root() / name
        for name in (
            f"task-{dead.pk}-{'f' * 12}",
            f"task-{live.pk}-{'f' * 12}",
            f"task-{live.pk}-{'b' * 12}",
            "task-notes",
        )
    }
    for folder in folders.values():
        (folder / "repo").mkdir(parents=True)
        (folder / "repo" / "file.txt").write_text("left behind\n")
    assert executor_redrive(startup=False) == [dead.pk]
    assert {name for name, folder in folders.items() if folder.exists()} == {f"task-{live.pk}-{'f' * 12}", "task-notes"}


# ---------------------------------------------------------------- `make run`, killed and run again


class Server:
    """`manage.py serve` (the embedded mode: SQLite, in-process workers) as `make run`
    starts it, in its own data folder."""

    def __init__(self, data: Path):
        self.data = data
        self.env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        self.env.update(
            FUSION_DATA_DIR=str(data),
            FUSION_SNAPSHOT_DIR=str(data / "snapshots"),
            FUSION_REPO_CACHE=str(data / "repos"),
            DJANGO_SETTINGS_MODULE="fusion_site.settings",
            PYTHONUNBUFFERED="1",
        )
        self.proc: subprocess.Popen | None = None
        self.log = data / "serve.log"

    def manage(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "serve", f"127.0.0.1:{free_port()}"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def query(self, sql: str, *params):
        with sqlite3.connect(self.data / "fusion.sqlite3", timeout=30) as db:
            return db.execute(sql, params).fetchall()

    def wait(self, predicate, what: str):
        """Until `predicate()` is true, or the server died, or the generous timeout."""

        def ready():
            assert self.alive(), f"the server died while waiting for {what}:\n{self.log.read_text()[-4000:]}"
            return predicate()

        try:
            wait_for(ready, timeout=WAIT, interval=0.2, message=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log.read_text()[-4000:]}") from None


DEMO_GATE = """
import os, pathlib, sys, time
marker, gate, demo_implementer = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
with marker.open("a") as fh:
    fh.write(f"{os.environ['FUSION_FEATURE_KEY']} {os.getpid()}\\n")
while not gate.exists():
    time.sleep(0.05)
os.execv(sys.executable, [sys.executable, demo_implementer])
"""

TASKS = (
    "SELECT t.id, f.key, t.status, t.claim_token, t.executor_attempts, t.revision, t.summary "
    "FROM missions_task t JOIN missions_missionfeature f ON f.id = t.feature_id ORDER BY t.id"
)


@pytest.mark.slow
def test_make_run_killed_while_the_demo_executor_runs_a_task_completes_at_the_next_make_run(tmp_path):
    gated = Gated(tmp_path, open_=False)
    server = Server(tmp_path / "data")
    server.data.mkdir()
    # `make run`, the first time: migrate, the admin, the demo (its first tasks are started, and
    # their messages die with the `demo` command), then serve.
    server.manage("migrate", "--noinput")
    server.manage("ensure_admin")
    server.manage("demo", "--if-missing")
    # The demo's own implementer, behind a gate: it runs until the server is killed under it.
    gated.script.write_text(DEMO_GATE)
    command = f"{gated.command} {Path(implementer.__file__).resolve()}"
    server.query("UPDATE missions_mission SET executor_command = ? WHERE key = 'demo'", command)
    repo = server.data / "demo-repo"
    user_head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    try:
        server.start()
        server.wait(gated.runs, "the demo's executor to start a task")
        key, pid = gated.runs()[0].split()
        victim = next(row for row in server.query(TASKS) if row[1] == key)
        assert victim[2] == "in_progress" and victim[3] and victim[4] == 1  # claimed, running
        server.kill(signal.SIGKILL)  # Ctrl-C that did not wait, a laptop lid, the OOM killer
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)  # its command had a session of its own: it outlived the server
        assert next(row for row in server.query(TASKS) if row[0] == victim[0])[2] == "in_progress"

        # `make run` again: the task that was running is run again, the mission completes.
        gated.open()
        server.manage("demo", "--if-missing")
        server.start()
        server.wait(
            lambda: server.query("SELECT status FROM missions_mission WHERE key = 'demo'") == [("complete",)],
            "the demo mission to complete",
        )
        rows = {row[0]: row for row in server.query(TASKS)}
        again = rows[victim[0]]
        assert again[2] == "done" and again[4] == 2, again  # claimed once per server life
        assert {row[2] for row in rows.values()} == {"done"}, rows
        assert len([line for line in gated.runs() if line.split()[0] == key]) == 2
        branch = f"refs/heads/fusion/demo/{key}-{victim[0]}"
        ref = subprocess.run(["git", "-C", str(repo), "rev-parse", branch], capture_output=True, text=True).stdout
        assert ref.strip() == again[5]
        # The demo's checkout itself never moved; no clone was left behind.
        assert (
            subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
            == user_head
        )
        assert not [p for p in (server.data / "snapshots").glob("task-*")]
    finally:
        server.kill(signal.SIGTERM)
