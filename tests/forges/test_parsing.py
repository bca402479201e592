"""Each provider's events read as one shape (docs/FORGES.md, "What is matched"): what is
followed, and the reason given for what is not."""

from __future__ import annotations

import pytest

from forges.inbound.parsing import Ignored, PullRequestChange, Push, event_of

from .conftest import github_pr, gitlab_mr

SHA = "f" * 40


@pytest.mark.parametrize(
    ("provider", "event", "payload", "expected"),
    [
        ("github", "push", {"ref": "refs/heads/x", "after": SHA}, Push("refs/heads/x", SHA)),
        ("gitea", "push", {"ref": "refs/heads/x", "after": SHA}, Push("refs/heads/x", SHA)),
        ("gitlab", "Push Hook", {"ref": "refs/heads/x", "after": SHA}, Push("refs/heads/x", SHA)),
        ("generic", "push", {"ref": "refs/heads/x", "after": SHA}, Push("refs/heads/x", SHA)),
        ("github", "push", {"ref": "refs/heads/x"}, Ignored("a push without its ref or head")),
        ("gitlab", "Tag Push Hook", {}, Ignored("event Tag Push Hook is not followed")),
        ("github", "", {}, Ignored("event (none) is not followed")),
        (
            "github",
            "pull_request",
            github_pr(3, "b", "[f1] t", SHA, action="reopened"),
            PullRequestChange(3, "b", "[f1] t", SHA, "https://github.com/acme/shop/pull/3"),
        ),
        (
            "gitea",
            "pull_request_sync",
            github_pr(3, "b", "t", SHA, action="synchronized"),
            PullRequestChange(3, "b", "t", SHA, "https://github.com/acme/shop/pull/3"),
        ),
        (
            "gitea",
            "pull_request",
            github_pr(3, "b", "t", SHA, action="edited", changes={"title": {"from": "x"}}),
            Ignored("pull request action edited is not followed"),
        ),
        (
            "github",
            "pull_request",
            github_pr(3, "b", "t", SHA, action="labeled"),
            Ignored("pull request action labeled is not followed"),
        ),
        (
            "github",
            "pull_request",
            {"action": "opened", "pull_request": {"number": "3", "head": {"sha": SHA}}},
            Ignored("a pull request without its number or head"),
        ),
        (
            "gitlab",
            "Merge Request Hook",
            gitlab_mr(5, "b", "t", SHA, action="update"),
            PullRequestChange(
                5, "b", "t", SHA, "https://gitlab.example.com/acme/shop/-/merge_requests/5", only_if_head_moved=True
            ),
        ),
        (
            "gitlab",
            "Merge Request Hook",
            gitlab_mr(5, "b", "t", SHA, action="merge"),
            Ignored("merge request action merge is not followed"),
        ),
        (
            "generic",
            "pull_request",
            {"action": "synchronize", "number": 2, "branch": "b", "title": "t", "head": SHA, "url": ""},
            PullRequestChange(2, "b", "t", SHA, ""),
        ),
        ("generic", "deploy", {}, Ignored("event deploy is not followed")),
    ],
)
def test_events_read_as_one_shape(provider, event, payload, expected):
    assert event_of(provider=provider, event=event, payload=payload) == expected


def test_a_payload_that_is_not_a_mapping_reads_as_an_empty_one():
    assert event_of(provider="github", event="push", payload=["x"]) == Ignored("a push without its ref or head")


def test_the_activity_feed_names_a_processed_delivery():
    from types import SimpleNamespace

    from validation.views.common import describe_event

    def line(**payload):
        event = {"delivery": 1, "provider": "github", "event": "push", "task": None, "pull_number": None, **payload}
        return describe_event(SimpleNamespace(type="forge-delivery:processed", payload=event), {})

    assert line(state="matched", reason="", task=5) == "github push matched → task #5"
    assert line(state="ignored", reason="not a task branch") == "github push ignored — not a task branch"
