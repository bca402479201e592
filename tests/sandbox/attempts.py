"""Escape attempts, copied into a mission's repository as `attempts.py`: code under
judgment that a protected test imports (`calc_<case>.py` calls `attempt("<case>")` at
import) and that tries to leave the sandbox (docs/TRUTH.md, "What the host can and cannot
prove about code that runs inside a check's process").

Each attempt prints one line per target, `ESCAPE <case>: blocked <what>: <why>` or
`ESCAPE <case>: ESCAPED <what>: <what it got>`, so the evidence says what was tried and a
success is plain to see. What it reads is printed hex-encoded: the evidence's redaction
would hide a secret printed as it is, and the test must see it if it leaks. The limit
attempts let the error that stops them propagate (the check fails, naming the limit); if
nothing stops them, they say ESCAPED and stop by themselves, so the host never pays for a
limit that does not hold.

Standard library only: it runs on the check's interpreter. The targets (the host's
paths and ports) are in `targets.json` beside it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MB = 1024 * 1024
ELSEWHERE = ("/dev/shm", "/dev", "/", "/etc/ssh")


def _say(case: str, text: str) -> None:
    print(f"ESCAPE {case}: {text}", flush=True)


def _hex(data: bytes | str) -> str:
    return (data.encode() if isinstance(data, str) else data).hex()


def read_service(case: str, t: dict) -> None:
    """The service's environment (`/proc/<pid>/environ` of every process it can find) and
    the secret key file."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    mine = {os.getpid(), os.getppid()}
    for pid in sorted({*pids, *t["service_pids"]}):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError as exc:
            if pid in t["service_pids"]:
                _say(case, f"blocked environ of {pid}: {type(exc).__name__}")
            continue
        if any(name.encode() in environ for name in t["environ_names"]):
            what = "own" if pid in mine else "foreign"
            _say(case, f"ESCAPED environ of {pid} ({what}): {_hex(environ)}")
    _say(case, f"saw {len(pids)} processes")
    try:
        _say(case, f"ESCAPED secret key: {_hex(Path(t['secret_key_file']).read_bytes())}")
    except OSError as exc:
        _say(case, f"blocked secret key: {type(exc).__name__}")


def _write(case: str, path: Path, text: str = "escaped\n") -> None:
    # Never a folder made on the way: inside, the folders above the check's own tree exist
    # in its private `/tmp` only, and writing there is no escape.
    try:
        with open(path, "a") as fh:
            fh.write(text)
        _say(case, f"ESCAPED wrote {path}")
    except OSError as exc:
        _say(case, f"blocked write {path}: {type(exc).__name__}")


def _git(case: str, what: str, *argv: str) -> None:
    done = subprocess.run(["git", *argv], capture_output=True, text=True)
    if done.returncode == 0:
        _say(case, f"ESCAPED {what}")
    else:
        _say(case, f"blocked {what}: exit {done.returncode} {done.stderr.strip()[:120]!r}")


def write_db(case: str, t: dict) -> None:
    """Mark another feature passed in the database (SQLite: its file)."""
    path = t["sqlite_file"]
    if not path:
        _say(case, "blocked sqlite: not this configuration (PostgreSQL: see the network case)")
        return
    try:
        db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=1)
        db.execute(f"UPDATE {t['feature_table']} SET loop_state='passed', status='done' WHERE key=?", ("victim",))
        db.commit()
        _say(case, f"ESCAPED updated {path}")
    except sqlite3.Error as exc:
        _say(case, f"blocked sqlite {path}: {exc}")
    _write(case, Path(path), "garbage")


def write_data(case: str, t: dict) -> None:
    _write(case, Path(t["data_dir"]) / "escaped.txt")
    _write(case, Path(t["secret_key_file"]), "-and-mine")


def _bare_repositories(root: Path) -> list[Path]:
    return [p.parent for p in root.rglob("config") if (p.parent / "objects").is_dir()] if root.is_dir() else []


def write_mirror(case: str, t: dict) -> None:
    """`git replace` in the mirror (the base revision answered by another commit), its
    config and its hooks."""
    mirrors = _bare_repositories(Path(t["repo_cache"]))
    if not mirrors:
        _say(case, f"blocked mirror cache {t['repo_cache']}: no repository visible")
    for mirror in mirrors:
        _git(
            case, f"git replace in {mirror}", "-C", str(mirror), "replace", "-f", t["base_commit"], t["initial_commit"]
        )
        _git(case, f"git config in {mirror}", "-C", str(mirror), "config", "escape.marker", t["marker"])
        _write(case, mirror / "hooks" / "post-merge", "#!/bin/sh\n")
    _write(case, Path(t["repo_cache"]) / "escaped.txt")


def write_snapshot(case: str, t: dict) -> None:
    """Every snapshot folder but its own: another run's (the right implementation written
    into it would pass there)."""
    root, own = Path(t["snapshot_root"]), Path.cwd().resolve()
    folders = [p for p in root.glob("*") if p.is_dir() and p.resolve() != own] if root.is_dir() else []
    for folder in [Path(t["other_snapshot"]), *folders]:
        _write(case, folder / "calc_write_snapshot.py", "def add(a, b):\n    return a + b\n")


def write_repo(case: str, t: dict) -> None:
    repo = Path(t["repository"])
    _write(case, repo / ".git" / "hooks" / "post-commit", "#!/bin/sh\necho escaped\n")
    _write(case, repo / ".git" / "config", f"[escape]\n\tmarker = {t['marker']}\n")
    _write(case, repo / "calc_write_repo.py", "\n# escaped\n")
    _git(case, f"git commit in {repo}", "-C", str(repo), "commit", "--allow-empty", "-qm", "escaped")


def network(case: str, t: dict) -> None:
    for name, port in t["ports"].items():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                _say(case, f"ESCAPED connected to {name} 127.0.0.1:{port}")
        except OSError as exc:
            _say(case, f"blocked {name} 127.0.0.1:{port}: {type(exc).__name__} {exc.errno}")


def daemon(case: str, t: dict) -> None:
    """A process left behind: a double fork with `setsid`, and `setsid nohup … &`."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)", t["marker"]]
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, sleeper)
        os._exit(0)
    os.waitpid(pid, 0)
    command = "setsid nohup " + " ".join(f"'{word}'" for word in sleeper) + " >/dev/null 2>&1 &"
    subprocess.run(["sh", "-c", command], check=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [p for p in os.listdir("/proc") if p.isdigit() and t["marker"].encode() in _cmdline(p)]
        if len(found) >= 2:
            _say(case, f"started {len(found)} processes to leave behind")
            return
        time.sleep(0.05)
    _say(case, "could not start the processes to leave behind")


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def fork_bomb(case: str, t: dict) -> None:
    children = []
    try:
        for _ in range(10 * t["limits"]["processes"]):
            pid = os.fork()
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            children.append(pid)
    except BlockingIOError:
        _say(case, f"blocked after {len(children)} processes")
        raise
    for pid in children:
        os.kill(pid, 9)
    _say(case, f"ESCAPED {len(children)} processes, over the limit of {t['limits']['processes']}")


def memory_hog(case: str, t: dict) -> None:
    held, limit = [], t["limits"]["memory_mb"]
    try:
        while len(held) * 32 < 4 * limit:
            held.append(bytearray(32 * MB))
    except MemoryError:
        _say(case, f"blocked after {len(held) * 32} MB")
        raise
    _say(case, f"ESCAPED held {len(held) * 32} MB, over the limit of {limit} MB")


def _fill(folder: Path, mb: int) -> tuple[int, OSError | None]:
    """(MB written in 4 MB files, up to `mb`; the error that stopped it), then removed."""
    written, error, files = 0, None, []
    try:
        while written < mb:
            files.append(folder / f"filler-{len(files)}")
            with open(files[-1], "wb") as fh:
                fh.write(b"x" * 4 * MB)
            written += 4
    except OSError as exc:
        error = exc
    for path in files:
        with contextlib.suppress(OSError):
            path.unlink()
    return written, error


def disk_filler(case: str, t: dict) -> None:
    """Its own tree; or every other folder it might write (`/tmp`, `HOME`, `/dev/shm`, `/dev`,
    the sandbox's root and a masked folder: tmpfs in the host's memory, were they plain)."""
    limit, stopped = t["limits"]["disk_mb"], []
    folders = [Path.cwd()] if case == "disk_filler" else [Path(p) for p in ("/tmp", Path.home(), *ELSEWHERE)]
    for folder in folders:
        written, error = _fill(folder, 2 * limit)
        if error is None:
            _say(case, f"ESCAPED wrote {written} MB in {folder}, over the limit of {limit} MB")
            continue
        _say(case, f"blocked {folder} after {written} MB: {error.strerror}")
        stopped.append(error)
    full = [e for e in stopped if e.errno == errno.ENOSPC]
    if full:
        raise full[0]


def file_size(case: str, t: dict) -> None:
    limit = t["limits"]["file_mb"]
    with open("big.bin", "wb") as fh:
        for _ in range(4 * limit):
            fh.write(b"x" * MB)  # SIGXFSZ ends the process past the limit
    _say(case, f"ESCAPED wrote a file of {4 * limit} MB, over the limit of {limit} MB")


CASES = {
    "read_service": read_service,
    "write_db": write_db,
    "write_data": write_data,
    "write_mirror": write_mirror,
    "write_snapshot": write_snapshot,
    "write_repo": write_repo,
    "network": network,
    "daemon": daemon,
    "fork_bomb": fork_bomb,
    "memory_hog": memory_hog,
    "disk_filler": disk_filler,
    "disk_filler_tmp": disk_filler,
    "file_size": file_size,
}


def attempt(case: str) -> None:
    targets = json.loads((HERE / "targets.json").read_text())
    _say(case, "start")
    CASES[case](case, targets)
    _say(case, "end")
