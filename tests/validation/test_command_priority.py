"""With `FUSION_COMMAND_NICE` (10 on PostgreSQL), the commands the service runs (checks,
command validators, executor tasks) run at a lower CPU priority than the service, each in
a process group of its own inside the service's session, and so do its own helpers (git,
`rm`, `cp`) (fusion_site/runtime/proc.py, docs/BENCHMARKS.md "Loop throughput"): the loop's steps, which
hold their mission's lock, get the cores first. The timeout still kills everything a
command started."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from fusion_site.repos.sources import run_git
from fusion_site.runtime.proc import run_command, run_nicer
from missions.models import MissionFeature
from validation.services import runner
from validation.services.verdicts.admit import feature_admit

PROBE = (
    f"{sys.executable} -c \"import os, json; print(json.dumps({{'nice': os.getpriority(os.PRIO_PROCESS, 0), "
    "'pid': os.getpid(), 'pgid': os.getpgid(0), 'sid': os.getsid(0)}))\""
)


def probe(tmp_path: Path) -> dict:
    result = run_command(PROBE, cwd=tmp_path, timeout=60, max_output=4096)
    assert result.ok, result.output
    return json.loads(result.output)


def test_a_command_runs_nicer_than_the_service_in_a_group_of_its_own(tmp_path, settings):
    settings.FUSION_COMMAND_NICE = 7
    own = os.getpriority(os.PRIO_PROCESS, 0)
    seen = probe(tmp_path)
    assert seen["nice"] == min(own + 7, 19)
    assert seen["pgid"] == seen["pid"], "a process group of its own: the timeout kills it whole"
    assert seen["sid"] == os.getsid(0), "the service's session: not a scheduling group of its own"
    assert os.getpriority(os.PRIO_PROCESS, 0) == own, "the service's own priority is unchanged"


def test_zero_keeps_the_services_priority_and_a_session_of_its_own(tmp_path, settings):
    settings.FUSION_COMMAND_NICE = 0
    seen = probe(tmp_path)
    assert seen["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert seen["sid"] == seen["pgid"] == seen["pid"], "its own session, as without a niceness to count"


def test_the_services_own_helpers_run_at_the_lower_priority_too(tmp_path, settings):
    settings.FUSION_COMMAND_NICE = 3
    wanted = min(os.getpriority(os.PRIO_PROCESS, 0) + 3, 19)
    code = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"
    assert int(run_nicer([sys.executable, "-c", code], text=True).stdout) == wanted
    # git passes its priority on to what it starts: an alias that runs a program shows it.
    done = run_git(["-c", f"alias.probe=!{sys.executable} -c '{code}'", "probe"], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == wanted


def test_the_timeout_kills_what_the_command_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    result = run_command(
        f"sleep 300 & echo $! > {pid_file}; wait", cwd=tmp_path, timeout=1, max_output=4096, shell=True
    )
    assert result.timed_out
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the command's child outlived its timeout"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("idle_broker")
def test_a_check_of_a_real_run_runs_at_the_lower_priority(build_mission, git_repo, settings):
    settings.FUSION_COMMAND_NICE = 5
    wanted = min(os.getpriority(os.PRIO_PROCESS, 0) + 5, 19)
    git_repo.commit({"data.txt": "payload\n"})
    check = {"run": f'python -c "import os, sys; sys.exit(os.getpriority(os.PRIO_PROCESS, 0) != {wanted})"'}
    build_mission({"nice": [("VAL-1", check)]})
    run = feature_admit(feature_id=MissionFeature.objects.get(key="nice").pk, trigger="manual", cause="validate").run
    runner.execute_run(run.pk)
    run.refresh_from_db()
    assert run.verdict is not None, run.error
    assert run.verdict["status"] == "pass", run.verdict


def test_a_process_forked_after_a_start_starts_its_own_commands(tmp_path, settings):
    """The starting thread does not survive a fork: a forked child (Dramatiq's worker
    processes are forked) starts its commands all the same, at the lower priority."""
    settings.FUSION_COMMAND_NICE = 4
    wanted = min(os.getpriority(os.PRIO_PROCESS, 0) + 4, 19)
    code = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"
    assert int(run_nicer([sys.executable, "-c", code], text=True).stdout) == wanted  # the starter exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what its own command saw, then leave at once
        try:
            os.write(write, run_nicer([sys.executable, "-c", code], timeout=60).stdout)
        finally:
            os._exit(0)
    os.close(write)
    seen, deadline = b"", time.monotonic() + 60
    try:
        while select.select([read], [], [], max(0, deadline - time.monotonic()))[0]:
            chunk = os.read(read, 100)
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # one that hangs, waiting for a starter it has not
        os.waitpid(pid, 0)
    assert seen and int(seen) == wanted, "the forked child's command did not start"
