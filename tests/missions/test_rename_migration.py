"""The feature model's rename (`Feature` -> `MissionFeature`, missions 0005) renames the
table in place: a database filled by the demo keeps every feature, every row that points
at one, and their links, back and forth across the migration."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from missions.management.commands.demo import create_demo

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("missions", "0004_truth_fields"), ("validation", "0004_truth_fields")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _latest():
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


def _snapshot(apps, feature_model: str) -> dict:
    feature = apps.get_model("missions", feature_model)
    run = apps.get_model("validation", "ValidatorRun")
    task = apps.get_model("missions", "Task")
    lineage = apps.get_model("validation", "FixLineage")
    return {
        "features": sorted(feature.objects.values_list("id", "key", "loop_state", "generated_from_id", "last_run_id")),
        "links": sorted(feature.assertions.through.objects.values_list("feature_id", "assertion_id")),
        "runs": sorted(run.objects.values_list("id", "feature_id", "status")),
        "tasks": sorted(task.objects.values_list("id", "feature_id", "revision")),
        "lineage": sorted(lineage.objects.values_list("root_id", "source_id", "fix_id")),
    }


def test_the_rename_keeps_a_demo_database_whole(worker, tmp_path, alice):
    mission = create_demo(directory=tmp_path / "demo-repo", user=alice)
    worker.drain(timeout=240)
    mission.refresh_from_db()
    assert mission.status == "complete", mission.status_reason
    latest = _latest()
    try:
        after = _snapshot(_migrate(latest), "MissionFeature")
        assert len(after["features"]) >= 4 and after["runs"] and after["lineage"] and after["links"]

        old_apps = _migrate(BEFORE)
        tables = connection.introspection.table_names()
        assert "missions_feature" in tables and "missions_missionfeature" not in tables
        assert _snapshot(old_apps, "Feature") == after
        # A staff member granted the feature permission before the rename keeps it.
        permission = old_apps.get_model("auth", "Permission")
        old_user = old_apps.get_model("auth", "User")
        editor = old_user.objects.create(username="editor", is_staff=True)
        editor.user_permissions.add(
            permission.objects.get(content_type__app_label="missions", codename="change_feature")
        )

        new_apps = _migrate(latest)
        tables = connection.introspection.table_names()
        assert "missions_missionfeature" in tables and "missions_feature" not in tables
        assert _snapshot(new_apps, "MissionFeature") == after
        editor = get_user_model().objects.get(username="editor")
        assert editor.has_perm("missions.change_missionfeature") and not editor.has_perm("missions.change_feature")
        assert not Permission.objects.filter(content_type__app_label="missions", codename__endswith="_feature").exists()
    finally:
        _migrate(latest)  # leave the test database as every other test expects it
