"""Subprocess adapter: scrubbed environment, a lower CPU priority than the service's, a
timeout that kills the whole process group, and captured output capped to its tail (a
pattern is still searched in the whole output). Every command the host runs for checks,
command validators and executors goes through `run_command`."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from django.conf import settings

from fusion_site.runtime import sandbox
from fusion_site.runtime.sandbox import Confinement, SandboxUnavailable

# Only these survive the scrub; everything else (SECRET_KEY, DATABASE_URL, API keys, …)
# never reaches a command the host runs.
KEPT_ENV = ("LANG", "LC_ALL", "TZ", "TERM")
# What would point a command's git at another repository than one inside its own folder
# (`confined_git`); none of them reaches a command the host runs.
GIT_LOCATION_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
)


class CommandError(Exception):
    """The command could not be started at all (permanent)."""


class Unconfined(CommandError):
    """`FUSION_SANDBOX=required` and no sandbox works here (`sandbox.SandboxUnavailable`)."""


@dataclass
class CommandResult:
    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool
    duration: float
    matched: bool | None = None  # whether `match` was found in the whole output; None: not asked
    sandbox: str = ""  # what it ran in (`sandbox.Status.record`); "" when it was not asked to be confined

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0


def scrubbed_env(
    extra: dict[str, str] | None = None, home: str | None = None, path: tuple[str, ...] = ()
) -> dict[str, str]:
    """`path`: folders before the rest (an environment's)."""
    interpreter_dir = str(sandbox.check_interpreter().parent)
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    # The service's base interpreter comes first, so `python` finds it; never its
    # virtualenv, whose packages are the service's, not the project's.
    env["PATH"] = os.pathsep.join([*path, interpreter_dir, "/usr/local/bin", "/usr/bin", "/bin"])
    env["HOME"] = home or tempfile.gettempdir()
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def confined_git(env: dict[str, str]) -> dict[str, str]:
    """`env` for a command the host runs in a snapshot, a check's copy or a task's clone
    (all under `FUSION_SNAPSHOT_DIR`): git in it never looks for a repository above that
    folder. With the default data folder the snapshots lie inside the service's own
    checkout, whose history `git log` or a version-from-git build would read instead of
    failing ("not a git repository"); a task's clone still finds its own `.git`
    (docs/REPOSITORIES.md, "Snapshots")."""
    env = {k: v for k, v in env.items() if k not in GIT_LOCATION_ENV}
    env["GIT_CEILING_DIRECTORIES"] = str(Path(settings.FUSION_SNAPSHOT_DIR).resolve())
    return env


def _argv(command: str | list[str], shell: bool) -> list[str] | str:
    if shell:
        return command if isinstance(command, str) else shlex.join(command)
    if isinstance(command, list):
        return command
    argv = shlex.split(command)
    if not argv:
        raise CommandError("empty command")
    return argv


def start_nicer(argv: list[str] | str, **popen: Any) -> subprocess.Popen:
    """`subprocess.Popen(argv, **popen)`, `FUSION_COMMAND_NICE` steps nicer than the
    service. The service's transactions hold a mission's row lock across their round trips
    to the database, and every other step of that mission waits for them: a worker thread
    or a PostgreSQL backend kept waiting for the CPU by a check holds up the whole
    mission's loop (docs/BENCHMARKS.md, "Loop throughput"). That is also why a command asked for in a
    session of its own (`start_new_session`) gets a process group of its own in the
    service's session instead: under Linux's autogroup scheduling
    (`kernel.sched_autogroup_enabled`) each session is a scheduling group of its own, so a
    command in a new session would weigh as much as the whole worker process, niceness or
    not. With `FUSION_COMMAND_NICE` 0, the process is started as asked.

    Linux keeps a niceness per thread, and a process inherits its starter's: the process
    is started by a thread of this module that is that much nicer, so it runs at that
    priority from its first instruction, and so does everything it starts (a shell's
    commands, git's helpers). Elsewhere the process is reniced just after its start."""
    step = settings.FUSION_COMMAND_NICE
    if step <= 0:
        return subprocess.Popen(argv, **popen)
    if popen.pop("start_new_session", False):  # in the service's session, so that the niceness counts
        popen["process_group"] = 0
    if sys.platform.startswith("linux"):
        return _starter(step).submit(lambda: subprocess.Popen(argv, **popen)).result()
    proc = subprocess.Popen(argv, **popen)
    with contextlib.suppress(OSError):  # exited already, or the system refuses
        os.setpriority(os.PRIO_PROCESS, proc.pid, _nicer_by(step))
    return proc


_STARTERS: dict[int, ThreadPoolExecutor] = {}
_STARTERS_LOCK = threading.Lock()


def _starter(step: int) -> ThreadPoolExecutor:
    with _STARTERS_LOCK:
        if step not in _STARTERS:
            _STARTERS[step] = ThreadPoolExecutor(
                1, thread_name_prefix=f"fusion-start-nice{step}", initializer=_nicer_thread, initargs=(step,)
            )
        return _STARTERS[step]


def _forget_starters() -> None:
    # A process forked from this one (not exec'd) has none of their threads: it starts its own.
    global _STARTERS_LOCK
    _STARTERS_LOCK = threading.Lock()
    _STARTERS.clear()


os.register_at_fork(after_in_child=_forget_starters)


def _nicer_thread(step: int) -> None:
    # On Linux `who=0` is the calling thread alone, not the whole process.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, _nicer_by(step))


def _nicer_by(step: int) -> int:
    return min(os.getpriority(os.PRIO_PROCESS, 0) + step, 19)


def run_nicer(
    argv: list[str], *, input: bytes | str | None = None, timeout: float | None = None, **popen: Any
) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, …)` for the service's own helpers (git,
    `cp`, `rm`, `find`), at the same lower priority as the commands (`start_nicer`): they
    make and remove snapshots while another thread holds a mission's lock."""
    with start_nicer(
        argv,
        stdin=subprocess.PIPE if input is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    ) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_command(
    command: str | list[str],
    *,
    cwd: Path,
    timeout: float,
    max_output: int,
    shell: bool = False,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    match: str | None = None,
    confine: Confinement | None = None,
) -> CommandResult:
    """`confine`: run it in the sandbox (fusion_site/runtime/sandbox.py); with no sandbox
    here it runs unconfined, unless `FUSION_SANDBOX=required` (`Unconfined`)."""
    started = time.monotonic()
    try:
        where = sandbox.require(confine)
    except SandboxUnavailable as exc:
        raise Unconfined(str(exc)) from exc
    argv = _argv(command, shell)
    with contextlib.ExitStack() as stack, tempfile.TemporaryFile() as out:
        if confine is not None and where.confined:
            argv = stack.enter_context(sandbox.confined_argv(confine, _as_list(argv)))
            shell = False
            env = sandbox.home_inside(confine, env or scrubbed_env())
        try:
            proc = start_nicer(
                argv,
                cwd=str(cwd),
                shell=shell,
                env=confined_git(env or scrubbed_env()),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # A process group of its own: the timeout kills the whole group.
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot start {command!r}: {exc}") from exc
        timed_out = False
        try:
            if stdin is not None:
                proc.communicate(stdin.encode(), timeout=timeout)
            else:
                timed_out = not wait_exit(proc, timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BrokenPipeError:
            pass
        _kill_group(proc)  # also reaps children left behind by a command that exited
        proc.wait()
        output, truncated = _tail(out, max_output)
        matched = None if match is None else _search_all(out, match)
    if confine is not None and where.confined and not timed_out and proc.returncode == 127:
        _raise_not_started(command, output)
    return CommandResult(
        exit_code=None if timed_out else proc.returncode,
        output=output,
        timed_out=timed_out,
        truncated=truncated,
        duration=time.monotonic() - started,
        matched=matched,
        sandbox="" if confine is None else where.record,
    )


# How the sandbox's last steps say that the command itself could not be started.
NOT_STARTED = re.compile(r"\A(?:prlimit: failed to execute|bwrap: execvp) [^\n]*?: ([^\n]+)\n?\Z")


def _raise_not_started(command: str | list[str], output: str) -> None:
    # In the sandbox the command is started by `prlimit` (or bubblewrap): a missing program
    # is their message and exit 127, said as plainly as an unconfined start failure.
    found = NOT_STARTED.match(output)
    if found:
        raise CommandError(f"cannot start {command!r}: {found.group(1)}")


def _as_list(argv: list[str] | str) -> list[str]:
    return ["sh", "-c", argv] if isinstance(argv, str) else argv


def wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether `proc` exited within `timeout`, woken the moment it exits: `Popen.wait` with
    a timeout polls with sleeps growing to 50 ms, which a short check pays on every run
    (a 15 ms command was seen back after 31 ms). A pidfd (Linux 5.3+) is readable at exit;
    elsewhere, `Popen.wait`."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here, or the process is reaped already
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while not poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            if time.monotonic() >= deadline:
                return False
        return True
    finally:
        os.close(fd)


def _tail(fh: IO[bytes], limit: int) -> tuple[str, bool]:
    size = fh.seek(0, os.SEEK_END)
    truncated = size > limit
    fh.seek(max(size - limit, 0))
    text = fh.read().decode("utf-8", errors="replace")
    return (f"[… output truncated, last {limit} bytes shown]\n" + text if truncated else text), truncated


def _search_all(fh: IO[bytes], pattern: str) -> bool:
    # The whole output, not the tail: "RESULT: OK" followed by a long log still matched.
    fh.seek(0)
    return re.search(pattern, fh.read().decode("utf-8", errors="replace")) is not None
