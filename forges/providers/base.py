"""What every forge adapter answers: the requests for a commit status and for the pull
request's one comment, and the header that carries the token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ForgeRequest:
    method: str
    url: str
    json: dict[str, Any] | None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StatusPost:
    """A commit status in our own words: `state` is pending | success | failure | error
    (GitHub's and Gitea's); `run_status` the run's end, which GitLab's words need."""

    sha: str
    state: str
    description: str
    target_url: str
    context: str
    run_status: str = ""


class Adapter(Protocol):
    def auth_headers(self, token: str) -> dict[str, str]: ...

    def status(self, *, api_url: str, repository: str, post: StatusPost) -> ForgeRequest: ...

    def create_comment(self, *, api_url: str, repository: str, number: int, body: str) -> ForgeRequest: ...

    def edit_comment(
        self, *, api_url: str, repository: str, number: int, comment_id: str, body: str
    ) -> ForgeRequest: ...

    def list_comments(self, *, api_url: str, repository: str, number: int) -> ForgeRequest: ...


def join(api_url: str, path: str) -> str:
    return f"{api_url.rstrip('/')}/{path.lstrip('/')}"
