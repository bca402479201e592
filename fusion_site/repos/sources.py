"""A mission's repository source: a git URL or a local path, checked before git sees it.

Only the schemes below reach git (no `ext::`, no `fd::`, nothing that looks like an
option); every git call that takes a URL passes it after `--`, with `protocol.allow`
restricted to the same list (docs/REPOSITORIES.md). Credentials are never part of the
text: `credentials_env` names a variable on the workers.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings

from fusion_site.runtime.proc import run_nicer
from fusion_site.runtime.redact import redact


class SnapshotError(Exception):
    """The repository or revision cannot be read. Permanent: retrying will not fix it."""

    retry = False


class SourceUnavailable(SnapshotError):
    """The source is unreachable, or does not have the commit (yet): worth retrying."""

    retry = True


class SourceRefused(SnapshotError, ValueError):
    """The repository text is not a source this service reads."""


class UnknownRevision(SnapshotError):
    """The source answered, and has no branch, tag or commit of that name."""


URL_SCHEMES = ("https", "ssh", "git", "file")
# scp-like `user@host:path` (git reads it as ssh); the host never starts with `-`.
SCP_LIKE = re.compile(r"^(?P<user>[A-Za-z0-9._~-]+)@(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*):(?P<path>(?!/)[^\s]+|/[^\s]+)$")
# Any `<transport>::<address>` form is a remote helper (`ext::sh -c …` runs commands).
HELPER = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
CONTROL = re.compile(r"[\x00-\x20\x7f]")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where git reads a mission's commits: `url` is a URL or an absolute local path."""

    url: str
    local: bool
    credentials_env: str = ""
    # The mission's folder inside the repository (`app/`), for a local path that is a
    # sub-folder of its repository; '' for the whole repository.
    prefix: str = ""

    @property
    def key(self) -> str:
        """The mirror's name in the cache: a hash of the normalized URL and of the name of
        the variable that holds its credentials (never of their value). Missions that read
        one URL with different access never share a mirror: a commit fetched with one
        mission's token is never read by another without asking the server."""
        identity = self.url if not self.credentials_env else f"{self.url}\n{self.credentials_env}"
        return hashlib.sha256(identity.encode()).hexdigest()[:24]

    @property
    def display(self) -> str:
        return display_url(self.url)

    @property
    def scheme(self) -> str:
        if self.local:
            return "file"
        if SCP_LIKE.match(self.url):
            return "ssh"
        return urlsplit(self.url).scheme.lower()


def display_url(url: str) -> str:
    """The URL without any user-info password (never shown, never stored elsewhere)."""
    parts = urlsplit(url) if "://" in url else None
    if parts is None or not parts.password:
        return url
    netloc = f"{parts.username}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()


def is_url(text: str) -> bool:
    text = text.strip()
    return "://" in text or bool(SCP_LIKE.match(text)) or bool(HELPER.match(text))


def normalize(text: str) -> Source:
    """The source `text` names, or `SourceRefused` with the reason. Local paths (and
    `file://` URLs) must be absolute; whether the caller may name one is `local_allowed`."""
    text = (text or "").strip()
    if not text:
        raise SourceRefused("no repository")
    if CONTROL.search(text):
        raise SourceRefused("a repository may not contain spaces or control characters")
    if text.startswith("-"):
        raise SourceRefused("a repository may not start with '-'")
    if HELPER.match(text):
        raise SourceRefused("remote helpers (`<transport>::…`) are not accepted; use https, ssh, git or file")
    if scp := SCP_LIKE.match(text):
        if scp.group("path").startswith("-"):
            raise SourceRefused("the repository path may not start with '-'")
        return Source(url=text, local=False)
    if "://" in text:
        return _url_source(text)
    if not os.path.isabs(text):
        raise SourceRefused("a local repository must be an absolute path (or a URL)")
    return Source(url=os.path.normpath(text), local=True)


def _url_source(text: str) -> Source:
    try:
        parts = urlsplit(text)
        _port = parts.port
    except ValueError as exc:
        raise SourceRefused(f"not a valid URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in URL_SCHEMES:
        raise SourceRefused(f"scheme {scheme}:// is not accepted; use one of " + ", ".join(URL_SCHEMES))
    if parts.password:
        raise SourceRefused("put the token in the variable credentials_env names, not in the URL")
    if parts.query or parts.fragment:
        raise SourceRefused("a repository URL has no query or fragment")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise SourceRefused("a file:// URL names a path on the workers (file:///path)")
        return Source(url=os.path.normpath(parts.path or "/"), local=True)
    host = parts.hostname or ""
    if not host or host.startswith("-") or not parts.path.strip("/"):
        raise SourceRefused(f"a {scheme}:// URL needs a host and a path")
    if parts.path.lstrip("/").startswith("-") or (parts.username or "").startswith("-"):
        raise SourceRefused("no part of a repository URL may start with '-'")
    netloc = parts.netloc.replace(parts.hostname or "", host.lower(), 1) if parts.hostname else parts.netloc
    url = parts._replace(scheme=scheme, netloc=netloc, path=parts.path.rstrip("/") or "/").geturl()
    return Source(url=url, local=False)


def workspace_roots() -> list[str]:
    return [os.path.realpath(root) for root in settings.FUSION_WORKSPACE_ROOTS if root]


def local_allowed(path: str, *, staff: bool) -> bool:
    """Staff may name any local repository; others only one inside `FUSION_WORKSPACE_ROOTS`."""
    if staff:
        return True
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in workspace_roots())


def check_repository(text: str, *, staff: bool) -> str:
    """The repository text as stored (a local path or `file://` URL as the absolute path),
    or `SourceRefused` naming what is wrong."""
    if not (text or "").strip():
        return ""
    source = normalize(text)
    if source.local and not local_allowed(source.url, staff=staff):
        raise SourceRefused(
            "a local repository (a path or file:// URL) is accepted from staff only, or inside "
            "FUSION_WORKSPACE_ROOTS; give a git URL"
        )
    return source.url if source.local else text.strip()


def check_credentials_env(name: str) -> str:
    name = (name or "").strip()
    if name and not ENV_NAME.match(name):
        raise SourceRefused("credentials_env is the name of an environment variable (letters, digits, _)")
    return name


# ---------------------------------------------------------------- running git on a source


def git_env(source: Source | None = None) -> dict[str, str]:
    """A scrubbed environment for git: no prompt, no system or user config that could
    name a helper, only the allowed protocols, and the source's credentials."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        # Nor the worker user's ~/.gitconfig: its credential helper would answer for any
        # mission's URL, lending the worker's own access to whoever names a repository.
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GIT_SSH_COMMAND": "ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new",
        # Replace refs and grafts rewrite what a commit id means: a check that wrote one
        # into a mirror would swap the tree judged at a commit, or the protected-file diff.
        # The host's git reads objects as their ids name them (docs/REPOSITORIES.md).
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_GRAFT_FILE": os.devnull,
    }
    config = [("protocol.allow", "never")] + [(f"protocol.{s}.allow", "always") for s in URL_SCHEMES]
    secret = credentials(source)
    if secret and source is not None:
        if source.scheme == "https":
            user_pass = secret if ":" in secret else f"x-access-token:{secret}"
            header = "Authorization: Basic " + base64.b64encode(user_pass.encode()).decode()
            config.append(("http.extraHeader", header))
        elif source.scheme == "ssh":
            env["GIT_SSH_COMMAND"] += f" -o IdentitiesOnly=yes -i '{secret}'"
    # In the environment, not on the command line: `ps` shows arguments to everyone.
    env["GIT_CONFIG_COUNT"] = str(len(config))
    for i, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def credentials(source: Source | None) -> str:
    """The secret the source's `credentials_env` names, only where the deployment lets it go
    (`credentials_allowed`): a stored row the settings no longer allow (or never did) makes
    git go without credentials rather than hand a worker's variable to another URL."""
    if source is None or not credentials_allowed(source.credentials_env, source.url):
        return ""
    return _named_secret(source)


def _named_secret(source: Source | None) -> str:
    """The value of the variable the source names, sent or not."""
    return os.environ.get(source.credentials_env, "") if source is not None and source.credentials_env else ""


def scrub(text: str, source: Source | None) -> str:
    """`text` (git's output) without the source's secret or a URL password (the value of the
    variable it names even when it was not sent: it may still be echoed)."""
    secret = _named_secret(source)
    if secret:
        text = text.replace(secret, "[redacted]")
        text = text.replace(base64.b64encode(secret.encode()).decode(), "[redacted]")
    return redact(text)


def run_git(
    args: list[str],
    *,
    cwd: Path | None = None,
    source: Source | None = None,
    timeout: float,
    extra_env: dict[str, str] | None = None,
    umask: int = -1,
) -> subprocess.CompletedProcess:
    """`umask`: the git process's own (-1: this process's). Output is read as UTF-8 with
    undecodable bytes replaced: a file name or a diff line that is not UTF-8 must never
    fail the call (and a lone surrogate would reach the database); a caller that needs a
    path exactly reads git's bytes itself (`validation.base_tree.tree`)."""
    env = {**git_env(source), **(extra_env or {})}
    command = ["git", *(["-C", str(cwd)] if cwd else []), *args]
    return run_nicer(command, text=True, encoding="utf-8", errors="replace", timeout=timeout, env=env, umask=umask)


def safe_revision(name: str) -> str:
    """A revision name git can take as a value: a ref name or a commit id, never an option."""
    name = (name or "").strip()
    if not name or name.startswith("-") or CONTROL.search(name) or ".." in name or ":" in name or "\\" in name:
        raise SourceRefused(f"{name[:80]!r} is not a revision name (a commit id, a branch or a tag)")
    return name


# ---------------------------------------------------------------- where a credential may go


@dataclasses.dataclass(frozen=True)
class UrlPlace:
    """Where a URL leads, compared part by part: scheme, host, port, user (when named) and
    the path's segments (decoded; no `.` or `..`)."""

    scheme: str
    host: str
    port: int | None
    user: str
    segments: tuple[str, ...]


DEFAULT_PORTS = {"https": 443, "ssh": 22, "git": 9418}


def url_place(url: str) -> UrlPlace | None:
    """The place `url` (a URL, an scp-like address or an absolute local path) names, or
    None when it cannot be read safely (a `.`/`..` segment, an unreadable port, no host)."""
    url = (url or "").strip()
    if scp := SCP_LIKE.match(url):
        scheme, host, port, user, path = "ssh", scp.group("host"), None, scp.group("user"), scp.group("path")
    elif "://" in url:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        scheme, host, user, path = parts.scheme.lower(), parts.hostname or "", parts.username or "", parts.path
        if scheme != "file" and not host:
            return None
    elif os.path.isabs(url):
        scheme, host, port, user, path = "file", "", None, "", url
    else:
        return None
    if re.search(r"%(?:2f|5c)", path, re.I):  # an escaped slash: servers read it either way
        return None
    segments = tuple(s for s in unquote(path).split("/") if s)
    if any(s in (".", "..") or "\\" in s for s in segments):
        return None
    host = host.lower().rstrip(".")
    return UrlPlace(scheme, host, port or DEFAULT_PORTS.get(scheme), user, segments)


def url_within(url: str, prefix: str) -> bool:
    """Whether `url` lies under `prefix`: the same scheme, host and port (and user, when the
    prefix names one), and the prefix's path segments are the first segments of the URL's.
    `https://github.com/acme/` covers `https://github.com/acme/shop.git`, never
    `https://github.com/acme-evil/…` nor `https://github.com.evil.com/acme/…`."""
    place, within = url_place(url), url_place(prefix)
    if place is None or within is None:
        return False
    if (place.scheme, place.host, place.port) != (within.scheme, within.host, within.port):
        return False
    if within.user and place.user != within.user:
        return False
    return place.segments[: len(within.segments)] == within.segments


def credential_prefixes(name: str) -> list[str]:
    """The URL prefixes the deployment lets variable `name` be sent to
    (`FUSION_GIT_CREDENTIALS`, docs/CONFIGURATION.md); none for an unlisted variable."""
    prefixes = settings.FUSION_GIT_CREDENTIALS.get(name) if name else None
    return [p for p in prefixes if isinstance(p, str)] if isinstance(prefixes, list) else []


def credentials_allowed(name: str, url: str) -> bool:
    """Whether the variable `name` may be used for the repository at `url`."""
    return any(url_within(url, prefix) for prefix in credential_prefixes(name))
