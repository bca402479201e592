"""The mission field `workspace` became `repository` (missions 0006, a rename): every
mission keeps its path across the migration, back and forth, and gets an empty
`credentials_env` (docs/REPOSITORIES.md)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("missions", "0005_rename_feature_missionfeature")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _latest():
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


def test_every_mission_keeps_its_workspace_as_its_repository(tmp_path):
    latest = _latest()
    try:
        old = _migrate(BEFORE).get_model("missions", "Mission")
        paths = {"a": str(tmp_path / "repo-a"), "b": "", "c": "/srv/git/shop"}
        for key, path in paths.items():
            old.objects.create(key=key, title=key, workspace=path)
        new = _migrate(latest).get_model("missions", "Mission")
        assert dict(new.objects.values_list("key", "repository")) == paths
        assert set(new.objects.values_list("credentials_env", flat=True)) == {""}
        # And back: a rollback of the release loses nothing either.
        back = _migrate(BEFORE).get_model("missions", "Mission")
        assert dict(back.objects.values_list("key", "workspace")) == paths
    finally:
        _migrate(latest)
