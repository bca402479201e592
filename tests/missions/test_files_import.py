"""Importing a mission file: the tree it creates, and every mistake reported with its path
while nothing is written."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from missions.models import (
    ContractAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
)
from missions.services.files import mission_import
from tests.missions.file_helpers import SAMPLE, invalid_errors, links, sample, snapshot

pytestmark = pytest.mark.django_db

# ------------------------------------------------------------------ creating


def test_import_creates_the_whole_tree(tmp_path):
    user = get_user_model().objects.create_user("ann", is_staff=True)
    mission, changed = mission_import(document=SAMPLE, base_dir=tmp_path, user=user)
    assert changed is True
    assert (mission.key, mission.title, mission.status, mission.autopilot) == ("shop", "Shop checkout", "active", True)
    assert mission.owner == user
    assert mission.repository == "https://git.example.com/shop.git"
    m1, m2 = Milestone.objects.filter(mission=mission).order_by("order")
    assert (m1.key, m1.order, m2.key, m2.order) == ("m1", 0, "m2", 1)
    assert m1.description == "Everything about the cart.\nSecond line — with unicode.\n"
    assert list(m2.dependencies.values_list("key", flat=True)) == ["m1"]
    first = ContractAssertion.objects.get(key="VAL-CART-001")
    assert first.check_spec == {"run": "pytest -q tests/test_cart.py::test_empty"}
    assert first.scope == "feature" and first.milestone == m1
    assert ContractAssertion.objects.get(key="VAL-CART-M").scope == "milestone"
    assert list(MissionFeature.objects.filter(slice__key="s1").order_by("order").values_list("key", flat=True)) == [
        "cart-total",
        "cart-sum",
    ]
    assert links("cart-sum") == ["VAL-CART-001", "VAL-CART-002"]
    # an assertion of another milestone can be linked
    assert links("charge") == ["VAL-CART-002", "VAL-PAY-001"]
    assert MissionFeature.objects.get(key="cart-sum").acceptance_criteria == "adds up"
    assert MissionEvent.objects.filter(mission=mission, type="mission:imported").count() == 1


def test_omitted_fields_take_model_defaults():
    mission, _ = mission_import(document={"mission": {"key": "bare", "title": "Bare"}})
    assert (mission.status, mission.validator, mission.executor, mission.retry_budget) == (
        "planning",
        "composite",
        "manual",
        3,
    )
    assert (mission.autopilot, mission.auto_fix, mission.repository, mission.executor_command) == (False, True, "", "")
    assert not mission.milestones.exists()


def test_json_text_is_accepted():
    import json

    mission, changed = mission_import(document=json.dumps(sample()))
    assert changed and MissionFeature.objects.filter(mission=mission).count() == 3


# ------------------------------------------------------------------ errors


def _set(path: list, value):
    def mutate(doc: dict) -> None:
        target = doc
        for step in path[:-1]:
            target = target[step]
        if isinstance(target, list) and path[-1] == len(target):
            target.append(value)
        else:
            target[path[-1]] = value

    return mutate


def _delete(path: list):
    def mutate(doc: dict) -> None:
        target = doc
        for step in path[:-1]:
            target = target[step]
        del target[path[-1]]

    return mutate


def _both(*mutations):
    def mutate(doc: dict) -> None:
        for m in mutations:
            m(doc)

    return mutate


F0 = ["milestones", 0, "slices", 0, "features", 0]

MISTAKES = [
    (_delete(["mission", "key"]), "mission.key: required"),
    (_set(["mission", "colour"], "red"), "mission.colour: unknown field"),
    (
        _both(_set(["milestones", 1, "key"], "m1"), _delete(["milestones", 1, "dependencies"])),
        "milestones[1].key: duplicate key m1",
    ),
    (
        _set(["milestones", 0, "assertions", 0, "scope"], "global"),
        "milestones[0].assertions[0].scope: must be one of feature, milestone",
    ),
    (
        _set(F0 + ["assertions"], ["VAL-X"]),
        "milestones[0].slices[0].features[0].assertions: unknown assertion key VAL-X",
    ),
    (
        _set(F0 + ["assertions"], ["VAL-CART-M"]),
        "milestones[0].slices[0].features[0].assertions: milestone-scoped assertion VAL-CART-M cannot be linked to a feature",
    ),
    (_set(["mission", "retry_budget"], "three"), "mission.retry_budget: must be an integer"),
    (_set(["mission", "retry_budget"], 101), "mission.retry_budget: must be between 0 and 100"),
    (_set(["mission", "autopilot"], "maybe"), "mission.autopilot: must be true or false"),
    (
        _set(["mission", "status"], "done"),
        "mission.status: must be one of planning, active, paused, blocked, complete, archived",
    ),
    (_set(["milestones", 1, "dependencies"], ["m9"]), "milestones[1].dependencies: unknown milestone m9"),
    (_set(["milestones", 0, "dependencies"], ["m2"]), "milestones[0].dependencies: dependency cycle m1 -> m2 -> m1"),
    (
        _set(["milestones", 1, "dependencies"], ["m2"]),
        "milestones[1].dependencies: a milestone cannot depend on itself",
    ),
    (
        _set(["milestones", 0, "slices", 0, "key"], "not a slug"),
        "milestones[0].slices[0].key: must be a slug (letters, digits, hyphens and underscores)",
    ),
    (_set(["milestones", 1, "slices", 0, "key"], "s1"), "milestones[1].slices[0].key: duplicate key s1"),
    (
        _set(["milestones", 1, "slices", 0, "features", 0, "key"], "cart-total"),
        "milestones[1].slices[0].features[0].key: duplicate key cart-total",
    ),
    (
        _set(["milestones", 1, "assertions", 1], {"key": "VAL-CART-001", "title": "Again", "statement": "s"}),
        "milestones[1].assertions[1].key: duplicate key VAL-CART-001",
    ),
    (_set(F0 + ["title"], "x" * 201), "milestones[0].slices[0].features[0].title: must be at most 200 characters"),
    (_set(F0 + ["title"], "  "), "milestones[0].slices[0].features[0].title: must not be blank"),
    (_delete(["milestones", 0, "assertions", 1, "statement"]), "milestones[0].assertions[1].statement: required"),
    (_set(["milestones", 0, "slices"], {"key": "s1"}), "milestones[0].slices: must be a list"),
    (
        _set(["milestones", 0, "slices", 0, "features", 1], "cart-sum"),
        "milestones[0].slices[0].features[1]: must be a mapping",
    ),
    (
        _set(F0 + ["assertions"], [1]),
        "milestones[0].slices[0].features[0].assertions[0]: must be a key (a non-empty string)",
    ),
    (_set(F0 + ["title"], 42), "milestones[0].slices[0].features[0].title: must be a string"),
    (_set(F0 + ["status"], "done"), "milestones[0].slices[0].features[0].status: unknown field"),
    (
        _set(["milestones", 0, "assertions", 0, "check"], {"run": "x", "expect_exit": "0"}),
        "milestones[0].assertions[0].check: expect_exit must be an integer",
    ),
    (
        _set(["milestones", 0, "assertions", 0, "check"], {"file": "../etc/passwd", "exists": True}),
        "milestones[0].assertions[0].check: file must be a relative path inside the checkout",
    ),
    (
        _set(["milestones", 0, "assertions", 0, "check"], {"file": "a.py", "contains": "("}),
        "milestones[0].assertions[0].check: contains is not a valid regular expression: missing ), unterminated subpattern at position 0",
    ),
    (
        _set(["milestones", 0, "assertions", 0, "check"], {"timeout": 3}),
        "milestones[0].assertions[0].check: a check needs 'run' or 'file'",
    ),
    (
        _set(["milestones", 0, "assertions", 0, "check"], "pytest"),
        "milestones[0].assertions[0].check: must be a mapping (a check: see docs/MISSION_FILES.md) or null",
    ),
    (
        _set(["milestones", 0, "assertions", 0, "check"], {"run": "pytest", 1: "x"}),
        "milestones[0].assertions[0].check: a check's keys must be strings",
    ),
    (_set(["extra"], 1), "extra: unknown field"),
    (
        _set(F0 + ["description"], "a\x00b"),
        "milestones[0].slices[0].features[0].description: must not contain NUL characters",
    ),
]


@pytest.mark.parametrize(
    "mutate, expected", MISTAKES, ids=[m[1].split(":")[0] + f"#{i}" for i, m in enumerate(MISTAKES)]
)
def test_each_mistake_is_reported_with_its_path_and_nothing_is_written(mutate, expected):
    doc = sample()
    mutate(doc)
    assert invalid_errors(doc) == [expected]
    assert not Mission.objects.exists()
    assert not Milestone.objects.exists() and not ContractAssertion.objects.exists()


def test_all_errors_are_collected_at_once():
    doc = sample()
    doc["mission"]["colour"] = "red"
    doc["milestones"][1]["key"] = "m1"
    doc["milestones"][0]["slices"][0]["features"][0]["assertions"] = ["VAL-X"]
    errors = invalid_errors(doc)
    assert "mission.colour: unknown field" in errors
    assert "milestones[1].key: duplicate key m1" in errors
    assert "milestones[0].slices[0].features[0].assertions: unknown assertion key VAL-X" in errors
    # m2 is now also called m1: its self-reference through the duplicate is reported too
    assert len(errors) >= 3


def test_milestone_errors_are_reported_even_without_a_mission():
    doc = sample()
    del doc["mission"]
    doc["milestones"][0]["title"] = None
    assert invalid_errors(doc) == ["mission: required", "milestones[0].title: required"]


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "mission: [unclosed",
            "document: invalid YAML: expected ',' or ']', but got '<stream end>' at line 1 column 19",
        ),
        ("- just\n- a list\n", "document: must be a mapping with `mission` and `milestones`"),
        (
            "mission: {key: a, title: A}\nmission: {key: b, title: B}\n",
            "document: invalid YAML: duplicate key 'mission' at line 2 column 1",
        ),
        ("", "document: must be a mapping with `mission` and `milestones`"),
    ],
)
def test_unreadable_documents(text, expected):
    assert invalid_errors(text) == [expected]
    assert not Mission.objects.exists()


def test_invalid_file_leaves_an_existing_mission_untouched():
    mission_import(document=SAMPLE)
    before = snapshot()
    doc = sample()
    doc["mission"]["title"] = "Renamed"
    doc["milestones"][0]["slices"][0]["features"].append({"key": "new-one", "title": "New"})
    doc["milestones"][1]["assertions"][0]["scope"] = "wrong"
    invalid_errors(doc)
    assert snapshot() == before
    assert Mission.objects.get(key="shop").title == "Shop checkout"
    assert not MissionFeature.objects.filter(key="new-one").exists()


def test_scope_change_refused_while_a_feature_outside_the_file_links_the_assertion():
    mission_import(document=SAMPLE)
    doc = sample()
    # cart-sum disappears from the file (left alone in the database, still linked to VAL-CART-002)
    features = doc["milestones"][0]["slices"][0]["features"]
    features.pop(1)
    doc["milestones"][1]["slices"][0]["features"][0]["assertions"] = ["VAL-PAY-001"]
    doc["milestones"][0]["assertions"][1]["scope"] = "milestone"
    before = snapshot()
    assert invalid_errors(doc) == [
        "milestones[0].assertions[1].scope: milestone-scoped assertion VAL-CART-002 is linked to features not in the file: cart-sum"
    ]
    assert snapshot() == before
