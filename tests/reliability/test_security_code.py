"""Checks and executor commands are code the host executes: only staff set them, over the
API, a mission-file import and the admin; the command-line import is trusted like staff.
"""

from __future__ import annotations

import pytest
import yaml
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from missions.models import (
    ContractAssertion,
    Mission,
)
from tests.reliability.conftest import mission_rows, user_of

pytestmark = pytest.mark.django_db


CODE_WRITES = [
    (
        "assertion check (create)",
        "post",
        lambda w: "/api/assertions/",
        lambda w: {"milestone": w.m1.pk, "key": "VAL-RUN", "title": "t", "statement": "s", "check": {"run": "id"}},
    ),
    (
        "assertion check (update)",
        "patch",
        lambda w: f"/api/assertions/{w.a2.pk}/",
        lambda w: {"check": {"run": "touch /tmp/pwned"}},
    ),
    (
        "assertion check (change)",
        "patch",
        lambda w: f"/api/assertions/{w.a1.pk}/",
        lambda w: {"check": {"file": "hello.py", "exists": True}},
    ),
    (
        "executor command (update)",
        "patch",
        lambda w: f"/api/missions/{w.mission.pk}/",
        lambda w: {"executor": "command", "executor_command": "sh -c 'curl evil'"},
    ),
    (
        "executor command (new mission)",
        "post",
        lambda w: "/api/missions/",
        lambda w: {"key": "exec-new", "title": "t", "executor": "command", "executor_command": "id"},
    ),
]


@pytest.mark.parametrize("role", ["member", "staff"])
@pytest.mark.parametrize("case", CODE_WRITES, ids=[c[0] for c in CODE_WRITES])
def test_checks_and_executor_commands_over_the_api_are_staff_only(case, role, users, world):
    _name, method, url, body = case
    client = APIClient()
    client.force_authenticate(getattr(users, role))
    before = mission_rows(world.mission.pk)
    missions_before = Mission.objects.count()
    response = getattr(client, method)(url(world), body(world), format="json")
    if role == "member":
        assert response.status_code == 403, response.json()
        assert response.json()["code"] == "staff_only"
        assert mission_rows(world.mission.pk) == before and Mission.objects.count() == missions_before
    else:
        assert response.status_code in (200, 201), response.json()


def _file_with(w, **mission_fields) -> str:
    return yaml.safe_dump(
        {
            "mission": {"key": w.mission.key, "title": "Alpha", "repository": str(w.repo.path), **mission_fields},
            "milestones": [
                {
                    "key": "m1",
                    "title": "Milestone one",
                    "assertions": [
                        {
                            "key": "VAL-1",
                            "title": "hello exists",
                            "statement": "hello() exists",
                            "check": {"run": "sh -c 'echo pwned'"},
                        }
                    ],
                }
            ],
        }
    )


@pytest.mark.parametrize("role", ["member", "staff"])
def test_a_mission_file_import_sets_checks_and_executor_commands_only_for_staff(role, users, world):
    client = APIClient()
    client.force_authenticate(getattr(users, role))
    before = mission_rows(world.mission.pk)
    for text in (_file_with(world), _file_with(world, executor="command", executor_command="id")):
        response = client.post("/api/missions/import/", text, content_type="application/yaml")
        if role == "member":
            assert response.status_code == 403, response.json()
            assert response.json()["code"] == "staff_only"
            assert mission_rows(world.mission.pk) == before
        else:
            assert response.status_code == 200, response.json()
    if role == "staff":
        assert ContractAssertion.objects.get(pk=world.a1.pk).check_spec == {"run": "sh -c 'echo pwned'"}
        assert Mission.objects.get(pk=world.mission.pk).executor_command == "id"


def test_the_cli_import_is_trusted_like_staff(world, tmp_path):
    path = tmp_path / "alpha.yaml"
    path.write_text(_file_with(world, executor="command", executor_command="id"))
    with open(tmp_path / "out", "w") as out:
        call_command("import_mission", str(path), stdout=out)
    assert ContractAssertion.objects.get(pk=world.a1.pk).check_spec == {"run": "sh -c 'echo pwned'"}


@pytest.mark.parametrize("role", ["anonymous", "member", "stranger", "staff"])
def test_checks_and_executor_commands_in_the_admin_are_staff_only(role, users, world):
    client = Client()
    user = user_of(users, role)
    if user is not None:
        client.force_login(user)
    url = reverse("admin:missions_contractassertion_change", args=[world.a1.pk])
    get = client.get(url)
    if role != "staff":
        assert get.status_code == 302 and "/admin/login/" in get["Location"]
        post = client.post(url, {"check_spec": '{"run": "id"}'})
        assert post.status_code == 302 and "/admin/login/" in post["Location"]
        assert ContractAssertion.objects.get(pk=world.a1.pk).check_spec != {"run": "id"}
        mission_url = reverse("admin:missions_mission_change", args=[world.mission.pk])
        assert client.post(mission_url, {"executor_command": "id"}).status_code == 302
        assert Mission.objects.get(pk=world.mission.pk).executor_command == ""
        return
    assert get.status_code == 200
    assert b"check_spec" in get.content
