"""The cache of built environments (docs/ENVIRONMENTS.md): one folder per key under
`FUSION_ENV_CACHE`, built once per worker machine and read by every run with that key.

- **Built once.** A build holds its key's lock and ends with a completion marker; whoever
  waited on the lock (a thread of this worker or another worker process) finds the marker
  and builds nothing. A folder without its marker is what a killed build left: removed and
  built again.
- **Bounded.** Past `FUSION_ENV_CACHE_MB`, the least recently used folders are removed
  after each build, never one in use: a run holds its key (`fusion_site/runtime/cachedirs.py`)
  for as long as its checks read the folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from fusion_site.runtime import cachedirs

MARKER = ".fusion-complete"  # JSON: the folder's bytes and how long its build took
KEY_NAME = re.compile(r"^[0-9a-f]{16,64}$")


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    ready: bool  # complete: reused, or built now
    reused: bool  # complete before this use: nothing was built


def root() -> Path:
    path = Path(settings.FUSION_ENV_CACHE)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def held(key: str, build: Callable[[Path], bool]) -> Iterator[Entry]:
    """The folder of `key`, built by `build(folder)` (True: it succeeded) unless a
    complete one is there, and held against eviction until the block ends. A failed
    build leaves nothing behind: the next run with the key builds again."""
    if not KEY_NAME.match(key):
        raise ValueError(f"not an environment key: {key!r}")
    base = root()
    with cachedirs.in_use(base, key):
        folder = base / key
        with cachedirs.flock(base / f"{key}.lock", fcntl.LOCK_EX):
            if (folder / MARKER).is_file():
                entry = Entry(key, folder, ready=True, reused=True)
            else:
                entry = Entry(key, folder, ready=_build(folder, build), reused=False)
        if entry.ready and not entry.reused:
            evict(keep=key)
        yield entry


def _build(folder: Path, build: Callable[[Path], bool]) -> bool:
    cachedirs.remove(folder)  # what a killed build left
    folder.mkdir()
    started = time.monotonic()
    try:
        ok = build(folder)
    except BaseException:
        cachedirs.remove(folder)
        raise
    if not ok:
        cachedirs.remove(folder)
        return False
    marker = {"bytes": cachedirs.tree_bytes(folder), "seconds": round(time.monotonic() - started, 3)}
    (folder / MARKER).write_text(json.dumps(marker))
    return True


def _recorded_size(folder: Path) -> int:
    try:
        return int(json.loads((folder / MARKER).read_text())["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return cachedirs.tree_bytes(folder)  # a build under way or killed: measured


def evict(*, keep: str = "", budget: int | None = None) -> list[str]:
    """Remove the least recently used folders while the cache is over its byte budget;
    never `keep`, never one in use or being built. Returns the keys removed."""
    budget = settings.FUSION_ENV_CACHE_MB * 1024 * 1024 if budget is None else budget
    base = root()
    folders = [(p.name, p) for p in base.iterdir() if KEY_NAME.match(p.name) and p.is_dir()]
    return cachedirs.evict(base, folders, budget=budget, keep=keep, size=_recorded_size)
