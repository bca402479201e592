"""CPU seconds of every process on the machine over a window, by command name.

The loop shares the machine's cores with PostgreSQL, Redis, git and the benchmark's own
clients: this says which of them the window's CPU went to. A process's figure includes
its reaped children (a worker's git and checks; the postmaster's exited backends), so
each short-lived process is counted once, in its parent's line.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (command, own + reaped children CPU seconds) for every visible process."""
    seen: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        command = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seen[int(entry.name)] = (command, sum(int(f) for f in fields[11:15]) / _TICK)
    return seen


def process_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of one process: its own (user + system), and its reaped children's.
    OSError once the process is gone."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK, (int(fields[13]) + int(fields[14])) / _TICK


def spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> Counter:
    """CPU seconds per command between two snapshots (a process that exited in between
    is counted in its parent, once reaped)."""
    total: Counter = Counter()
    for pid, (command, seconds) in after.items():
        earlier = before.get(pid)
        start = earlier[1] if earlier and _same_process(earlier[0], command) else 0.0
        total[command] += seconds - start
    return total


def _same_process(before: str, after: str) -> bool:
    """Whether a pid's two command names are one process: a kernel worker renames itself
    after the work it is doing (`kworker/u8:0-writeback`, `kworker/u8:0-events_unbound`);
    counted as a new process, its CPU since boot was charged to the window."""
    if before.startswith("kworker/") and after.startswith("kworker/"):
        return before.split("-", 1)[0] == after.split("-", 1)[0]
    return before == after
