"""The commands the service runs (checks, command validators, executor tasks) run at a
lower CPU priority than the service, each in a process group of its own inside the
service's session (fusion_site/base/proc.py, README "Loop throughput"): the loop's
transactions, which hold their mission's lock, get the CPU first. The timeout still kills
everything a command started."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from fusion_site.base.proc import run_command
from missions.models import MissionFeature
from validation.services import runner
from validation.services.admission import feature_admit

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


def test_zero_keeps_the_services_priority(tmp_path, settings):
    settings.FUSION_COMMAND_NICE = 0
    assert probe(tmp_path)["nice"] == os.getpriority(os.PRIO_PROCESS, 0)


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
