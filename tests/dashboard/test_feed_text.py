"""The activity feed names each change (docs/ARCHITECTURE.md, "State machines"): the
subject, what happened and why, from the event's structure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from validation.views.common import describe_event


def line(type_: str, **payload) -> str:
    return describe_event(SimpleNamespace(type=type_, payload=payload), {7: "cart"}, {3: "m1"})


@pytest.mark.parametrize(
    "type_, payload, expected",
    [
        ("mission:activated", {"cause": "activate"}, "Mission activated — activate"),
        ("mission:halted", {"reason": "feature cart is blocked"}, "Mission halted — feature cart is blocked"),
        ("mission:autopilot", {"enabled": False}, "Mission autopilot off"),
        ("mission:updated", {"changed": ["title", "retry_budget"]}, "Mission updated — title, retry_budget"),
        ("milestone:reopened", {"milestone": 3, "cause": "task_linked"}, "Milestone m1 reopened — task linked"),
        ("slice:completed", {"slice": 9, "key": "s1"}, "Slice s1 completed"),
        (
            "follow-up:refused",
            {"step": "fix_passed", "code": "feature_blocked"},
            "Follow-up fix passed refused — feature blocked",
        ),
        ("fix-feature:budget-exhausted", {"feature": 7}, "Fix for cart budget-exhausted"),
    ],
)
def test_named_changes_read_as_sentences(type_, payload, expected):
    assert line(type_, **payload) == expected


def test_an_unknown_event_shows_its_name():
    assert line("something:new") == "something:new"
