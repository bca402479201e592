"""Exporting a mission file (format and round trips) and the import and export commands."""

from __future__ import annotations

import copy

import pytest
import yaml
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from missions.errors import Invalid
from missions.models import (
    ContractAssertion,
    FeatureAssertion,
    Milestone,
    Mission,
    MissionFeature,
    Slice,
)
from missions.services import files
from missions.services.files import mission_export, mission_import
from tests.missions.file_helpers import SAMPLE, sample, snapshot

pytestmark = pytest.mark.django_db

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
