"""`import_mission` and `POST /api/missions/import/` are two doors to one importer: who owns
what each imports (and `demo`'s mission), and one answer, with every mistake, for a bad file."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from missions.models import Mission
from tests.missions.api_helpers import MISSION_FILE

pytestmark = pytest.mark.django_db

# the API tests' file, with a second milestone that depends on the first
FILE = MISSION_FILE + "  - key: m2\n    title: Payment\n    dependencies: [m1]\n"


def by_token(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


def sees(user, mission: Mission) -> bool:
    """Whether `user` sees the mission through the API: in the list, and by its id."""
    client = by_token(user)
    listed = mission.pk in [m["id"] for m in client.get("/api/missions/", {"key": mission.key}).json()["results"]]
    status = client.get(f"/api/missions/{mission.pk}/").status_code
    assert (status == 200) == listed, (status, listed)
    return listed


def write(tmp_path, text: str, name: str = "shop.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def import_command(*args: str) -> str:
    out = io.StringIO()
    call_command("import_mission", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def refused(command: str, *args: str) -> tuple[CommandError, list[str]]:
    err = io.StringIO()
    with pytest.raises(CommandError) as info:
        call_command(command, *args, stdout=io.StringIO(), stderr=err)
    return info.value, err.getvalue().splitlines()


# ------------------------------------------------------------------ who owns an imported mission


def test_owner_sees_a_mission_imported_for_them_as_if_they_had_imported_it(tmp_path, alice, stranger, staff):
    assert import_command(str(write(tmp_path, FILE)), "--owner", "alice") == "imported mission shop (created)\n"
    by_cli = Mission.objects.get(key="shop")
    response = by_token(alice).post(
        "/api/missions/import/", FILE.replace("key: shop", "key: cart"), content_type="application/yaml"
    )
    assert response.status_code == 201, response.content
    by_api = Mission.objects.get(key="cart")

    for mission in (by_cli, by_api):
        body = by_token(alice).get(f"/api/missions/{mission.pk}/").json()
        assert (body["owner"], body["members"]) == (alice.pk, [])
        assert sees(alice, mission) and sees(staff, mission) and not sees(stranger, mission)
        # the owner's rights too: only the owner (or staff) changes the members
        response = by_token(alice).patch(f"/api/missions/{mission.pk}/", {"members": [stranger.pk]}, format="json")
        assert response.status_code == 200, response.content
        assert sees(stranger, mission)


def test_without_owner_the_command_line_leaves_the_mission_to_staff(tmp_path, alice, staff):
    import_command(str(write(tmp_path, FILE)))
    mission = Mission.objects.get(key="shop")
    assert mission.owner is None
    assert sees(staff, mission) and not sees(alice, mission)


def test_reimport_sets_the_owner_given_and_keeps_it_otherwise(tmp_path, alice, stranger):
    path = str(write(tmp_path, FILE))
    import_command(path, "--owner", "alice")
    mission = Mission.objects.get(key="shop")

    assert import_command(path) == "imported mission shop (unchanged)\n"  # no --owner: alice keeps it
    assert import_command(path, "--owner", "alice") == "imported mission shop (unchanged)\n"
    mission.refresh_from_db()
    assert mission.owner == alice

    assert import_command(path, "--owner", "stranger") == "imported mission shop (updated)\n"
    mission.refresh_from_db()
    assert mission.owner == stranger
    assert sees(stranger, mission) and not sees(alice, mission)
    assert mission.events.filter(type="mission:imported").order_by("-seq").first().payload["owner"] == stranger.pk

    # someone who had a mission without an owner gets one
    Mission.objects.filter(pk=mission.pk).update(owner=None)
    assert import_command(path, "--owner", "alice") == "imported mission shop (updated)\n"
    assert Mission.objects.get(pk=mission.pk).owner == alice


def test_an_unknown_owner_is_refused_and_changes_nothing(tmp_path, alice):
    path = write(tmp_path, FILE)
    error, _ = refused("import_mission", str(path), "--owner", "ghost")
    assert error.returncode == 2 and str(error) == "no user 'ghost'"
    assert not Mission.objects.exists()

    import_command(str(path), "--owner", "alice")
    path.write_text(FILE.replace("title: Shop checkout", "title: Renamed"), encoding="utf-8")
    error, _ = refused("import_mission", str(path), "--owner", "ghost")
    assert str(error) == "no user 'ghost'"
    mission = Mission.objects.get(key="shop")
    assert (mission.owner, mission.title) == (alice, "Shop checkout")


def test_demo_belongs_to_the_owner_given(settings, tmp_path, alice, stranger, django_user_model):
    settings.DATA_DIR = str(tmp_path)
    out = io.StringIO()
    call_command("demo", "--owner", "alice", stdout=out)
    demo = Mission.objects.get(key="demo")
    assert demo.owner == alice and "owned by alice" in out.getvalue()
    assert sees(alice, demo) and not sees(stranger, demo)

    error, _ = refused("demo", "--owner", "ghost")
    assert error.returncode == 2 and str(error) == "no user 'ghost'"
    assert Mission.objects.get(key="demo").pk == demo.pk  # not re-created

    admin = django_user_model.objects.create_superuser("admin")
    call_command("demo", stdout=io.StringIO())  # without --owner: the first superuser
    assert Mission.objects.get(key="demo").owner == admin


# ------------------------------------------------------------------ every mistake at once


def four_mistakes() -> str:
    """FILE, for the mission it created, with four mistakes of four kinds."""
    doc = yaml.safe_load(FILE)
    doc["mission"]["colour"] = "red"  # refused by the declaration: an unknown field
    doc["milestones"][0]["assertions"][0]["check"] = {"timeout": 3}  # a value the declaration's rule refuses
    doc["milestones"][1]["dependencies"] = ["m9"]  # valid by the declaration, refused by the file's rules
    # refused by what is stored: cart-total leaves the file but keeps its link to VAL-CART-002,
    # which the file turns milestone-scoped
    doc["milestones"][0]["slices"][0]["features"] = []
    doc["milestones"][0]["assertions"][1]["scope"] = "milestone"
    return yaml.safe_dump(doc, sort_keys=False)


FOUR_LINES = [
    "mission.colour: unknown field",
    "milestones[0].assertions[0].check: a check needs 'run' or 'file'",
    "milestones[1].dependencies: unknown milestone m9",
    "milestones[0].assertions[1].scope: milestone-scoped assertion VAL-CART-002 is linked to features "
    "not in the file: cart-total",
]


def api_errors(user, text: str, content_type: str = "application/yaml") -> list[str]:
    response = by_token(user).post("/api/missions/import/", text, content_type=content_type)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_mission_file" and body["detail"] == "mission file is invalid"
    return body["fields"]["errors"]


def cli_errors(tmp_path, text: str, name: str = "bad.yaml") -> list[str]:
    path = write(tmp_path, text, name)
    error, lines = refused("import_mission", str(path))
    n = len(lines)
    assert error.returncode == 1
    assert str(error) == f"{path}: mission file is invalid ({n} error{'s' if n != 1 else ''})"
    return lines


def test_four_mistakes_are_answered_at_once_by_the_api_and_the_command_line(tmp_path, alice, counts):
    import_command(str(write(tmp_path, FILE)), "--owner", "alice")
    stored = Mission.objects.get(key="shop").updated_at
    rows = counts()
    text = four_mistakes()
    assert api_errors(alice, text) == FOUR_LINES
    assert api_errors(alice, json.dumps(yaml.safe_load(text)), "application/json") == FOUR_LINES
    assert cli_errors(tmp_path, text) == FOUR_LINES
    assert counts() == rows and Mission.objects.get(key="shop").updated_at == stored


def test_rules_of_the_whole_file_report_every_refusal_at_once(tmp_path, alice, counts):
    doc = yaml.safe_load(FILE)
    doc["milestones"][1]["key"] = "m1"  # a duplicate key, and m1 now depends on itself
    doc["milestones"][0]["dependencies"] = ["m7", "m8"]
    doc["milestones"][0]["slices"][0]["features"][0]["assertions"] = ["VAL-CART-001", "VAL-X"]
    text = yaml.safe_dump(doc, sort_keys=False)
    expected = [
        "milestones[1].key: duplicate key m1",
        "milestones[0].dependencies: unknown milestone m7",
        "milestones[0].dependencies: unknown milestone m8",
        "milestones[1].dependencies: a milestone cannot depend on itself",
        "milestones[0].slices[0].features[0].assertions: unknown assertion key VAL-X",
    ]
    rows = counts()
    assert api_errors(alice, text) == expected
    assert cli_errors(tmp_path, text) == expected
    assert counts() == rows


@pytest.mark.parametrize(
    "text, name, content_type, line",
    [
        (
            "mission: [unclosed",
            "bad.yaml",
            "application/yaml",
            "document: invalid YAML: expected ',' or ']', but got '<stream end>' at line 1 column 19",
        ),
        (
            '{"mission": {"key": "shop",',
            "bad.json",
            "application/json",
            "document: invalid YAML: expected the node content, but found '<stream end>' at line 1 column 28",
        ),
        (
            '{"mission": {"key": "a", "title": "A"}, "mission": {"key": "b", "title": "B"}}',
            "twice.json",
            "application/json",
            "document: invalid YAML: duplicate key 'mission' at line 1 column 41",
        ),
        ("", "empty.yaml", "application/yaml", "document: must be a mapping with `mission` and `milestones`"),
        (
            '{"mission": {"key": "shop", "title": "half \\udbe5 a pair"}}',
            "half.json",
            "application/json",
            "mission.title: must be valid Unicode text (no lone surrogates)",
        ),
        (
            '{"mission": {"key": "shop", "title": "T", "\\udbe5": 1}}',
            "name.json",
            "application/json",
            "mission: a field name must be valid Unicode text (no lone surrogates)",
        ),
        ("[" * 5000 + "]" * 5000, "deep.yaml", "application/yaml", "document: nested too deeply"),
    ],
)
def test_a_text_that_cannot_be_read_is_one_line_in_both(tmp_path, alice, text, name, content_type, line):
    assert api_errors(alice, text, content_type) == [line]
    assert cli_errors(tmp_path, text, name) == [line]
    assert not Mission.objects.exists()


def test_json_is_read_as_json_where_yaml_would_not(tmp_path, alice):
    doc = yaml.safe_load(FILE)
    doc["mission"]["title"] = "Shop \U0001f6d2"  # written `\ud83d\uded2`: one character, not two halves
    text = json.dumps(doc, indent="\t")  # and a tab indents each line
    response = by_token(alice).post("/api/missions/import/", text, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["title"] == "Shop \U0001f6d2"
    assert import_command(str(write(tmp_path, text, "shop.json"))) == "imported mission shop (unchanged)\n"


def test_a_relative_repository_is_one_of_the_api_files_mistakes(tmp_path, alice):
    doc = yaml.safe_load(FILE)
    doc["mission"].update(repository="./repo", colour="red")
    doc["milestones"][1]["dependencies"] = ["m9"]
    text = yaml.safe_dump(doc, sort_keys=False)
    relative = "mission.repository: a file sent to the API needs a git URL or an absolute repository path"
    # a rule of the whole file: after the declaration's verdicts, before the references
    assert api_errors(alice, text) == [FOUR_LINES[0], relative, FOUR_LINES[2]]
    # the command line resolves it against the file's folder: not a mistake there
    assert cli_errors(tmp_path, text) == [FOUR_LINES[0], FOUR_LINES[2]]
    assert not Mission.objects.exists()
