"""Code under judgment cannot leave its sandbox (docs/TRUTH.md, "What the host can and
cannot prove about code that runs inside a check's process"; fusion_site/runtime/sandbox.py).

The implementation's module, imported by the mission's protected tests, tries each escape
of `attempts.py` (one feature per case, all judged by one real worker in one mission over
one real repository). For each: the attempt fails, the verdict is the one the honest checks
give (a wrong implementation whose escape would have turned its failure into a pass still
fails), nothing outside the check's copy changed, and the service keeps serving. The limits
are small, set here; the checks that reach them fail, naming the limit."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from fusion_site.repos import mirrors
from fusion_site.repos.snapshots import snapshot, snapshot_root
from fusion_site.runtime import cgroups, sandbox
from fusion_site.runtime.proc import CommandResult, run_command, scrubbed_env
from fusion_site.runtime.sandbox import Confinement
from missions.models import Mission, MissionFeature
from tests.sandbox import attempts
from tests.sandbox.mission import RIGHT, STUB, WRONG, check_of, protected_test, run_texts
from validation.models import RunStatus, ValidatorRun
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {"processes": 32, "memory_mb": 256, "disk_mb": 32, "file_mb": 8}


@dataclass(frozen=True)
class Case:
    name: str
    honest: bool  # the implementation is right: its protected test passes
    limit: str = ""  # the sandbox limit the check reaches, named in its evidence

    @property
    def verdict(self) -> str:
        return "pass" if self.honest and not self.limit else "fail"


CASES = [
    Case("read_service", honest=True),
    # A wrong implementation: had the escape worked, its failure could have become a pass.
    Case("write_db", honest=False),
    Case("write_data", honest=False),
    Case("write_mirror", honest=False),
    Case("write_snapshot", honest=False),
    Case("write_repo", honest=False),
    Case("network", honest=False),
    Case("daemon", honest=True),
    Case("fork_bomb", honest=True, limit="processes"),
    Case("memory_hog", honest=True, limit="memory"),
    Case("disk_filler", honest=True, limit="disk"),
    Case("disk_filler_tmp", honest=True, limit="disk"),
    Case("file_size", honest=True, limit="file size"),
]


def implementation(case: Case) -> str:
    return f'import attempts\n\nattempts.attempt("{case.name}")\n\n\n' + (RIGHT if case.honest else WRONG)


# ------------------------------------------------------------------ what the host holds


def digest(root: Path, *, skip=lambda path: False) -> dict[str, str]:
    """Each file under `root` (symlinks as their target's name): its checksum."""
    found = {}
    for path in sorted(root.rglob("*")):
        if skip(path) or path.is_dir() and not path.is_symlink():
            continue
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        found[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return found


def holdings(repository: Path, mirror: Path, other: Path) -> dict[str, dict[str, str]]:
    """What an escape would change: the user's repository, the data folder (but the test
    database), the mirror (but its objects, which only grow, and the service's own
    bookkeeping files) and another run's snapshot."""
    return {
        "repository": digest(repository),
        "data": digest(settings.DATA_DIR, skip=is_database),
        "mirror": digest(mirror, skip=lambda p: "objects" in p.parts or p.name.startswith("fusion-")),
        "other snapshot": digest(other),
    }


def is_database(path: Path) -> bool:
    return ".sqlite3" in path.name  # the test database and its journal files change with every run


def with_marker(marker: str) -> list[str]:
    """The host's processes whose command line holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def escape_lines(text: str, case: str) -> list[str]:
    return re.findall(rf"^ESCAPE {case}: (.*)$", text, re.M)


def api_answers(live_server, user, feature: MissionFeature) -> int:
    request = urllib.request.Request(
        f"{live_server.url}/api/features/{feature.pk}/", headers={"Authorization": f"Token {user.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


# ------------------------------------------------------------------ one mission, every case


@pytest.fixture
def token_user(django_user_model):
    from rest_framework.authtoken.models import Token

    user = django_user_model.objects.get(username="alice")
    user.token = Token.objects.create(user=user).key
    return user


@pytest.fixture
def small_limits(settings):
    settings.FUSION_CHECK_PROCESSES = LIMITS["processes"]
    settings.FUSION_CHECK_MEMORY_MB = LIMITS["memory_mb"]
    settings.FUSION_CHECK_DISK_MB = LIMITS["disk_mb"]
    settings.FUSION_CHECK_FILE_MB = LIMITS["file_mb"]


@pytest.fixture
def service_process(tmp_path):
    """A stand-in for another process of the service, started with a secret in its
    environment (what `/proc/<pid>/environ` shows is what a process was started with)."""
    canary = f"escape-canary-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, "SECRET_KEY": canary}
    )
    try:
        yield proc.pid, canary
    finally:
        proc.kill()
        proc.wait()


def test_no_escape_succeeds_and_the_verdicts_are_the_honest_ones(
    bubblewrap, small_limits, worker, build_mission, git_repo, live_server, token_user, service_process, subtests
):
    secret = Path(settings.DATA_DIR, "secret_key").read_bytes().strip()
    marker = f"escape-marker-{uuid.uuid4().hex}"
    initial = git_repo.git("rev-parse", "HEAD").strip()
    base = git_repo.commit(
        {"tests/__init__.py": "", **{f"tests/test_{c.name}.py": protected_test(c.name) for c in CASES}}
        | {f"calc_{c.name}.py": STUB for c in CASES},
        "the protected tests first",
    )
    sentinel_pid, canary = service_process
    with snapshot(str(git_repo.path), base, label="other") as other:  # another run's snapshot, held
        targets = {
            "service_pids": [os.getpid(), sentinel_pid],  # this process is the server and the worker
            "environ_names": ["SECRET_KEY=", "FUSION_DATA_DIR=", "DATABASE_URL="],
            "secret_key_file": str(Path(settings.DATA_DIR, "secret_key")),
            "data_dir": str(settings.DATA_DIR),
            "sqlite_file": connection.settings_dict["NAME"] if settings.IS_SQLITE else "",
            "feature_table": MissionFeature._meta.db_table,
            "repo_cache": str(mirrors.cache_root()),
            "snapshot_root": str(snapshot_root()),
            "other_snapshot": str(other),
            "repository": str(git_repo.path),
            "base_commit": base,
            "initial_commit": initial,
            "ports": {"server": int(live_server.url.rsplit(":", 1)[1]), "postgresql": 5432, "redis": 6379},
            "marker": marker,
            "limits": LIMITS,
        }
        # The attacks are real: unconfined, the same code reads what the sandbox hides.
        control = _unconfined(attempts.read_service, targets)
        assert f"ESCAPED environ of {sentinel_pid}" in control and "ESCAPED secret key" in control
        assert accepts(targets["ports"]["server"])

        revision = git_repo.commit(
            {"attempts.py": Path(attempts.__file__).read_text(), "targets.json": json.dumps(targets)}
            | {f"calc_{c.name}.py": implementation(c) for c in CASES},
            "an implementation that tries to escape",
        )
        features = {c.name: [(f"VAL-{c.name}", check_of(c.name))] for c in CASES} | {"victim": []}
        mission = build_mission(features, validator="checks", auto_fix=False)
        Mission.objects.filter(pk=mission.pk).update(protected_paths=["tests/**"], base_revision=base)
        victim = MissionFeature.objects.get(key="victim")
        # Fetched now: the runs then have nothing to fetch, and nothing changes the mirror but an escape.
        mirror = mirrors.ensure_commit(mirrors.source_of(str(git_repo.path)), revision)
        before = holdings(git_repo.path, mirror, other)

        for case in CASES:
            feature_admit(feature_id=MissionFeature.objects.get(key=case.name).pk, trigger="manual", cause="validate")
        worker.drain(timeout=240)

        after = holdings(git_repo.path, mirror, other)
    for name in before:
        with subtests.test(msg=f"{name} unchanged"):
            assert after[name] == before[name]
    with subtests.test(msg="mirror answers only its own history"):
        assert mirrors.mirror_git(mirror, "for-each-ref", "refs/replace").strip() == ""
        assert marker not in mirrors.mirror_git(mirror, "config", "--list")

    for case in CASES:
        with subtests.test(msg=case.name):
            feature = MissionFeature.objects.get(key=case.name)
            # On a loaded machine a run may end `error` (its worker too slow for its lease)
            # and be retried: the verdict is the last run's; an earlier one judged nothing.
            *earlier, run = ValidatorRun.objects.filter(feature=feature).order_by("id")
            assert all(e.status == RunStatus.ERROR for e in earlier), [(e.status, e.error) for e in earlier]
            assert run.sandbox == sandbox.status().record and run.sandbox.startswith("bubblewrap")
            assert run.verdict is not None, run.error
            judged = run.verdict["assertions"][0]
            evidence = judged["evidence"][0]["text"]
            lines = escape_lines(evidence, case.name)
            assert lines and lines[0] == "start", f"the attempt did not run:\n{evidence}"
            assert not [line for line in lines if line.startswith("ESCAPED")], evidence
            assert judged["verdict"] == case.verdict, evidence
            assert run.status == (RunStatus.PASSED if case.verdict == "pass" else RunStatus.FAILED), evidence
            if case.limit:
                hint = next(line for line in evidence.splitlines() if line.startswith("sandbox limit reached ("))
                assert case.limit in hint.split(";")[0], evidence
            texts = run_texts(run)
            for leaked in (secret, canary.encode()):
                assert leaked.decode() not in texts and leaked.hex() not in texts
            _case_specifics(case.name, lines, targets, sentinel_pid)

    with subtests.test(msg="nothing left behind, the database untouched, the service serving"):
        assert with_marker(marker) == []
        victim.refresh_from_db()
        assert victim.loop_state == "idle" and victim.status != "done"
        assert not ValidatorRun.objects.filter(feature=victim).exists()
        assert api_answers(live_server, token_user, victim) == 200


def _unconfined(attempt, targets: dict) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        attempt("control", targets)
    return out.getvalue()


def _case_specifics(case: str, lines: list[str], targets: dict, sentinel_pid: int) -> None:
    """What each attempt says it tried, so a blocked attempt is one that really ran."""
    said = "\n".join(lines)
    if case == "read_service":
        assert f"blocked environ of {sentinel_pid}" in said and "blocked secret key" in said
    elif case == "write_db" and targets["sqlite_file"]:
        assert f"blocked write {targets['sqlite_file']}" in said
    elif case == "write_data":
        assert f"blocked write {targets['secret_key_file']}" in said
    elif case == "write_mirror":
        assert f"blocked mirror cache {targets['repo_cache']}" in said
    elif case == "write_snapshot":
        assert f"blocked write {targets['other_snapshot']}/calc_write_snapshot.py" in said
    elif case == "write_repo":
        assert f"blocked write {targets['repository']}/.git/hooks/post-commit" in said
    elif case == "network":
        for name, port in targets["ports"].items():
            assert f"blocked {name} 127.0.0.1:{port}: ConnectionRefusedError" in said
    elif case == "daemon":
        assert "started 2 processes to leave behind" in said
    elif case in ("fork_bomb", "memory_hog"):
        assert any(line.startswith("blocked after") for line in lines), said
    elif case == "disk_filler_tmp":
        for folder in ("/tmp", "/home/check", "/dev/shm"):
            assert f"blocked {folder} after " in said and "No space left on device" in said
        for folder in ("/dev", "/", "/etc/ssh"):
            assert f"blocked {folder} after 0 MB: Read-only file system" in said


def confined_python(code: str, tree: Path) -> CommandResult:
    """`python -c code` as a check runs it: in the sandbox, over `tree` with a private layer."""
    return run_command(
        ["python", "-c", code],
        cwd=tree,
        timeout=120,
        max_output=4096,
        env=scrubbed_env(),
        confine=Confinement(tree=tree, layered=True),
    )


# ------------------------------------------------------------------ a limit the sandbox does not hold yet


def test_a_memory_hog_in_shared_memory_is_stopped(bubblewrap, small_limits, tmp_path):
    """Shared memory (mmap MAP_SHARED, memfd, SysV shm) is no part of the data segment that
    `FUSION_CHECK_MEMORY_MB` bounds per process: the sandbox's memory group bounds it, with
    everything else the sandbox holds (docs/SANDBOX.md, "Limits")."""
    with cgroups.limit_groups(processes=8, memory_bytes=64 * attempts.MB) as groups:
        memory_group = any("memory" in group.parts for group in groups)
    if not memory_group:
        pytest.xfail("no memory control group can be made here (not root, or cgroup v2 without delegation)")
    size = 4 * (LIMITS["memory_mb"] + LIMITS["disk_mb"]) * attempts.MB
    hog = (
        f"import mmap\nm = mmap.mmap(-1, {size})\nfor i in range(0, {size}, 4096):\n    m[i] = 1\n"
        "print('ESCAPED held', len(m) // 1048576, 'MB')\n"
    )
    result = confined_python(hog, tmp_path)
    assert "ESCAPED" not in result.output and not result.ok
    assert sandbox.limit_hint(result.exit_code, result.output).startswith("sandbox limit reached (memory")


# ------------------------------------------------------------------ the host keeps nothing of a check

LEAVES_CHILDREN = (
    "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n        time.sleep(600)\nprint('left')\n"
)


def test_every_control_group_is_removed_with_its_sandbox(bubblewrap, small_limits, tmp_path, monkeypatch):
    """As root each sandbox has a `pids` group (and a `memory` group where the service may
    make one) of its own: none outlives its command, even when the command leaves
    processes that die with its pid namespace just after. The groups made are observed by
    wrapping the function that makes them (nothing else changes)."""
    made: list[Path] = []
    make = cgroups._made
    monkeypatch.setattr(cgroups, "_made", lambda root, limits: made.append(group := make(root, limits)) or group)
    for _ in range(5):
        result = confined_python(LEAVES_CHILDREN, tmp_path)
        assert result.ok and "left" in result.output, result.output
    pids = [group for group in made if group is not None and group.parent.name != "memory" and "pids" in str(group)]
    assert len(pids) == (5 if os.geteuid() == 0 else 0)
    assert [group for group in made if group is not None and group.exists()] == []
