"""A pull request updated three times, end to end (issue 40, "Tests"): three heads pushed
to a real `git daemon` repository, the forge's signed webhooks for the pull request
opened and then updated twice, a real Dramatiq worker that matches each delivery, fetches
the head through the mirror cache and judges it, and the local forge over real HTTP that
receives the statuses of each head and one comment, created once and then edited, that
ends on the last verdict. A failing head shows its fix feature's "Validation cause"."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from forges.models import Forge, Outbox, OutboxState
from missions.models import MissionFeature
from tests.forges.conftest import BAD, GOOD, GREETING, POLITE, RUDE, github_pr, gitlab_mr, hook
from tests.repos.conftest import wait_for
from validation.models import FixLineage, RunStatus, ValidatorRun

pytestmark = pytest.mark.django_db(transaction=True)

NUMBER = 7
BRANCH = "agent/hello"
TITLE = "[hello] say hello politely"

# What each provider calls the pull request's events and the run's states.
SHAPES: dict[str, dict[str, Any]] = {
    "github": {
        "event": "pull_request",
        "actions": ("opened", "synchronize"),
        "pending": "pending",
        "failed": "failure",
        "create": ("POST", f"/issues/{NUMBER}/comments"),
        "edit": ("PATCH", "/issues/comments/"),
    },
    "gitlab": {
        "event": "Merge Request Hook",
        "actions": ("open", "update"),
        "pending": "running",
        "failed": "failed",
        "create": ("POST", f"/merge_requests/{NUMBER}/notes"),
        "edit": ("PUT", f"/merge_requests/{NUMBER}/notes/"),
    },
    "gitea": {
        "event": "pull_request",
        "actions": ("opened", "synchronized"),
        "pending": "pending",
        "failed": "failure",
        "create": ("POST", f"/issues/{NUMBER}/comments"),
        "edit": ("PATCH", "/issues/comments/"),
    },
}


def pull_request_event(provider: str, head: str, previous: str | None) -> dict[str, Any]:
    opened, updated = SHAPES[provider]["actions"]
    action = opened if previous is None else updated
    if provider == "gitlab":
        return gitlab_mr(NUMBER, BRANCH, TITLE, head, action, oldrev=previous)
    return github_pr(NUMBER, BRANCH, TITLE, head, action)


def the_comment(fake_forge) -> str:
    with fake_forge.lock:
        bodies = [c["body"] for c in fake_forge.comments.values()]
    return bodies[0] if len(bodies) == 1 else ""


def outbox_settled() -> bool:
    return not Outbox.objects.exclude(state__in=[OutboxState.DELIVERED, OutboxState.SUPERSEDED]).exists()


@pytest.mark.parametrize("provider", ["github", "gitlab", "gitea"])
def test_a_pull_request_updated_three_times(worker, build_mission, served, fake_forge, provider):
    shape = SHAPES[provider]
    mission = build_mission({"hello": [("GREET", GREETING), ("POLITE", POLITE)]}, auto_fix=True, workspace=served.url)
    Forge.objects.create(
        mission=mission, provider=provider, api_url=fake_forge.api_url(provider), repository="acme/shop"
    )
    hello = MissionFeature.objects.get(mission=mission, key="hello")
    client = Client()
    heads: list[str] = []
    comments: list[str] = []

    for files in (BAD, RUDE, GOOD):
        head = served.commit(files, f"hello: {len(heads) + 1}", push=False)
        served.push(f"HEAD:refs/heads/{BRANCH}")
        answer = hook(
            client,
            mission,
            pull_request_event(provider, head, heads[-1] if heads else None),
            provider=provider,
            event=shape["event"],
        )
        assert answer.status_code == 202, answer.content
        heads.append(head)
        run = wait_for(
            lambda head=head: (
                ValidatorRun.objects.filter(feature=hello, revision=head).exclude(status=RunStatus.RUNNING).first()
            ),
            message=f"the verdict at {head[:12]}",
        )
        # The verdict reaches the forge: the comment says it (and names the head).
        comments.append(
            wait_for(
                lambda head=head: (body := the_comment(fake_forge)) and f"at `{head[:12]}`" in body and body,
                message=f"the comment on the verdict at {head[:12]}",
            )
        )
        wait_for(outbox_settled, message="every status and comment delivered")
        assert run.status == (RunStatus.PASSED if files is GOOD else RunStatus.FAILED), run.error

    runs = list(ValidatorRun.objects.filter(feature=hello).order_by("id"))
    assert [(r.revision, r.status) for r in runs] == list(
        zip(heads, [RunStatus.FAILED, RunStatus.FAILED, RunStatus.PASSED], strict=True)
    )
    # Each head: its verdict's status last; the start's status, when it was not superseded
    # by the verdict before it was sent, before it; no state twice.
    for head, final in zip(heads, [shape["failed"], shape["failed"], "success"], strict=True):
        states = [s["state"] for s in fake_forge.statuses_of(head)]
        assert states in ([shape["pending"], final], [final]), (head, states)
        assert all(s["repo"] == "acme/shop" and s["provider"] == provider for s in fake_forge.statuses_of(head))

    # One comment, created at the first verdict and edited at each next one.
    created = fake_forge.requests_to(shape["create"][0], shape["create"][1])
    edits = fake_forge.requests_to(*shape["edit"])
    assert len(created) == 1 and len(edits) >= 2, (created, edits)
    [(comment_id, comment)] = fake_forge.comments.items()
    assert all(e.path.endswith(f"/{comment_id}") for e in edits)
    assert comment["number"] == NUMBER and comment["body"] == comments[-1]
    assert f"`hello` ✅ passed at `{heads[-1][:12]}`" in comment["body"]
    assert "2/2 assertions passed" in comment["body"]

    # The failing heads' comments carried their fix feature's "Validation cause".
    for run, body in zip(runs[:2], comments[:2], strict=True):
        assert f"`hello` ❌ failed at `{run.revision[:12]}`" in body
        lineage = FixLineage.objects.get(run=run)
        assert f"### Fix feature `{lineage.fix.key}`" in body and "#### Validation cause" in body
        assert f"Validator run {run.pk} (revision `{run.revision[:12]}`) failed:" in body
    assert "### POLITE" in comments[1]  # the second head failed only POLITE: the cause names it
