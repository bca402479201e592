"""What the snapshots and the snapshots a worker keeps (`snapshot_reuse`) share: how git
writes a snapshot's files and index, and how a tree is removed whatever a check did to it."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from fusion_site.runtime.proc import run_nicer

# A snapshot's files are written read-only (a check cannot change them for the next one);
# `core.sharedRepository` keeps what git writes into the mirror meanwhile (a lazy fetch)
# at its usual modes whatever the umask.
READ_ONLY_UMASK = 0o222
MIRROR_MODES = ["-c", "core.sharedRepository=0664"]
# The index a snapshot is made with is read back by `tree_index` (version 2, whole):
# whatever a mirror's config says about index formats.
INDEX_FORMAT = ["-c", "index.version=2", "-c", "core.splitIndex=false"]


def remove_tree(path: Path, *, in_process: bool = False) -> None:
    """Remove `path` whatever a check did to it. `in_process`: a small tree, removed by
    the walk below alone."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    # `rm -rf` first: in C, without the interpreter's lock (snapshots and check copies are
    # removed on every run); the walk below for what it could not remove (a folder a check
    # took the permissions off, for a worker that is not root).
    if not in_process:
        with contextlib.suppress(OSError):
            run_nicer(["rm", "-rf", "--", str(path)])
        if not os.path.lexists(path):
            return

    def retry(func: Callable[..., object], name: str, _exc_info: object) -> None:
        # A check may have taken the permissions off a folder of its copy.
        if func is os.rmdir and os.path.abspath(name) == os.path.abspath(path):
            return  # its parent is the snapshot root, never ours to change
        with contextlib.suppress(OSError):
            if func in (os.open, os.scandir, os.listdir):
                os.chmod(name, stat.S_IRWXU)
                shutil.rmtree(name, onerror=retry)
            else:
                os.chmod(os.path.dirname(name), stat.S_IRWXU)
                func(name)

    shutil.rmtree(path, onerror=retry)
