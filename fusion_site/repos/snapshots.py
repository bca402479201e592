"""Read-only snapshots of a revision, made from the worker's mirror of the repository
(`fusion_site/repos/mirrors.py`) and always removed afterwards: the user's repository is
never written (docs/REPOSITORIES.md).

A snapshot is the revision's files, filled by `git read-tree -u` with an index of its own
outside the folder: no worktree record, no lock, nothing shared with another snapshot,
and no `.git` inside, so a check cannot reach the mirror either (bench/snapshot_modes.py
measured it against a worktree of the mirror). Git adapter errors are `SnapshotError`;
`SourceUnavailable` (unreachable, or the commit not there yet) is the one worth a retry.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from django.conf import settings

from fusion_site.repos import mirrors, refs, snapshot_reuse, tree_index
from fusion_site.repos import submodules as subs
from fusion_site.repos.mirrors import FULL_COMMIT, source_of
from fusion_site.repos.sources import SnapshotError, Source, SourceUnavailable, run_git, scrub
from fusion_site.repos.tree_index import GITLINK, TreeFacts, read_index
from fusion_site.repos.trees import INDEX_FORMAT, MIRROR_MODES, READ_ONLY_UMASK, remove_tree
from fusion_site.runtime.proc import run_nicer

__all__ = ["FULL_COMMIT", "SnapshotError", "SourceUnavailable", "source_of"]


def as_source(source: Source | str) -> Source:
    """A source, or the one a repository text (a URL or a local path) names."""
    return source if isinstance(source, Source) else source_of(source)


def pin_revision(source: Source | str, name: str) -> str:
    """The full commit id `name` (a branch, a tag, `HEAD`, a short id) names at the source
    now. Judgements are pinned to this id: a ref that moves later never changes what was
    judged (docs/TRUTH.md). A full id is taken as it is, with no network call; for a
    local repository it is checked at once (a local read), so a typo is refused now."""
    source = as_source(source)
    return _checked(source, refs.resolve(source, name))


def pin_branch(source: Source | str, branch: str = "") -> tuple[str, str]:
    """The branch a revision is judged on when nothing landed one, and its full commit id
    now (`refs.branch_head`: `branch`, else the source's default branch), checked as
    `pin_revision` checks its commit."""
    source = as_source(source)
    name, commit = refs.branch_head(source, branch)
    return name, _checked(source, commit)


def _checked(source: Source, commit: str) -> str:
    if source.local:
        with mirrors.in_use(source):
            mirrors.ensure_commit(source, commit)
    return commit


def is_ancestor(source: Source | str, older: str, newer: str) -> bool:
    """Whether commit `older` is contained in the history of `newer`."""
    source = as_source(source)
    with mirrors.in_use(source):
        mirrors.ensure_commit(source, older)
        path = mirrors.ensure_commit(source, newer)
        proc = run_git(["merge-base", "--is-ancestor", older, newer], cwd=path, timeout=mirrors.LOCAL_TIMEOUT)
    if proc.returncode not in (0, 1):
        raise SnapshotError(f"git merge-base failed: {proc.stderr.strip()[:500]}")
    return proc.returncode == 0


def snapshot_root() -> Path:
    root = Path(settings.FUSION_SNAPSHOT_DIR)
    root.mkdir(parents=True, exist_ok=True)
    return root


# The checkout's files are written read-only by git itself (its umask; a pass over every
# file afterwards costs a metadata write per file, which doubled the kernel's time per
# snapshot on an ext4 disk under four concurrent runs). `core.sharedRepository` keeps what
# git writes into the mirror meanwhile (a lazy fetch) at its usual modes whatever the umask.
# READ_ONLY_UMASK and MIRROR_MODES: fusion_site/repos/trees.py.


def _writable_folders(path: Path) -> None:
    """Directories stay writable so that tools can keep caches (the snapshot is thrown away
    anyway); files stay read-only. One `find` (in C); the walk where it fails. A tree with
    no folder below its top (made here, writable) needs neither: one listing tells."""
    with os.scandir(path) as entries:
        if not any(entry.is_dir(follow_symlinks=False) for entry in entries):
            return
    with contextlib.suppress(OSError):
        done = run_nicer(["find", str(path), "-type", "d", "-exec", "chmod", "u+w", "--", "{}", "+"])
        if done.returncode == 0:
            return
    for dirpath, _dirs, _files in os.walk(path):
        os.chmod(dirpath, os.stat(dirpath).st_mode | stat.S_IWUSR)


@contextlib.contextmanager
def snapshot(
    source: Source | str, revision: str, *, label: str = "run", submodules: bool = False, reuse: bool = False
) -> Iterator[Path]:
    """The revision's files, read-only. What is yielded is the source's own folder in the
    snapshot: a local repository path that is a sub-folder of its repository is judged there.
    `submodules`: the revision's submodules are filled too, each from a mirror of its own
    (docs/REPOSITORIES.md, "Submodules"); without it their folders stay empty, and the
    snapshot's facts (`tree_index.facts_of`) say so to the checks.
    `reuse`: made from a snapshot this process kept of the same repository when it can, and
    kept afterwards for the next run when nothing wrote into it (`snapshot_reuse`)."""
    source = as_source(source)
    commit = revision if FULL_COMMIT.match(revision or "") else pin_revision(source, revision)
    target = snapshot_root() / f"{label}-{uuid.uuid4().hex[:12]}"
    index = target.with_name(target.name + ".idx")
    off = "" if submodules else "the mission does not check out submodules: set `submodules: true` on it"
    facts = TreeFacts(top=target, folder=source.prefix, hash_size=len(commit) // 2, default_reason=off)
    facts.indexes.append(("", index))
    reuse = reuse and snapshot_reuse.possible(submodules=submodules)
    small = kept = False
    try:
        with mirrors.in_use(source):
            mirror = mirrors.ensure_commit(source, commit)
            fresh = not (reuse and snapshot_reuse.made_from_kept(source, mirror, commit, target, index))
            if fresh:
                target.mkdir()
                _fill(source, mirror, commit, target, index)
            links = subs.urls(mirror, commit) if submodules else {}
        small = not submodules and _index_entries(index) <= SMALL_TREE_FILES
        if submodules:
            _populate(source, links, index, target, "", facts, depth=0)
        if fresh:  # one made from a kept snapshot has its own pass (`_writable_added_folders`)
            _writable_folders(target)
        with tree_index.registered(facts):
            yield mission_folder(target, source.prefix, commit)
        # Only after a run that ended normally: an exception may have left a write half done.
        kept = (
            reuse
            and not facts.written
            and snapshot_reuse.possible(submodules=submodules)
            and _index_entries(index) >= snapshot_reuse.KEEP_MIN_FILES
        )
    except subprocess.TimeoutExpired as exc:
        raise SourceUnavailable(f"the checkout of {commit[:12]} from {source.display} timed out") from exc
    finally:
        if kept:
            kept = snapshot_reuse.keep(source.key, folder=target, index=index, commit=commit)
        for _where, path in facts.indexes:
            if not kept:
                path.unlink(missing_ok=True)
        if not kept:
            remove_tree(target, in_process=small)


def mission_folder(target: Path, prefix: str, commit: str) -> Path:
    """The mission's folder in the snapshot `target`: every part of `prefix` a real folder
    of the checkout. A part committed as a symlink is never followed: it may point out of
    the snapshot (to another repository, or the user's working tree), where the checks would
    judge other files and protection would write (docs/REPOSITORIES.md, "Snapshots")."""
    folder = target
    for part in [p for p in prefix.split("/") if p]:
        folder = folder / part
        try:
            st = os.lstat(folder)
        except OSError:
            raise SnapshotError(
                f"revision {commit[:12]} has no folder {prefix} (the mission's folder in its repository)"
            ) from None
        if stat.S_ISLNK(st.st_mode):
            link = folder.relative_to(target).as_posix()
            raise SnapshotError(
                f"the mission's folder {prefix} is a symlink at revision {commit[:12]} ({link} -> "
                f"{os.readlink(folder)[:200]}); a committed symlink is never followed, so this revision "
                "cannot be judged there"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise SnapshotError(
                f"revision {commit[:12]} has no folder {prefix} (the mission's folder in its repository)"
            )
    return folder


def _fill(source: Source, mirror: Path, commit: str, work_tree: Path, index: Path) -> None:
    """Check `commit` out into `work_tree`: one batch fetch of the blobs a partial mirror
    lacks, then `git read-tree -u` with an index of its own outside the folder."""
    with mirrors.filling(source, mirror, commit):
        fill = run_git(
            [
                *MIRROR_MODES,
                *INDEX_FORMAT,
                "--git-dir",
                str(mirror),
                "--work-tree",
                str(work_tree),
                "read-tree",
                "-u",
                "--reset",
                commit,
            ],
            source=source,
            timeout=settings.FUSION_GIT_REMOTE_TIMEOUT,
            extra_env={"GIT_INDEX_FILE": str(index)},
            umask=READ_ONLY_UMASK,
        )
    if fill.returncode != 0:
        raise SourceUnavailable(
            f"commit {commit[:12]} of {source.display} could not be checked out: "
            + scrub(fill.stderr.strip()[-400:], source)
        )


def _populate(
    parent: Source, links: dict[str, str], index: Path, folder: Path, where: str, facts: TreeFacts, *, depth: int
) -> None:
    """Fill the submodule folders of the checkout at `folder` (`where` in the snapshot),
    whose index is `index` and whose `.gitmodules` gave `links`, at their gitlinks' commits,
    and theirs in turn down to `MAX_DEPTH` levels. A folder left empty is recorded with why
    (a check that needs it is blocked); a submodule that cannot be fetched ends the run."""
    for entry in read_index(index, facts.hash_size):
        if entry.mode != GITLINK:
            continue
        path = where + entry.path
        url = links.get(entry.path)
        if url is None or depth >= subs.MAX_DEPTH or len(facts.populated) >= subs.MAX_SUBMODULES:
            facts.unfetched[path] = _left_empty(url, depth=depth, count=len(facts.populated))
            continue
        source = subs.source_for(parent, url, path=path)
        target = folder / entry.path
        if target.is_symlink() or not target.is_dir():
            raise SnapshotError(f"submodule {path}: its folder is not a plain folder of the checkout")
        os.chmod(target, 0o755)  # git made it read-only (its umask), like the rest
        sub_index = index.with_name(f"{facts.top.name}.{len(facts.indexes)}.idx")
        facts.indexes.append((path + "/", sub_index))  # recorded first: removed whatever happens
        commit = entry.oid.hex()
        with mirrors.in_use(source):
            try:
                mirror = mirrors.ensure_commit(source, commit)
            except SourceUnavailable as exc:
                raise SourceUnavailable(f"submodule {path}: {exc}") from exc
            _fill(source, mirror, commit, target, sub_index)
            nested = subs.urls(mirror, commit)
        facts.populated.add(path)
        _populate(source, nested, sub_index, target, path + "/", facts, depth=depth + 1)


def _left_empty(url: str | None, *, depth: int, count: int) -> str:
    if depth >= subs.MAX_DEPTH:
        return f"it is nested more than {subs.MAX_DEPTH} submodule levels deep"
    if count >= subs.MAX_SUBMODULES:
        return f"it comes after the first {subs.MAX_SUBMODULES} submodules, which are all a snapshot fills"
    return "its .gitmodules gives no URL for it"


# A checkout of at most this many files is removed in this process: starting `rm -rf`
# cost more than unlinking a few files here (bench/loop_throughput.py, whose baseline
# removes its snapshots so). What a check added to it is removed too, only more slowly.
SMALL_TREE_FILES = 64


def _index_entries(index: Path) -> int:
    """The number of files `git read-tree` checked out: its index's header (`DIRC`,
    version, entry count); unknown (a large number) when it cannot be read."""
    try:
        with open(index, "rb") as handle:
            head = handle.read(12)
    except OSError:
        return sys.maxsize
    return int.from_bytes(head[8:12], "big") if len(head) == 12 and head[:4] == b"DIRC" else sys.maxsize


@contextlib.contextmanager
def private_copy(source: Path) -> Iterator[Path]:
    """A copy of the snapshot `source` for one check, removed afterwards: what the check
    deletes or generates stays in its copy, and no other check sees it. A real copy: a
    hard link of a read-only file can be made writable and changed in place, which would
    change the snapshot too. Named like its snapshot (`run-<pk>-<hex>`), so that the sweep
    removes a copy a killed worker left."""
    # `source` may be the workspace's sub-folder of the snapshot: the label is the snapshot's.
    match = next((m for m in map(SNAPSHOT_NAME.match, (p.name for p in (source, *source.parents))) if m), None)
    target = snapshot_root() / f"{match.group(1) if match else 'copy'}-{uuid.uuid4().hex[:12]}"
    try:
        _copy_tree(source, target)
        yield target
    finally:
        remove_tree(target)


def _copy_tree(source: Path, target: Path) -> None:
    # `cp -a` keeps modes (read-only files), symlinks and times, and is faster than copytree
    # or a checkout (bench/check_copies.py); `--reflink=auto` shares the blocks where the
    # file system can (btrfs, XFS). Without GNU cp, copytree does the same, slower.
    try:
        done = run_nicer(["cp", "-a", "--reflink=auto", "--", str(source), str(target)]).returncode == 0
    except OSError:
        done = False
    if not done:
        remove_tree(target)
        shutil.copytree(source, target, symlinks=True)


# What `snapshot()` names its folders: `<label>-<12 hex>`, the label `run-<pk>`,
# `review-<pk>` or `replay-<pk>`. The sweep touches nothing else.
SNAPSHOT_NAME = re.compile(r"^((?:run|review|replay)-\d+)-[0-9a-f]{12}$")


def is_whole_snapshot(path: Path) -> bool:
    """Whether `path` is a snapshot's own top folder: the whole revision and nothing above
    it (not a repository's sub-folder, whose snapshot also holds the folders around it)."""
    return bool(SNAPSHOT_NAME.match(path.name)) and path.parent.resolve() == snapshot_root().resolve()


# A replay has no row that says it is running: its snapshot is spared for this long.
REPLAY_GRACE_SECONDS = 600


def sweep_snapshots(*, live_labels: Callable[[], set[str]]) -> int:
    """Remove snapshot folders (and index files) whose run is no longer live, left by a
    killed worker. Returns how many folders were removed.

    The candidates are listed first and `live_labels()` is asked after: a run is live
    before its snapshot exists, so a snapshot made meanwhile is never a candidate."""
    found = [child for child in snapshot_root().iterdir() if SNAPSHOT_NAME.match(_snapshot_of(child.name))]
    live = live_labels()
    removed = snapshot_reuse.sweep(snapshot_root())  # those kept by processes that are gone
    for path in found:
        if _is_live(path, live):
            continue
        if path.name != _snapshot_of(path.name) or path.is_symlink():  # a link is never ours: drop it, not its target
            path.unlink(missing_ok=True)
            continue
        remove_tree(path)
        removed += 1
    return removed


def _snapshot_of(name: str) -> str:
    """The snapshot a name in the snapshot folder belongs to: its own, or that of its index
    file (`<name>.idx`, a submodule's `<name>.<n>.idx`) or of git's lock of one
    (`….idx.lock`, left when the worker was killed during the checkout)."""
    return INDEX_NAME.sub("", name)


INDEX_NAME = re.compile(r"(?:\.\d+)?\.idx(?:\.lock)?$")


def _is_live(folder: Path, live_labels: set[str]) -> bool:
    named = SNAPSHOT_NAME.match(_snapshot_of(folder.name))
    if named is None:  # the callers pass only snapshot names; anything else is never ours to remove
        return True
    label = named.group(1)
    if label in live_labels:
        return True
    if label.startswith("replay-"):
        with contextlib.suppress(OSError):
            return time.time() - folder.stat().st_mtime < REPLAY_GRACE_SECONDS
    return False


def bounded_diff(source: Source | str, base: str, revision: str, limit: int = 60_000) -> str:
    """The diff from the mission's base to `revision`, from the mirror; '' when there is
    no base or it cannot be made (the agent then works without it)."""
    if not base:
        return ""
    try:
        source = as_source(source)
        base = pin_revision(source, base)
        with mirrors.in_use(source):
            mirrors.ensure_commit(source, base)
            path = mirrors.ensure_commit(source, revision)
            text = mirrors.mirror_git(path, "diff", "--no-color", "--stat", "--patch", f"{base}..{revision}")
    except SnapshotError:
        return ""
    return text if len(text) <= limit else text[:limit] + f"\n[… diff truncated at {limit} characters]"
