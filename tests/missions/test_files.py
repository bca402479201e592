"""Missions as code: mission file import/export and the two management commands."""

from __future__ import annotations

import copy
import threading

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from missions.errors import Invalid, StaffOnly
from missions.models import (
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    MissionStatus,
    RollupState,
    Slice,
)
from missions.services import files
from missions.services.files import mission_export, mission_file_import, mission_import

pytestmark = pytest.mark.django_db

SAMPLE = """\
mission: {key: shop, title: Shop checkout, status: active, repository: "https://git.example.com/shop.git",
          validator: composite, executor: manual, autopilot: true, auto_fix: true, retry_budget: 3}
milestones:
  - key: m1
    title: Cart
    description: |
      Everything about the cart.
      Second line — with unicode.
    assertions:
      - {key: VAL-CART-001, title: Empty cart total is zero,
         statement: "cart_total([]) == 0", check: {run: "pytest -q tests/test_cart.py::test_empty"}}
      - {key: VAL-CART-002, title: Totals add up, statement: "cart_total([1, 2]) == 3"}
      - {key: VAL-CART-M, title: Cart page loads, statement: "GET /cart answers 200", scope: milestone}
    slices:
      - key: s1
        title: Totals
        features:
          - {key: cart-total, title: Cart total, description: "sum of lines", assertions: [VAL-CART-001]}
          - {key: cart-sum, title: Cart sum, acceptance_criteria: "adds up", assertions: [VAL-CART-002, VAL-CART-001]}
  - key: m2
    title: Payment
    dependencies: [m1]
    assertions:
      - {key: VAL-PAY-001, title: Card is charged once, statement: "one charge per order"}
    slices:
      - key: s2
        title: Charge
        features:
          - {key: charge, title: Charge card, assertions: [VAL-PAY-001, VAL-CART-002]}
"""


def sample() -> dict:
    return yaml.safe_load(SAMPLE)


def snapshot(mission_key: str = "shop") -> dict:
    """Every row's updated_at, plus the link and dependency rows, for "nothing changed" checks."""
    mission = Mission.objects.get(key=mission_key)
    rows = {("mission", mission.pk): mission.updated_at}
    for model in (Milestone, Slice, MissionFeature, ContractAssertion):
        rows.update(
            {
                (model.__name__, pk): at
                for pk, at in model.objects.filter(mission=mission).values_list("pk", "updated_at")
            }
        )
    rows["links"] = sorted(FeatureAssertion.objects.filter(feature__mission=mission).values_list("pk", "updated_at"))
    rows["deps"] = sorted(
        Milestone.dependencies.through.objects.filter(from_milestone__mission=mission).values_list("pk", flat=True)
    )
    rows["events"] = MissionEvent.objects.filter(mission=mission).count()
    return rows


def links(feature_key: str) -> list[str]:
    return sorted(FeatureAssertion.objects.filter(feature__key=feature_key).values_list("assertion__key", flat=True))


def invalid_errors(document, **kwargs) -> list[str]:
    with pytest.raises(Invalid) as info:
        mission_import(document=document, **kwargs)
    assert info.value.code == "invalid_mission_file"
    return info.value.fields["errors"]


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


# ------------------------------------------------------------------ idempotence and updates


def test_importing_the_same_file_twice_changes_nothing(tmp_path):
    mission, changed = mission_import(document=SAMPLE, base_dir=tmp_path)
    assert changed
    before = snapshot()
    again, changed = mission_import(document=SAMPLE, base_dir=tmp_path)
    assert again.pk == mission.pk and changed is False
    assert snapshot() == before


def test_update_by_key():
    mission_import(document=SAMPLE)
    before = snapshot()
    ids = {f.key: f.pk for f in MissionFeature.objects.all()}
    doc = sample()
    doc["milestones"][0]["title"] = "Shopping cart"
    features = doc["milestones"][0]["slices"][0]["features"]
    features[1]["assertions"] = ["VAL-CART-002"]  # link to VAL-CART-001 removed
    features.insert(0, {"key": "cart-empty", "title": "Empty cart", "assertions": ["VAL-CART-001"]})
    doc["mission"]["status"] = "paused"  # ignored for an existing mission

    mission, changed = mission_import(document=doc)
    assert changed
    m1 = Milestone.objects.get(key="m1")
    assert m1.title == "Shopping cart" and m1.updated_at > before[("Milestone", m1.pk)]
    assert {f.key: f.pk for f in MissionFeature.objects.all() if f.key != "cart-empty"} == ids  # matched, not recreated
    assert list(MissionFeature.objects.filter(slice__key="s1").order_by("order").values_list("key", flat=True)) == [
        "cart-empty",
        "cart-total",
        "cart-sum",
    ]
    assert links("cart-sum") == ["VAL-CART-002"] and links("cart-empty") == ["VAL-CART-001"]
    assert MissionFeature.objects.get(key="cart-sum").updated_at > before[("MissionFeature", ids["cart-sum"])]
    # untouched rows keep their updated_at
    assert Milestone.objects.get(key="m2").updated_at == before[("Milestone", Milestone.objects.get(key="m2").pk)]
    assert MissionFeature.objects.get(key="charge").updated_at == before[("MissionFeature", ids["charge"])]
    assert mission.status == MissionStatus.ACTIVE
    assert mission_import(document=doc)[1] is False


def test_omitted_field_resets_to_default_and_entities_can_move():
    mission_import(document=SAMPLE)
    doc = sample()
    del doc["milestones"][0]["description"]
    moved = doc["milestones"][0]["slices"][0]["features"].pop(0)
    doc["milestones"][1]["slices"][0]["features"].append(moved)
    doc["milestones"][1]["dependencies"] = []
    mission_import(document=doc)
    assert Milestone.objects.get(key="m1").description == ""
    assert MissionFeature.objects.get(key="cart-total").slice.key == "s2"
    assert not Milestone.objects.get(key="m2").dependencies.exists()


def test_entities_missing_from_the_file_are_left_alone():
    mission_import(document=SAMPLE)
    doc = sample()
    doc["milestones"].pop(1)
    doc["milestones"][0]["slices"][0]["features"].pop(1)
    mission, changed = mission_import(document=doc)
    assert changed is False  # nothing in the file differs; nothing is deleted
    assert Milestone.objects.filter(mission=mission).count() == 2
    assert MissionFeature.objects.filter(key="cart-sum").exists() and links("cart-sum") == [
        "VAL-CART-001",
        "VAL-CART-002",
    ]


# ------------------------------------------------------------------ export


def test_export_format_and_round_trip_through_a_fresh_database(tmp_path):
    mission, _ = mission_import(document=SAMPLE, base_dir=tmp_path)
    exported = mission_export(mission=mission)
    data = yaml.safe_load(exported)
    assert list(data) == ["mission", "milestones"]
    assert list(data["mission"]) == list(files.MISSION_FIELDS)
    assert data["mission"]["repository"] == "https://git.example.com/shop.git" and "workspace" not in data["mission"]
    m1 = data["milestones"][0]
    assert list(m1) == ["key", "title", "description", "environment", "dependencies", "assertions", "slices"]
    assert list(m1["assertions"][0]) == ["key", "title", "statement", "scope", "check"]
    assert m1["assertions"][1]["check"] is None
    assert list(m1["slices"][0]) == ["key", "title", "description", "features"]
    assert m1["slices"][0]["features"][1] == {
        "key": "cart-sum",
        "title": "Cart sum",
        "description": "",
        "acceptance_criteria": "adds up",
        "assertions": ["VAL-CART-001", "VAL-CART-002"],
    }
    assert data["milestones"][1]["dependencies"] == ["m1"]
    assert "      assertions: [VAL-CART-001, VAL-CART-002]\n" in exported
    assert "description: |\n" in exported and "Second line — with unicode." in exported

    # re-import into the same database: nothing changes
    before = snapshot()
    assert mission_import(document=exported)[1] is False
    assert snapshot() == before

    # a fresh database: the mission is gone, the file brings it back identically
    mission.delete()
    assert not ContractAssertion.objects.exists()
    again, changed = mission_import(document=exported)
    assert changed
    assert mission_export(mission=again) == exported


def test_round_trip_with_tied_orders_and_awkward_text():
    mission = Mission.objects.create(
        key="odd",
        title="yes",
        description="trailing spaces   \nline\n\n",
        base_revision="x\x85y\n",
        executor="command",
        executor_command="run --it",
    )
    m = Milestone.objects.create(mission=mission, key="m", title="null")
    s = Slice.objects.create(milestone=m, key="s", title="123")
    for key in ("b", "a", "c"):  # all order 0: export sorts by (order, id)
        MissionFeature.objects.create(slice=s, key=key, title=f"#{key}: value")
    a = ContractAssertion.objects.create(
        milestone=m,
        key="VAL-1",
        title="t",
        statement="x: y\n\ttab",
        check_spec={"timeout": 5, "run": "true", "expect_exit": 0},
    )
    FeatureAssertion.objects.create(feature=MissionFeature.objects.get(key="a"), assertion=a)
    exported = mission_export(mission=mission)
    assert "check:\n      run: 'true'\n      expect_exit: 0\n      timeout: 5\n" in exported
    before = snapshot("odd")
    assert mission_import(document=exported)[1] is False
    assert snapshot("odd") == before
    mission.delete()
    again, _ = mission_import(document=exported)
    assert mission_export(mission=again) == exported
    assert (again.description, again.base_revision) == ("trailing spaces   \nline\n\n", "x\x85y\n")
    assert list(MissionFeature.objects.filter(mission=again).order_by("order").values_list("key", flat=True)) == [
        "b",
        "a",
        "c",
    ]


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(title=TEXT.filter(lambda t: t.strip()), description=TEXT, statement=TEXT.filter(lambda t: t.strip()))
def test_any_text_survives_the_round_trip(title, description, statement):
    doc = {
        "mission": {"key": "txt", "title": title[:200], "description": description},
        "milestones": [
            {
                "key": "m",
                "title": "M",
                "description": description,
                "assertions": [{"key": "VAL-1", "title": "t", "statement": statement, "check": {"run": statement}}],
            }
        ],
    }
    mission, _ = mission_import(document=doc)
    exported = mission_export(mission=mission)
    assert mission_import(document=exported)[1] is False
    mission.delete()
    again, _ = mission_import(document=exported)
    assert (again.title, again.description) == (title[:200], description)
    assert ContractAssertion.objects.get(mission=again).check_spec == {"run": statement}
    assert mission_export(mission=again) == exported
    again.delete()


# ------------------------------------------------------------------ repository


def test_a_relative_repository_is_resolved_against_the_file_folder(tmp_path):
    doc = sample()
    doc["mission"]["repository"] = "./repo"
    mission, _ = mission_import(document=doc, base_dir=tmp_path / "plans")
    assert mission.repository == str(tmp_path / "plans" / "repo")

    doc["mission"]["repository"] = "../code"
    mission, changed = mission_import(document=doc, base_dir=tmp_path / "plans")
    assert changed and mission.repository == str(tmp_path / "code")

    doc["mission"]["repository"] = "/srv/repo"
    assert mission_import(document=doc, base_dir=tmp_path)[0].repository == "/srv/repo"

    # a URL (scp-like included) is never taken for a relative path
    doc["mission"]["repository"] = "git@git.example.com:shop.git"
    assert mission_import(document=doc, base_dir=tmp_path)[0].repository == "git@git.example.com:shop.git"

    # no base_dir: a relative path names nothing the workers can find, and is refused
    doc["mission"]["repository"] = "./repo"
    with pytest.raises(Invalid) as info:
        mission_import(document=doc)
    assert info.value.code == "repository_refused"
    assert info.value.fields == {
        "errors": ["mission.repository: a local repository must be an absolute path (or a URL)"]
    }
    assert Mission.objects.get(key="shop").repository == "git@git.example.com:shop.git"


def test_workspace_the_former_name_of_repository_is_still_read(tmp_path):
    doc = sample()
    del doc["mission"]["repository"]
    doc["mission"]["workspace"] = "./repo"  # resolved like the repository
    mission, _ = mission_import(document=doc, base_dir=tmp_path)
    assert mission.repository == str(tmp_path / "repo")
    assert "workspace" not in yaml.safe_load(mission_export(mission=mission))["mission"]

    doc["mission"]["repository"] = "./repo"  # both, the same value: read once
    assert mission_import(document=doc, base_dir=tmp_path)[1] is False

    doc["mission"]["repository"] = "/srv/other"
    assert invalid_errors(doc) == [
        "mission.workspace: the former name of repository, whose value differs: give only repository"
    ]
    assert Mission.objects.get(key="shop").repository == str(tmp_path / "repo")


# ------------------------------------------------------------------ staff rule


def test_only_staff_may_set_checks_and_executor_commands():
    User = get_user_model()
    member = User.objects.create_user("bob")
    doc = sample()
    doc["mission"]["executor"] = "command"
    doc["mission"]["executor_command"] = "agent --run"
    with pytest.raises(StaffOnly) as info:
        mission_import(document=doc, user=member)
    assert info.value.code == "staff_only"
    assert info.value.fields == {"errors": ["mission.executor_command", "milestones[0].assertions[0].check"]}
    assert not Mission.objects.exists()

    staff = User.objects.create_user("sue", is_staff=True)
    mission, _ = mission_import(document=doc, user=staff)
    assert mission.executor_command == "agent --run" and mission.owner == staff

    # a member may re-import the file as long as the check and command stay as they are
    mission.members.add(member)  # (the import refuses users who may not see the mission)
    doc["mission"]["title"] = "Renamed by a member"
    assert mission_import(document=doc, user=member)[1] is True
    doc["milestones"][0]["assertions"][0]["check"] = {"run": "rm -rf /"}
    with pytest.raises(StaffOnly) as info:
        mission_import(document=doc, user=member)
    assert info.value.fields == {"errors": ["milestones[0].assertions[0].check"]}
    assert ContractAssertion.objects.get(key="VAL-CART-001").check_spec == {
        "run": "pytest -q tests/test_cart.py::test_empty"
    }
    doc["milestones"][0]["assertions"][0]["check"] = {"run": "pytest -q tests/test_cart.py::test_empty"}
    doc["milestones"][0]["assertions"][1]["check"] = {"file": "cart.py", "exists": True}  # a new check
    with pytest.raises(StaffOnly):
        mission_import(document=doc, user=member)
    assert mission_import(document=doc, user=None)[1] is True  # the CLI is trusted


def test_member_can_import_a_file_without_checks():
    member = get_user_model().objects.create_user("bob")
    doc = sample()
    doc["milestones"][0]["assertions"][0]["check"] = None
    mission, changed = mission_import(document=doc, user=member)
    assert changed and mission.owner == member


# ------------------------------------------------------------------ rollup


def test_rollup_is_recomputed_by_the_import():
    doc = sample()
    doc["milestones"][1]["slices"][0]["features"][0]["assertions"] = ["VAL-CART-002"]  # VAL-PAY-001 uncovered
    doc["milestones"].append({"key": "m3", "title": "Empty"})
    mission_import(document=doc)
    states = dict(Milestone.objects.values_list("key", "validation_state"))
    assert states == {"m1": RollupState.READY, "m2": RollupState.NEEDS_COVERAGE, "m3": RollupState.NOT_STARTED}

    doc["milestones"][1]["slices"][0]["features"][0]["assertions"] = ["VAL-PAY-001"]
    mission_import(document=doc)
    assert Milestone.objects.get(key="m2").validation_state == RollupState.READY

    doc["milestones"][0]["slices"][0]["features"][0]["assertions"] = []  # VAL-CART-001 now uncovered
    doc["milestones"][0]["slices"][0]["features"][1]["assertions"] = ["VAL-CART-002"]
    mission_import(document=doc)
    assert Milestone.objects.get(key="m1").validation_state == RollupState.NEEDS_COVERAGE


# ------------------------------------------------------------------ concurrency


def test_lost_creation_race_is_retried_as_an_update(monkeypatch):
    mission_import(document=SAMPLE)  # "the other import" already committed the mission
    real = files._locked_mission
    calls = []

    def blind_first(key):
        calls.append(key)
        return None if len(calls) == 1 else real(key)

    monkeypatch.setattr(files, "_locked_mission", blind_first)
    doc = sample()
    doc["mission"]["title"] = "Second writer"
    result = mission_file_import(document=doc)
    assert len(calls) == 2
    assert result.created is False and result.changed is True
    assert Mission.objects.count() == 1 and Mission.objects.get().title == "Second writer"


@pytest.mark.django_db(transaction=True)
def test_two_simultaneous_imports_end_with_one_mission():
    results, failures = [], []
    barrier = threading.Barrier(2)

    def run():
        try:
            barrier.wait(timeout=10)
            results.append(mission_file_import(document=SAMPLE))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures == []
    assert Mission.objects.count() == 1 and MissionFeature.objects.count() == 3
    assert sorted((r.created, r.changed) for r in results) == [(False, False), (True, True)]


# ------------------------------------------------------------------ commands


def test_import_command(tmp_path, capsys):
    path = tmp_path / "shop.yaml"
    text = SAMPLE.replace('"https://git.example.com/shop.git"', "./repo")
    path.write_text(text, encoding="utf-8")
    call_command("import_mission", str(path))
    assert capsys.readouterr().out == "imported mission shop (created)\n"
    assert Mission.objects.get(key="shop").repository == str(tmp_path / "repo")
    call_command("import_mission", str(path))
    assert capsys.readouterr().out == "imported mission shop (unchanged)\n"
    path.write_text(text.replace("title: Cart\n", "title: Basket\n"), encoding="utf-8")
    call_command("import_mission", str(path))
    assert capsys.readouterr().out == "imported mission shop (updated)\n"


def test_import_command_reports_every_error(tmp_path, capsys):
    doc = sample()
    doc["mission"]["colour"] = "red"
    doc["milestones"][1]["dependencies"] = ["m9"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with pytest.raises(CommandError) as info:
        call_command("import_mission", str(path))
    assert info.value.returncode == 1
    assert str(info.value) == f"{path}: mission file is invalid (2 errors)"
    err = capsys.readouterr().err
    assert err.splitlines() == ["mission.colour: unknown field", "milestones[1].dependencies: unknown milestone m9"]
    assert not Mission.objects.exists()

    with pytest.raises(CommandError, match="cannot read"):
        call_command("import_mission", str(tmp_path / "missing.yaml"))


def test_export_command(tmp_path, capsys):
    mission, _ = mission_import(document=SAMPLE, base_dir=tmp_path)
    expected = mission_export(mission=mission)
    call_command("export_mission", "shop")
    assert capsys.readouterr().out == expected
    call_command("export_mission", str(mission.pk))
    assert capsys.readouterr().out == expected
    out = tmp_path / "out.yaml"
    call_command("export_mission", "shop", "--output", str(out))
    assert out.read_text(encoding="utf-8") == expected
    assert capsys.readouterr().out == f"exported mission shop to {out}\n"
    with pytest.raises(CommandError, match="no mission with key or id 'nope'") as info:
        call_command("export_mission", "nope")
    assert info.value.returncode == 1

    # the exported file imports back through the command without change
    call_command("import_mission", str(out))
    assert capsys.readouterr().out == "imported mission shop (unchanged)\n"


def test_documents_are_not_mutated():
    doc = sample()
    frozen = copy.deepcopy(doc)
    mission_import(document=doc, base_dir=None)
    assert doc == frozen


def test_the_branch_round_trips_and_a_bad_name_is_refused():
    doc = sample()
    doc["mission"]["branch"] = "release/2.x"
    mission, _ = mission_import(document=doc)
    assert mission.branch == "release/2.x"
    exported = mission_export(mission=mission)
    assert yaml.safe_load(exported)["mission"]["branch"] == "release/2.x"
    assert mission_import(document=exported)[1] is False
    mission.delete()
    assert mission_export(mission=mission_import(document=exported)[0]) == exported

    doc["mission"]["branch"] = "--upload-pack=evil"
    with pytest.raises(Invalid) as info:
        mission_import(document=doc)
    assert info.value.code == "invalid_branch"
    assert info.value.fields == {
        "errors": [
            "mission.branch: branch '--upload-pack=evil' is not a revision name (a commit id, a branch or a tag)"
        ]
    }
    assert Mission.objects.get(key="shop").branch == "release/2.x"
