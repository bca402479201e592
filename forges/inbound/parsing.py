"""A verified delivery's event, read as one shape whatever the provider: a `Push`, a
`PullRequestChange`, or an `Ignored` with the reason it is none of those we follow.

What each provider sends (docs/FORGES.md, "What is matched"):
- GitHub: `push`; `pull_request` with action opened, reopened, synchronize, or edited
  when its title changed.
- Gitea / Forgejo: `push`; `pull_request` (or `pull_request_sync`) with action opened,
  reopened, synchronized.
- GitLab: `Push Hook`; `Merge Request Hook` with `object_attributes.action` open, reopen,
  or update when its head moved (`oldrev`, or a head other than the one we know).
- generic: `{"event": "push", "ref", "after"}` or `{"event": "pull_request", "action":
  opened|reopened|synchronize, "number", "branch", "title", "head", "url"}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forges.models import Provider

ZERO_SHA = "0" * 40


@dataclass(frozen=True)
class Push:
    ref: str
    head: str  # the pushed commit; all zeros when the branch was deleted


@dataclass(frozen=True)
class PullRequestChange:
    number: int
    branch: str
    title: str
    head: str
    url: str
    # GitLab's `update` of title or description only says nothing of its head: it counts
    # only when the head differs from the one stored for the request.
    only_if_head_moved: bool = False


@dataclass(frozen=True)
class Ignored:
    reason: str


Event = Push | PullRequestChange | Ignored


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _push(payload: dict[str, Any], head: Any) -> Event:
    ref, sha = _text(payload.get("ref")), _text(head)
    if not ref or not sha:
        return Ignored("a push without its ref or head")
    return Push(ref=ref, head=sha)


def _unfollowed(what: str, name: str) -> Ignored:
    return Ignored(f"{what} {name or '(none)'} is not followed")


def _not_a_pull_request(event: str, payload: dict[str, Any], push: str, pulls: tuple[str, ...]) -> Event | None:
    """The event when it is a push or not followed; None for a pull request's, which the
    provider's reader reads."""
    if event == push:
        return _push(payload, payload.get("after"))
    return None if event in pulls else _unfollowed("event", event)


def _change(number: Any, branch: Any, title: Any, head: Any, url: Any, *, only_if_moved: bool = False) -> Event:
    n, sha = _number(number), _text(head)
    if n is None or not sha:
        return Ignored("a pull request without its number or head")
    return PullRequestChange(
        number=n,
        branch=_text(branch)[:300],
        title=_text(title)[:500],
        head=sha,
        url=_text(url)[:500],
        only_if_head_moved=only_if_moved,
    )


def _github_like(event: str, payload: dict[str, Any], actions: tuple[str, ...], *, titles: bool = False) -> Event:
    if (other := _not_a_pull_request(event, payload, "push", ("pull_request", "pull_request_sync"))) is not None:
        return other
    action = _text(payload.get("action"))
    titled = titles and action == "edited" and "title" in _dict(payload.get("changes"))
    if action not in actions and not titled:
        return _unfollowed("pull request action", action)
    pr = _dict(payload.get("pull_request"))
    head = _dict(pr.get("head"))
    return _change(pr.get("number"), head.get("ref"), pr.get("title"), head.get("sha"), pr.get("html_url"))


def _gitlab(event: str, payload: dict[str, Any]) -> Event:
    if (other := _not_a_pull_request(event, payload, "Push Hook", ("Merge Request Hook",))) is not None:
        return other
    attrs = _dict(payload.get("object_attributes"))
    action = _text(attrs.get("action"))
    if action not in ("open", "reopen", "update"):
        return _unfollowed("merge request action", action)
    head = _dict(attrs.get("last_commit")).get("id")
    only_if_moved = action == "update" and not _text(attrs.get("oldrev"))
    return _change(
        attrs.get("iid"),
        attrs.get("source_branch"),
        attrs.get("title"),
        head,
        attrs.get("url"),
        only_if_moved=only_if_moved,
    )


def _generic(event: str, payload: dict[str, Any]) -> Event:
    if (other := _not_a_pull_request(event, payload, "push", ("pull_request",))) is not None:
        return other
    action = _text(payload.get("action"))
    if action not in ("opened", "reopened", "synchronize"):
        return _unfollowed("pull request action", action)
    return _change(
        payload.get("number"), payload.get("branch"), payload.get("title"), payload.get("head"), payload.get("url")
    )


def event_of(*, provider: str, event: str, payload: Any) -> Event:
    payload = _dict(payload)
    if provider == Provider.GITHUB:
        return _github_like(event, payload, ("opened", "reopened", "synchronize"), titles=True)
    if provider == Provider.GITEA:
        return _github_like(event, payload, ("opened", "reopened", "synchronized"))
    if provider == Provider.GITLAB:
        return _gitlab(event, payload)
    return _generic(event, payload)
