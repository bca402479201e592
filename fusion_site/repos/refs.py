"""Names to commits (docs/TRUTH.md, "Which revision"): what a branch, tag, `HEAD` or short
id names at a source now, asked of the source itself (`git ls-remote`, bounded time) and
remembered as shown with the source's own access (`mirror_guard`)."""

from __future__ import annotations

import re

from fusion_site.repos import mirror_guard, mirrors
from fusion_site.repos.sources import Source, UnknownRevision, safe_revision


def resolve(source: Source, name: str) -> str:
    """The full commit id `name` names at the source now. A full id needs no network
    call; a branch, tag or `HEAD` is asked of the source with `git ls-remote` (bounded
    time); a short id is looked up in the mirror after a refresh."""
    name = safe_revision(name)
    if mirrors.FULL_COMMIT.match(name):
        return name
    found = _lsremote_git(source, name)
    if found:
        return found
    if re.fullmatch(r"[0-9a-f]{4,39}", name):
        path = mirrors.ensure_mirror(source)
        mirrors.refresh(source, path)
        proc = mirrors.local_git(
            ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{name}^{{commit}}"], cwd=path
        )
        if proc.returncode == 0 and mirrors.FULL_COMMIT.match(proc.stdout.strip()):
            return proc.stdout.strip()
    raise UnknownRevision(f"revision {name} is not a branch, tag or commit of repository {source.display}")


def _lsremote_git(source: Source, name: str) -> str:
    # `<name>^{}` too: a pattern alone hides the peeled line of an annotated tag, whose own
    # id is a tag object, not the commit to judge.
    refs, _links = _advertised(source, name, f"{name}^{{}}")
    if name == "HEAD":
        return refs.get("HEAD", "")
    # The order git itself reads a short name in (a peeled annotated tag is its commit).
    for ref in (name, f"refs/{name}", f"refs/tags/{name}", f"refs/heads/{name}"):
        if ref in refs:
            found = refs.get(f"{ref}^{{}}", refs[ref])
            mirror_guard.remember(source, found)  # the source showed it, with this source's access
            return found
    return ""


def _advertised(source: Source, *patterns: str, symref: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """What the source shows of `patterns` now (`git ls-remote`, bounded time): {ref: id},
    and with `symref` {ref: the ref it names} (`HEAD` → `refs/heads/main`)."""
    proc = mirrors.remote_git(source, ["ls-remote", *(["--symref"] if symref else []), "--", source.url, *patterns])
    if proc.returncode != 0:
        raise mirrors.unreachable(source, proc)
    refs, links = {}, {}
    for line in proc.stdout.splitlines():
        value, _, ref = line.partition("\t")
        if value.startswith("ref: "):
            links[ref] = value.removeprefix("ref: ")
        else:
            refs[ref] = value
    return refs, links


def branch_head(source: Source, branch: str = "") -> tuple[str, str]:
    """(name, full commit id) of `branch` at the source now, or without one of the source's
    default branch: the branch its `HEAD` names (a URL: the remote's default branch; a
    local path: the branch its working copy has checked out), whose name is read with its
    commit in one answer; `HEAD` itself when it is detached. `UnknownRevision` when the
    source has no such branch (docs/TRUTH.md, "Which revision")."""
    if branch:
        ref = f"refs/heads/{safe_revision(branch)}"
        refs, _links = _advertised(source, ref)
        if ref not in refs:
            raise UnknownRevision(f"branch {branch} does not exist in repository {source.display}")
        mirror_guard.remember(source, refs[ref])  # the source showed it, with this source's access
        return branch, refs[ref]
    refs, links = _advertised(source, "HEAD", symref=True)
    if "HEAD" not in refs:
        raise UnknownRevision(f"repository {source.display} has no commit on its HEAD to judge")
    named = links.get("HEAD", "")
    return (named.removeprefix("refs/heads/") if named.startswith("refs/heads/") else "HEAD"), refs["HEAD"]
