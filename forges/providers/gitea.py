"""Gitea's (and Forgejo's) API, shaped as GitHub's: commit statuses (`POST
/repos/{repo}/statuses/{sha}`) and issue comments (`POST /repos/{repo}/issues/{n}/comments`,
`PATCH /repos/{repo}/issues/comments/{id}`); the token goes as `Authorization: token`."""

from __future__ import annotations

from forges.providers.base import ForgeRequest, StatusPost
from forges.providers.github import GitHub

JSON = {"Accept": "application/json"}


class Gitea(GitHub):
    def auth_headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"token {token}"}

    def status(self, *, api_url: str, repository: str, post: StatusPost) -> ForgeRequest:
        request = super().status(api_url=api_url, repository=repository, post=post)
        return ForgeRequest(request.method, request.url, request.json, dict(JSON))

    def create_comment(self, *, api_url: str, repository: str, number: int, body: str) -> ForgeRequest:
        request = super().create_comment(api_url=api_url, repository=repository, number=number, body=body)
        return ForgeRequest(request.method, request.url, request.json, dict(JSON))

    def edit_comment(self, *, api_url: str, repository: str, number: int, comment_id: str, body: str) -> ForgeRequest:
        request = super().edit_comment(
            api_url=api_url, repository=repository, number=number, comment_id=comment_id, body=body
        )
        return ForgeRequest(request.method, request.url, request.json, dict(JSON))

    def list_comments(self, *, api_url: str, repository: str, number: int) -> ForgeRequest:
        request = super().list_comments(api_url=api_url, repository=repository, number=number)
        return ForgeRequest(request.method, request.url.replace("per_page=", "limit="), None, dict(JSON))
