"""`FUSION_EXECUTOR_SANDBOX`: the command executor (a coding agent) runs in the sandbox
(docs/SANDBOX.md): it writes its clone and commits there, and sees nothing of the
service. A real worker, a real repository, real bubblewrap."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings

from fusion_site.runtime import sandbox
from missions.services.lifecycle import mission_activate
from tests.missions.loop_helpers import add_slice, make_mission
from tests.missions.test_executor import run_task

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = """
import os, pathlib
key_file = pathlib.Path(os.environ["SECRET_KEY_FILE"])
try:
    print("read the key file:", key_file.read_text())
except OSError as exc:
    print("cannot read the key file:", type(exc).__name__)
print("pid 1 is", pathlib.Path("/proc/1/cmdline").read_bytes().split(b"\\0")[0].decode())
pathlib.Path(os.environ["FUSION_FEATURE_KEY"] + ".txt").write_text("done\\n")
"""


def test_a_sandboxed_executor_commits_its_work_and_sees_nothing_of_the_service(
    worker, owner, git_repo, settings, tmp_path
):
    if not sandbox.status().confined:
        pytest.fail("bubblewrap is required for this test (docs/SANDBOX.md): apt install bubblewrap")
    settings.FUSION_EXECUTOR_SANDBOX = True
    secret_file = django_settings.DATA_DIR / "secret_key"
    assert secret_file.is_file()
    # The agent is the repository's own script: nothing outside the clone is mounted.
    git_repo.commit({"agent.py": AGENT}, "the agent")
    command = f"sh -c 'SECRET_KEY_FILE={secret_file} python agent.py'"
    mission = make_mission(owner, git_repo.path, executor="command", executor_command=command)
    add_slice(mission, "m1", "s1", ["a"])
    mission_activate(mission=mission, user=owner)

    task = run_task(worker, owner, mission)

    assert task.status == "done", task.log
    assert "cannot read the key file: FileNotFoundError" in task.log
    assert secret_file.read_text() not in task.log
    assert "pid 1 is bwrap" in task.log  # its own pid namespace
    assert git_repo.git("show", f"{task.revision}:a.txt") == "done\n"
