"""Where a commit's submodules come from (docs/REPOSITORIES.md, "Submodules"): the URLs
of its `.gitmodules`, read from the commit itself in the mirror, and checked by the same
rules as a mission's repository before git sees them.

Git's own `submodule update` is never run: it reads the repository's config, which can
name commands (`submodule.<name>.update = !…`), and it would clone into the snapshot a
`.git` a check could reach. `snapshots.snapshot` fills each submodule folder from a
mirror of its own instead.
"""

from __future__ import annotations

import os
import posixpath
import subprocess
from urllib.parse import urlsplit

from fusion_site.repos.sources import (
    SCP_LIKE,
    Source,
    SourceRefused,
    SourceUnavailable,
    git_env,
    local_allowed,
    normalize,
)
from fusion_site.runtime.proc import run_nicer

# How deep submodules of submodules are populated; deeper ones stay empty, and a check
# that needs them is blocked (`submodule_not_fetched`), never judged on an empty folder.
MAX_DEPTH = 3
# Submodules of one snapshot, all levels: every one is a fetch, and `.gitmodules` is
# written by whoever pushes to the repository.
MAX_SUBMODULES = 64


def urls(mirror: os.PathLike[str] | str, commit: str) -> dict[str, str]:
    """Each submodule path of `commit`'s `.gitmodules` with its URL, as written there.
    Read from the commit's blob (`git config --blob`, includes off): never a file of a
    checkout, never git's own submodule machinery."""
    args = ["git", "--git-dir", str(mirror), "config", "--no-includes", "-z", "--blob", f"{commit}:.gitmodules"]
    try:
        proc = run_nicer([*args, "--list"], env=git_env(), timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise SourceUnavailable(f"reading .gitmodules of {commit[:12]} timed out") from exc
    if proc.returncode != 0:
        return {}  # no .gitmodules (or none git can read): every submodule has no URL
    names: dict[str, dict[str, str]] = {}
    for item in proc.stdout.split(b"\0"):
        key, _, value = os.fsdecode(item).partition("\n")
        section, _, rest = key.partition(".")
        name, _, variable = rest.rpartition(".")
        if section == "submodule" and name and variable in ("path", "url"):
            names.setdefault(name, {})[variable] = value
    return {v["path"].strip("/"): v["url"] for v in names.values() if v.get("path") and v.get("url")}


def source_for(parent: Source, url: str, *, path: str) -> Source:
    """The source of the submodule at `path` whose `.gitmodules` URL is `url`: a relative
    URL is read against the parent's, the result follows the repository rules, a local
    one must lie inside `FUSION_WORKSPACE_ROOTS` (whoever named the mission: the URL is
    the repository's content, written by whoever pushes), and the parent's credentials go
    along only to the parent's own host."""
    text = _absolute(parent.url, url.strip()) if url.strip().startswith(("./", "../")) else url.strip()
    try:
        source = normalize(text)
    except SourceRefused as exc:
        raise SourceRefused(f"submodule {path}: {exc}") from exc
    if source.local and not local_allowed(source.url, staff=False):
        raise SourceRefused(
            f"submodule {path}: a local submodule ({source.url}) must lie inside FUSION_WORKSPACE_ROOTS"
        )
    credentials = parent.credentials_env if _same_host(parent, source) else ""
    return Source(url=source.url, local=source.local, credentials_env=credentials)


def _absolute(base: str, relative: str) -> str:
    """`relative` (`./x`, `../x`) read against `base` the way git reads a submodule URL:
    each `../` drops one part of the base's path, `./` none."""
    if SCP_LIKE.match(base):
        host, _, path = base.partition(":")
        return f"{host}:{'/' if path.startswith('/') else ''}{_join(path, relative)}"
    if "://" in base:
        parts = urlsplit(base)
        return parts._replace(path="/" + _join(parts.path.strip("/"), relative).lstrip("/")).geturl()
    return "/" + _join(base.strip("/"), relative).lstrip("/")


def _join(path: str, relative: str) -> str:
    parts = [p for p in path.rstrip("/").split("/") if p]
    while relative.startswith(("./", "../")):
        if relative.startswith("../"):
            if not parts:
                raise SourceRefused(f"the submodule URL {relative!r} climbs above its repository's URL")
            parts.pop()
            relative = relative[3:]
        else:
            relative = relative[2:]
    return posixpath.join("/".join(parts), relative)


def _same_host(parent: Source, source: Source) -> bool:
    if parent.local or source.local or parent.scheme != source.scheme:
        return False
    return _host(parent.url) == _host(source.url)


def _host(url: str) -> str:
    if scp := SCP_LIKE.match(url):
        return f"{scp.group('user')}@{scp.group('host').lower()}"
    parts = urlsplit(url)
    return f"{parts.username or ''}@{(parts.hostname or '').lower()}:{parts.port or ''}"
