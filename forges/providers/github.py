"""GitHub's REST API: commit statuses (`POST /repos/{repo}/statuses/{sha}`) and issue
comments (a pull request is an issue: `POST /repos/{repo}/issues/{n}/comments`, `PATCH
/repos/{repo}/issues/comments/{id}`)."""

from __future__ import annotations

from urllib.parse import quote

from forges.providers.base import ForgeRequest, StatusPost, join

ACCEPT = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}


def repo_path(repository: str) -> str:
    return "/".join(quote(part, safe="") for part in repository.strip("/").split("/"))


class GitHub:
    def auth_headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def status(self, *, api_url: str, repository: str, post: StatusPost) -> ForgeRequest:
        body = {
            "state": post.state,
            "target_url": post.target_url,
            "description": post.description,
            "context": post.context,
        }
        url = join(api_url, f"repos/{repo_path(repository)}/statuses/{quote(post.sha, safe='')}")
        return ForgeRequest("POST", url, body, dict(ACCEPT))

    def create_comment(self, *, api_url: str, repository: str, number: int, body: str) -> ForgeRequest:
        url = join(api_url, f"repos/{repo_path(repository)}/issues/{number}/comments")
        return ForgeRequest("POST", url, {"body": body}, dict(ACCEPT))

    def edit_comment(self, *, api_url: str, repository: str, number: int, comment_id: str, body: str) -> ForgeRequest:
        url = join(api_url, f"repos/{repo_path(repository)}/issues/comments/{quote(comment_id, safe='')}")
        return ForgeRequest("PATCH", url, {"body": body}, dict(ACCEPT))

    def list_comments(self, *, api_url: str, repository: str, number: int) -> ForgeRequest:
        url = join(api_url, f"repos/{repo_path(repository)}/issues/{number}/comments?per_page=100")
        return ForgeRequest("GET", url, None, dict(ACCEPT))
