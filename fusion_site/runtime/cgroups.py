"""Control groups for one sandbox (docs/SANDBOX.md, "Limits"): a `pids` group that bounds
its processes, and a `memory` group that bounds all it holds in memory (its processes,
shared memory, and the tmpfs layer it writes), when the service may make them: as root,
on the cgroup v1 hierarchy, or on v2 where the `pids` controller is delegated to the
root. Elsewhere the sandbox's `prlimit` limits are what bound it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("fusion.sandbox")

CGROUP_ROOT = Path("/sys/fs/cgroup")
REMOVAL_SECONDS = 10  # how long a group's killed processes may take to be gone
# The shell that puts itself in each group, then becomes the sandbox: every process the
# sandbox starts is born inside them, none can fork before.
JOIN_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 126; shift; n=$((n-1)); done; exec "$@"'
)


@contextlib.contextmanager
def limit_groups(*, processes: int, memory_bytes: int) -> Iterator[list[Path]]:
    """The groups made for one sandbox (possibly none), removed afterwards."""
    groups: list[Path] = []
    try:
        if os.geteuid() == 0:
            for group in (_pids_group(processes), _memory_group(memory_bytes)):
                if group is not None:
                    groups.append(group)
        yield groups
    finally:
        for group in groups:
            _remove(group)


def joined(groups: list[Path], command: list[str]) -> list[str]:
    """`command`, started inside `groups`."""
    if not groups:
        return command
    return ["sh", "-c", JOIN_SCRIPT, "fusion-groups", str(len(groups)), *map(str, groups), *command]


def _pids_group(processes: int) -> Path | None:
    for root in (CGROUP_ROOT / "pids", CGROUP_ROOT):
        if not (root / "cgroup.procs").exists():
            continue
        if root == CGROUP_ROOT and "pids" not in _read(root / "cgroup.subtree_control"):
            continue
        if group := _made(root, {"pids.max": str(processes)}):
            return group
    return None


def _memory_group(memory_bytes: int) -> Path | None:
    """Under the service's own memory group (v1): a machine may hold the service in one."""
    own = next(
        (line.split(":", 2)[2] for line in _read(Path("/proc/self/cgroup")).splitlines() if ":memory:" in line), None
    )
    if own is None:
        return None
    root = CGROUP_ROOT / "memory" / own.lstrip("/")
    if not (root / "memory.limit_in_bytes").exists():
        return None
    # No swap beyond it either, where the kernel accounts swap.
    return _made(root, {"memory.limit_in_bytes": str(memory_bytes), "memory.memsw.limit_in_bytes?": str(memory_bytes)})


def _made(root: Path, limits: dict[str, str]) -> Path | None:
    group = root / f"fusion-check-{uuid.uuid4().hex[:12]}"
    try:
        group.mkdir()
        for name, value in limits.items():
            optional = name.endswith("?")
            try:
                (group / name.rstrip("?")).write_text(value)
            except OSError:
                if not optional:
                    raise
        return group
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None


def _remove(group: Path) -> None:
    """The group removed once its processes are gone. When the command has exited, the
    sandbox's other processes may still be dying (killed with its pid namespace), and the
    kernel refuses to remove a group that holds any (EBUSY): removed at once, most groups
    stayed behind, empty, one per check. What is still in it is killed again."""
    deadline = time.monotonic() + REMOVAL_SECONDS
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                log.warning("the control group %s could not be removed: %s", group, exc)
                return
        for pid in _read(group / "cgroup.procs").split():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.01)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
