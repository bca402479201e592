"""GitLab's REST API (v4): commit statuses (`POST /projects/{id}/statuses/{sha}`, the
project's path URL-encoded as its id) and merge request notes (`POST
/projects/{id}/merge_requests/{iid}/notes`, `PUT …/notes/{note_id}`); the token goes as
`PRIVATE-TOKEN`."""

from __future__ import annotations

from urllib.parse import quote

from forges.providers.base import ForgeRequest, StatusPost, join

JSON = {"Accept": "application/json"}
# GitLab's words for our states: a run that started is `running`; GitLab has no `error`
# (a cancelled run is `canceled`, any other error `failed`).
STATES = {"pending": "running", "success": "success", "failure": "failed", "error": "failed"}


def project(repository: str) -> str:
    return quote(repository.strip("/"), safe="")


class GitLab:
    def auth_headers(self, token: str) -> dict[str, str]:
        return {"PRIVATE-TOKEN": token}

    def status(self, *, api_url: str, repository: str, post: StatusPost) -> ForgeRequest:
        state = "canceled" if post.run_status == "cancelled" else STATES[post.state]
        body = {
            "state": state,
            "name": post.context,
            "target_url": post.target_url,
            "description": post.description,
        }
        url = join(api_url, f"projects/{project(repository)}/statuses/{quote(post.sha, safe='')}")
        return ForgeRequest("POST", url, body, dict(JSON))

    def create_comment(self, *, api_url: str, repository: str, number: int, body: str) -> ForgeRequest:
        url = join(api_url, f"projects/{project(repository)}/merge_requests/{number}/notes")
        return ForgeRequest("POST", url, {"body": body}, dict(JSON))

    def edit_comment(self, *, api_url: str, repository: str, number: int, comment_id: str, body: str) -> ForgeRequest:
        url = join(
            api_url, f"projects/{project(repository)}/merge_requests/{number}/notes/{quote(comment_id, safe='')}"
        )
        return ForgeRequest("PUT", url, {"body": body}, dict(JSON))

    def list_comments(self, *, api_url: str, repository: str, number: int) -> ForgeRequest:
        url = join(api_url, f"projects/{project(repository)}/merge_requests/{number}/notes?per_page=100")
        return ForgeRequest("GET", url, None, dict(JSON))
