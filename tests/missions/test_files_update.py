"""Importing a mission file again: idempotence, updates by key, the repository field, the
staff rule, the rollup, and two imports of one mission at once."""

from __future__ import annotations

import threading

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from missions.errors import Invalid, StaffOnly
from missions.models import (
    ContractAssertion,
    Milestone,
    Mission,
    MissionFeature,
    MissionStatus,
    RollupState,
)
from missions.services.files import ImportResult, mission_export, mission_file_import, mission_import
from tests.conftest import is_postgres
from tests.missions.file_helpers import SAMPLE, invalid_errors, links, sample, snapshot
from tests.support.locks import wait_for_lock_waiters

pytestmark = pytest.mark.django_db

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


@pytest.mark.skipif(not is_postgres(), reason="PostgreSQL only: SQLite's writers never interleave")
@pytest.mark.django_db(transaction=True)
def test_two_imports_that_both_find_no_mission_end_with_one_the_later_file_updated():
    """Both imports look the key up and find no mission before either inserts one (the
    test holds the missions table in SHARE mode, which lets the lookups through and stops
    the inserts, until both imports wait on it): one creates the mission, the other loses
    the insert, finds the mission and updates it with its own file."""
    titles = ["First writer", "Second writer"]
    results = {}

    def run(title):
        doc = sample()
        doc["mission"]["title"] = title
        try:
            results[title] = mission_file_import(document=doc)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            results[title] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(title,)) for title in titles]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {Mission._meta.db_table} IN SHARE MODE")
        for t in threads:
            t.start()
        wait_for_lock_waiters(2, table=Mission._meta.db_table)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert all(isinstance(r, ImportResult) for r in results.values()), results
    created = [title for title, r in results.items() if r.created]
    updated = [title for title, r in results.items() if not r.created and r.changed]
    assert len(created) == 1 and len(updated) == 1, results
    assert Mission.objects.count() == 1 and MissionFeature.objects.count() == 3
    assert Mission.objects.get().title == updated[0]


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
