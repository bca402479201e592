"""The sandbox every command of a revision runs in (docs/SANDBOX.md): bubblewrap, the
confinement Flatpak is built on, never a home-made one.

A confined command sees its own tree (read-write, or read-only under a private writable
layer), the folders it is given read-only (an environment, the base interpreter), the
system's folders read-only, a private `/tmp` and `HOME`, a minimal `/dev` and its own
`/proc`; it runs in new user, pid, ipc, uts, cgroup and network namespaces (the network
only when declared), dies with the service, and everything it started dies with it. It
sees nothing of the data folder, the mirror cache, other snapshots, the service's code
or virtualenv, or any other process.

The writable layer (`Confinement.layered`): an overlay whose lower layer is the pristine
snapshot and whose upper layer is a tmpfs of `FUSION_CHECK_DISK_MB`, mounted in a user
and mount namespace of its own just before bubblewrap starts (`unshare`, util-linux).
It costs a few milliseconds whatever the repository's size, no check sees another's
writes, the snapshot itself never changes, and the check's disk use is bounded. Where
the kernel refuses an overlay in a user namespace, the caller makes a private copy and
binds it read-write instead (`overlay_works`).

Limits, set inside the sandbox by `prlimit`: the data segment (`FUSION_CHECK_MEMORY_MB`:
what a memory hog allocates, not the address space a runtime reserves), the size of one
file, no core files, and the number of processes (`FUSION_CHECK_PROCESSES`). The kernel
does not count processes against a limit for root, so a service running as root also
puts each sandbox in a `pids` control group of its own when it can create one."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from fusion_site.runtime import cgroups

log = logging.getLogger("fusion.sandbox")

MODES = ("auto", "required", "off")
NONE = "none"
# The system's read-only folders; Debian's merged /usr makes /bin, /lib… symlinks into it.
SYSTEM_FOLDERS = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Root-only files under /etc that a sandbox started by root could still read: its uid is
# root's outside the namespace, without any capability (docs/SANDBOX.md, "As root").
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
MASKED_FOLDERS = ("/etc/ssl/private", "/etc/sudoers.d", "/etc/ssh")
HOME = "/home/check"
SANDBOX_UID = 65534
# The overlay is mounted by a fixed script in a namespace of its own; every value is a
# positional argument, never spliced into the script.
LAYER_SCRIPT = (
    'set -e; mount -t tmpfs -o "size=$1,mode=0755" fusion-layer "$2"; mkdir "$2/upper" "$2/work" "$2/tmp" "$2/home" "$2/shm"; '
    'mount -t overlay fusion-check -o "lowerdir=$3,upperdir=$2/upper,workdir=$2/work" "$4"; '
    'shift 4; exec "$@"'
)


class SandboxUnavailable(Exception):
    """`FUSION_SANDBOX=required` and no sandbox works here: nothing runs unconfined."""


@dataclass(frozen=True)
class Status:
    """What commands of a revision run in, as every run records it (`record`)."""

    mode: str
    kind: str  # "bubblewrap" or "none"
    detail: str  # the version, or why there is none

    @property
    def confined(self) -> bool:
        return self.kind != NONE

    @property
    def record(self) -> str:
        return f"{self.kind} {self.detail}".strip() if self.confined else f"none ({self.detail})"


@dataclass(frozen=True)
class Bind:
    """A host folder mounted over a folder of the command's tree (`target`, relative to
    the tree): an environment's `node_modules` where the project's tools look for it."""

    source: Path
    target: str
    writable: bool = False


@dataclass(frozen=True)
class Toolchain:
    """What an environment adds to a command: folders first on `PATH`, folders mounted
    read-only, folders mounted into its tree, and variables."""

    path: tuple[str, ...] = ()
    readable: tuple[Path, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    binds: tuple[Bind, ...] = ()


@dataclass(frozen=True)
class Confinement:
    """How one command is confined. Paths are mounted at the same path inside, so that
    file names in output and evidence stay the host's."""

    tree: Path  # the command's working tree, its cwd
    layered: bool = False  # True: `tree` stays read-only; writes go to a private layer
    writable: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    network: bool = False
    # Not a check (a validator's or executor's program): no limits on memory or processes.
    limits: bool = True
    binds: tuple[Bind, ...] = ()  # mounted over the tree's own folders (`Bind`)


def mode() -> str:
    return settings.FUSION_SANDBOX


@functools.cache
def _probe() -> tuple[str, str]:
    """(kind, detail) of what works on this machine, tried once per process with the
    same namespaces a check gets."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return NONE, "bubblewrap is not installed (Debian: apt install bubblewrap)"
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    argv = [bwrap, *_system_args(), "--unshare-all", "--die-with-parent", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return NONE, f"bubblewrap does not start: {exc}"
    if done.returncode != 0:
        return NONE, f"bubblewrap cannot make its namespaces here: {done.stderr.strip()[:300]}"
    return "bubblewrap", version.removeprefix("bubblewrap ").strip()


def status() -> Status:
    current = mode()
    if current == "off":
        return Status(mode=current, kind=NONE, detail="FUSION_SANDBOX=off, unsafe")
    kind, detail = _probe()
    return Status(mode=current, kind=kind, detail=detail)


@functools.cache
def overlay_works() -> bool:
    """Whether a private overlay can be mounted here (Linux 5.11+ in a user namespace);
    what the machine can do, whatever the mode (`layers_work`)."""
    if _probe()[0] == NONE or shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="fusion-overlay-probe-") as tmp:
        lower, layer, merged = (Path(tmp) / name for name in ("lower", "layer", "merged"))
        for folder in (lower, layer, merged):
            folder.mkdir()
        argv = [*_layer_argv(lower, layer, merged, 1), "true"]
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def layers_work() -> bool:
    """Whether a check here runs over the pristine snapshot with a private layer."""
    return status().confined and overlay_works()


def _layer_argv(lower: Path, layer: Path, merged: Path, size_mb: int) -> list[str]:
    return [
        "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
        "sh", "-c", LAYER_SCRIPT, "fusion-layer", f"{size_mb}m", str(layer), str(lower), str(merged),
    ]  # fmt: skip


def check_interpreter() -> Path:
    """The interpreter a check gets without an environment: the service's base
    interpreter (never its virtualenv), or `FUSION_CHECK_PYTHON`."""
    configured = settings.FUSION_CHECK_PYTHON
    if configured:
        return Path(configured)
    base = getattr(sys, "_base_executable", sys.executable)
    return Path(base)


@functools.cache
def _interpreter_prefixes(interpreter: str) -> tuple[Path, ...]:
    # The folders the interpreter loads from (its prefix, and its base's for a venv).
    done = subprocess.run(
        [interpreter, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    prefixes = [Path(line) for line in done.stdout.split() if line] if done.returncode == 0 else []
    real = {Path(os.path.realpath(interpreter)).parent.parent}
    return tuple(p for p in {*prefixes, *real} if not _under_system(p))


def _under_system(path: Path) -> bool:
    return any(path == Path(s) or path.is_relative_to(s) for s in SYSTEM_FOLDERS)


def interpreter_mounts() -> tuple[Path, ...]:
    return _interpreter_prefixes(str(check_interpreter()))


def _system_args(layer: Path | None = None) -> list[str]:
    """`layer`: the check's writable layer (`LAYER_SCRIPT`), whose tmpfs of
    `FUSION_CHECK_DISK_MB` also holds its `/tmp`, `HOME` and `/dev/shm`, so that one bound
    covers all a check writes. Without a layer they are tmpfs mounts of that size each: a
    tmpfs lives in the host's memory, and one without a size would let a command fill it
    past every limit."""
    args = [*_system_mounts(), "--proc", "/proc", "--dev", "/dev"]
    if layer is None:
        size = str(settings.FUSION_CHECK_DISK_MB * 1024 * 1024)
        for folder in ("/dev/shm", "/tmp", "/home"):
            args += ["--size", size, "--tmpfs", folder]
    else:
        args += ["--bind", f"{layer}/shm", "/dev/shm", "--bind", f"{layer}/tmp", "/tmp"]
        args += ["--bind", f"{layer}/home", "/home"]
    # `/dev` itself (its device nodes are mounts of their own) is read-only.
    return [*args, "--remount-ro", "/dev", "--dir", HOME]


@functools.cache
def _system_mounts() -> tuple[str, ...]:
    """The system's folders (read-only) and the masks, as this machine has them: looked
    up once per process, not for every check."""
    args: list[str] = []
    for folder in SYSTEM_FOLDERS:
        path = Path(folder)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), folder]
        elif path.is_dir():
            args += ["--ro-bind", folder, folder]
    for masked in MASKED_FILES:
        if Path(masked).exists():
            args += ["--ro-bind", "/dev/null", masked]
    for masked in MASKED_FOLDERS:
        if Path(masked).is_dir():
            args += ["--tmpfs", masked, "--remount-ro", masked]
    return tuple(args)


def _limit_args(limits: bool) -> list[str]:
    if not limits:
        return []
    mb = 1024 * 1024
    return [
        "prlimit",
        f"--data={settings.FUSION_CHECK_MEMORY_MB * mb}",
        f"--fsize={settings.FUSION_CHECK_FILE_MB * mb}",
        f"--nproc={settings.FUSION_CHECK_PROCESSES}",
        "--core=0",
        "--",
    ]


def bwrap_argv(confine: Confinement, argv: list[str], *, tree: Path, layer: Path | None = None) -> list[str]:
    """The bubblewrap command line running `argv` with `tree` as its working tree
    (`layer`: its writable layer, `_system_args`)."""
    args = ["bwrap", *_system_args(layer)]
    for folder in (*interpreter_mounts(), *confine.readable):
        args += ["--ro-bind", str(folder), str(folder)]
    for folder in confine.writable:
        args += ["--bind", str(folder), str(folder)]
    args += ["--bind", str(tree), str(confine.tree), "--chdir", str(confine.tree)]
    for bind in confine.binds:  # after the tree: mounted over it
        args += ["--bind" if bind.writable else "--ro-bind", str(bind.source), str(confine.tree / bind.target)]
    args += ["--unshare-all", *([] if not confine.network else ["--share-net"])]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "fusion-check"]
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    # Last, once every mount point is made: the sandbox's root is a tmpfs of its own,
    # which a check could otherwise fill without bound (`_system_args`).
    args += ["--remount-ro", "/"]
    return [*args, "--", *_limit_args(confine.limits), *argv]


@contextlib.contextmanager
def confined_argv(confine: Confinement, argv: list[str]) -> Iterator[list[str]]:
    """The command line that runs `argv` confined, and the host-side folders it needs for
    as long as it runs (the writable layer's mount points, a `pids` group)."""
    with contextlib.ExitStack() as stack:
        if confine.layered:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fusion-layer-")))
            (scratch / "layer").mkdir()
            (scratch / "merged").mkdir()
            merged = scratch / "merged"
            inner = bwrap_argv(confine, argv, tree=merged, layer=scratch / "layer")
            command = [*_layer_argv(confine.tree, scratch / "layer", merged, settings.FUSION_CHECK_DISK_MB), *inner]
        else:
            command = bwrap_argv(confine, argv, tree=confine.tree)
        if confine.limits:
            mb = 1024 * 1024
            memory = (settings.FUSION_CHECK_MEMORY_MB + settings.FUSION_CHECK_DISK_MB) * mb
            groups = stack.enter_context(
                cgroups.limit_groups(processes=settings.FUSION_CHECK_PROCESSES, memory_bytes=memory)
            )
            command = cgroups.joined(groups, command)
        yield command


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def limits_text() -> str:
    return (
        f"memory {settings.FUSION_CHECK_MEMORY_MB} MB per process (FUSION_CHECK_MEMORY_MB; with the layer, "
        "what the whole sandbox holds where a memory group can be made), "
        f"{settings.FUSION_CHECK_PROCESSES} processes (FUSION_CHECK_PROCESSES), "
        f"files of {settings.FUSION_CHECK_FILE_MB} MB (FUSION_CHECK_FILE_MB), "
        f"{settings.FUSION_CHECK_DISK_MB} MB written in all (FUSION_CHECK_DISK_MB)"
    )


# What a process over one of the limits says, or how it dies (SIGXFSZ: 128 + 25).
LIMIT_SIGNS = (
    ("memory", ("MemoryError", "Cannot allocate memory", "out of memory", "bad_alloc", "heap out of memory")),
    (
        "processes",
        (
            "Cannot fork",
            "fork: Resource temporarily unavailable",
            "can't start new thread",
            "BlockingIOError: [Errno 11]",
        ),
    ),
    ("disk", ("No space left on device",)),
    ("file size", ("File size limit exceeded", "File too large")),
)


def limit_hint(exit_code: int | None, output: str) -> str:
    """The limit a failed confined command most likely reached, named for its evidence;
    "" when nothing says so."""
    reached = [name for name, signs in LIMIT_SIGNS if any(sign in output for sign in signs)]
    if exit_code in (-25, 153) and "file size" not in reached:
        reached.append("file size")
    if exit_code in (-9, 137) and "memory" not in reached:  # the memory group's OOM killer
        reached.append("memory")
    if not reached:
        return ""
    return f"sandbox limit reached ({', '.join(reached)}); the limits: {limits_text()}"


def home_inside(confine: Confinement, env: dict[str, str]) -> dict[str, str]:
    """`env` with a `HOME` the sandbox has: its own, unless the one given is mounted."""
    home = env.get("HOME", "")
    mounted = (confine.tree, *confine.writable)
    if home and any(Path(home).is_relative_to(folder) for folder in mounted):
        return env
    return {**env, "HOME": HOME}


def require(confine: Confinement | None) -> Status:
    """The sandbox a command will run in; raises when it must be confined and cannot."""
    current = status()
    if confine is not None and not current.confined:
        if current.mode == "required":
            raise SandboxUnavailable(f"FUSION_SANDBOX=required and no sandbox works here: {current.detail}")
        _announce_once(current.record)
    return current


@functools.cache
def _announce_once(record: str) -> None:
    """Said loudly, once per process and state, when commands of a revision run
    unconfined: every worker says it in its own log (`serve` says it at start)."""
    log.warning(
        "checks run UNSANDBOXED (%s): the code under judgment can read and write "
        "everything this service's user can (docs/SANDBOX.md)",
        record,
    )
