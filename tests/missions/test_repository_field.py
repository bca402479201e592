"""A mission's `repository` (a git URL or a local path; `workspace` is its former name) and
`credentials_env` on every surface that writes them: the API, mission files (through the
API and the command line) and the admin form. The checks themselves are
`fusion_site.repos.sources`; these tests hold each surface to them."""

from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import call_command
from django.forms.models import model_to_dict

from missions.admin.forms import MissionForm
from missions.models import Mission
from missions.services.files import mission_export, mission_import

pytestmark = pytest.mark.django_db

ACCEPTED_URLS = [
    "https://git.example.com/org/shop.git",
    "ssh://git@git.example.com:2222/org/shop.git",
    "git://git.example.com/shop.git",
    "git@git.example.com:org/shop.git",
]

HOSTILE = {
    "ext-helper": "ext::sh -c 'touch /tmp/x'",
    "fd-helper": "fd::3",
    "option": "-uhttps://x",
    "option-in-path": "https://h/--upload-pack=touch",
    "option-as-host": "ssh://-oProxyCommand=x/y",
    "scp-option-host": "user@-host:path",
    "password-in-url": "https://u:token@host/r.git",
    "plain-http": "http://host/r.git",
    "newline": "https://host/r.git\n--upload-pack=touch",
}

BAD_ENV_NAMES = ["1TOKEN", "MY-TOKEN", "MY TOKEN", "$HOME", "TOKEN;rm", "A=B"]

SECRET = "s3cr3t-token-value-never-shown"


def row(mission: Mission) -> dict:
    mission.refresh_from_db()
    return {f.attname: getattr(mission, f.attname) for f in Mission._meta.concrete_fields}


@pytest.fixture
def roots(settings, tmp_path):
    """FUSION_WORKSPACE_ROOTS = [tmp_path/roots]: where anyone may name a local repository."""
    root = tmp_path / "roots"
    (root / "shop").mkdir(parents=True)
    settings.FUSION_WORKSPACE_ROOTS = [str(root)]
    return root


@pytest.fixture(autouse=True)
def credentials_allowed(settings):
    """The deployment lets SHOP_TOKEN (and TOK) go to the example host and local paths, and
    members name them: this file is about the repository's forms (the binding itself:
    tests/repos/test_truth_round2_credentials.py)."""
    hosts = ["https://git.example.com/", "ssh://git.example.com:2222/", "ssh://git.example.com/"]
    prefixes = [*hosts, "git://git.example.com/", "file:///"]
    settings.FUSION_GIT_CREDENTIALS = {"SHOP_TOKEN": prefixes, "TOK": prefixes}
    settings.FUSION_MEMBERS_SET_CREDENTIALS = True


@pytest.fixture
def no_roots(settings):
    settings.FUSION_WORKSPACE_ROOTS = []


# ------------------------------------------------------------------ API: create and update


@pytest.mark.parametrize("url", ACCEPTED_URLS)
def test_a_member_creates_and_updates_a_mission_with_each_url_form(api_for, alice, url, no_roots):
    client = api_for(alice)
    response = client.post(
        "/api/missions/", {"key": "shop", "title": "Shop", "repository": url, "credentials_env": "SHOP_TOKEN"}
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["repository"], body["credentials_env"]) == (url, "SHOP_TOKEN")
    assert "workspace" not in body  # input only (see MissionSerializer)
    mission = Mission.objects.get(key="shop")
    assert (mission.repository, mission.credentials_env) == (url, "SHOP_TOKEN")

    response = client.patch(f"/api/missions/{mission.pk}/", {"repository": ACCEPTED_URLS[0]}, format="json")
    assert response.status_code == 200, response.json()
    assert Mission.objects.get(pk=mission.pk).repository == ACCEPTED_URLS[0]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_repositories_are_refused_with_a_stable_code_and_change_nothing(api_for, staff, name):
    value = HOSTILE[name]
    client = api_for(staff)  # refused even from staff
    response = client.post("/api/missions/", {"key": "bad", "title": "Bad", "repository": value}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "repository_refused"
    assert list(body["fields"]) == ["repository"] and body["fields"]["repository"][0]
    assert not Mission.objects.filter(key="bad").exists()

    mission = Mission.objects.create(key="good", title="Good", owner=staff, repository=ACCEPTED_URLS[0])
    before = row(mission)
    for payload in ({"repository": value, "title": "Changed"}, {"workspace": value, "title": "Changed"}):
        response = client.patch(f"/api/missions/{mission.pk}/", payload, format="json")
        assert response.status_code == 400 and response.json()["code"] == "repository_refused", response.json()
        assert row(mission) == before


def test_the_refusal_says_why(api_for, staff):
    response = api_for(staff).post(
        "/api/missions/", {"key": "bad", "title": "Bad", "repository": HOSTILE["password-in-url"]}, format="json"
    )
    assert response.json()["fields"] == {
        "repository": ["put the token in the variable credentials_env names, not in the URL"]
    }
    assert response.json()["detail"].startswith("repository refused: ")


@pytest.mark.parametrize("form", ["path", "file-url"])
def test_a_local_repository_is_for_staff_or_inside_the_workspace_roots(
    api_for, alice, staff, roots, tmp_path, form, settings
):
    def text(path) -> str:
        return f"file://{path}" if form == "file-url" else str(path)

    outside = tmp_path / "elsewhere"
    inside = roots / "shop"
    member = api_for(alice)
    for value in (text(outside), text(roots / ".." / "elsewhere")):
        response = member.post("/api/missions/", {"key": "loc", "title": "Local", "repository": value}, format="json")
        assert response.status_code == 400 and response.json()["code"] == "repository_refused", response.json()
        assert "staff" in response.json()["fields"]["repository"][0]
    assert not Mission.objects.filter(key="loc").exists()

    # a symbolic link inside the roots that leads out of them is judged where it leads
    (roots / "link").symlink_to(outside, target_is_directory=False)
    response = member.post(
        "/api/missions/", {"key": "loc", "title": "Local", "repository": text(roots / "link")}, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "repository_refused"

    response = member.post("/api/missions/", {"key": "loc", "title": "Local", "repository": text(inside)})
    assert response.status_code == 201, response.json()
    assert response.json()["repository"] == str(inside)  # a file:// URL is stored as its path

    response = api_for(staff).post("/api/missions/", {"key": "ops", "title": "Ops", "repository": text(outside)})
    assert response.status_code == 201, response.json()
    assert Mission.objects.get(key="ops").repository == str(outside)

    settings.FUSION_WORKSPACE_ROOTS = []
    response = member.post("/api/missions/", {"key": "loc2", "title": "Local", "repository": text(inside)})
    assert response.status_code == 400 and response.json()["code"] == "repository_refused"


def test_a_member_edits_a_mission_staff_pointed_at_a_local_path(api_for, alice, staff, no_roots, tmp_path):
    local = str(tmp_path / "ops-repo")
    mission = Mission.objects.create(key="ops", title="Ops", owner=alice, repository=local)
    client = api_for(alice)
    response = client.patch(f"/api/missions/{mission.pk}/", {"title": "Renamed"}, format="json")
    assert response.status_code == 200, response.json()
    # the same value sent back is not judged again
    response = client.patch(f"/api/missions/{mission.pk}/", {"repository": local, "title": "Again"}, format="json")
    assert response.status_code == 200, response.json()
    response = client.put(f"/api/missions/{mission.pk}/", {"key": "ops", "title": "Put"}, format="json")
    assert response.status_code == 200, response.json()
    assert Mission.objects.get(pk=mission.pk).repository == local  # a full update without it keeps it
    # another local path is a change, judged with the member's flag
    before = row(mission)
    response = client.patch(f"/api/missions/{mission.pk}/", {"repository": local + "-2"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "repository_refused"
    assert row(mission) == before
    response = api_for(staff).patch(f"/api/missions/{mission.pk}/", {"repository": local + "-2"}, format="json")
    assert response.status_code == 200 and response.json()["repository"] == local + "-2"


def test_workspace_is_read_as_the_former_name_of_repository(api_for, alice):
    client = api_for(alice)
    url = ACCEPTED_URLS[0]
    response = client.post("/api/missions/", {"key": "old", "title": "Old client", "workspace": url}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["repository"] == url and "workspace" not in response.json()
    mission = Mission.objects.get(key="old")
    assert mission.repository == url

    response = client.patch(f"/api/missions/{mission.pk}/", {"workspace": url, "repository": url}, format="json")
    assert response.status_code == 200, response.json()

    before = row(mission)
    response = client.patch(
        f"/api/missions/{mission.pk}/", {"workspace": ACCEPTED_URLS[1], "repository": url}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid"
    assert response.json()["fields"] == {
        "workspace": ["the former name of repository, whose value differs: give only repository"]
    }
    assert row(mission) == before


@pytest.mark.parametrize("name", BAD_ENV_NAMES)
def test_a_bad_credentials_env_name_is_refused(api_for, alice, name):
    client = api_for(alice)
    response = client.post("/api/missions/", {"key": "env", "title": "Env", "credentials_env": name}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid" and list(response.json()["fields"]) == ["credentials_env"]
    assert not Mission.objects.filter(key="env").exists()
    mission = Mission.objects.create(key="env", title="Env", owner=alice)
    before = row(mission)
    response = client.patch(f"/api/missions/{mission.pk}/", {"credentials_env": name}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "invalid"
    assert row(mission) == before


def test_the_credential_value_never_appears_in_the_api(api_for, alice, monkeypatch):
    monkeypatch.setenv("SHOP_TOKEN", SECRET)
    client = api_for(alice)
    response = client.post(
        "/api/missions/",
        {"key": "shop", "title": "Shop", "repository": ACCEPTED_URLS[0], "credentials_env": "SHOP_TOKEN"},
        format="json",
    )
    assert response.status_code == 201
    mission = Mission.objects.get(key="shop")
    assert mission.credentials_env == "SHOP_TOKEN"
    assert SECRET not in str(row(mission))  # only the name is stored
    client.patch(f"/api/missions/{mission.pk}/", {"title": "Shop 2"}, format="json")
    pages = [
        response,
        client.get("/api/missions/"),
        client.get(f"/api/missions/{mission.pk}/"),
        client.get(f"/api/missions/{mission.pk}/tree/"),
        client.get(f"/api/missions/{mission.pk}/events/"),
        client.get(f"/api/missions/{mission.pk}/export/"),
        client.get("/api/events/", {"mission": mission.pk}),
    ]
    for page in pages:
        assert page.status_code in (200, 201), page.content
        assert SECRET.encode() not in page.content
    assert b"SHOP_TOKEN" in pages[2].content


# ------------------------------------------------------------------ mission files


def _file(**mission) -> str:
    return yaml.safe_dump({"mission": {"key": "shop", "title": "Shop", **mission}, "milestones": []})


def _import(client, text):
    return client.post("/api/missions/import/", text, content_type="application/yaml")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_mission_file_with_a_hostile_repository_is_refused_and_writes_nothing(api_for, staff, name):
    response = _import(api_for(staff), _file(repository=HOSTILE[name]))
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "repository_refused", body
    assert body["fields"] == {"errors": [body["detail"]]} and body["detail"].startswith("mission.repository: ")
    assert not Mission.objects.exists()
    # the same from the command line (an operator, trusted with local paths: not with these)
    with pytest.raises(Exception, match="repository"):
        mission_import(document=_file(repository=HOSTILE[name]), user=None)
    assert not Mission.objects.exists()


def test_a_mission_file_names_a_local_repository_by_the_importer_rules(api_for, alice, staff, roots, tmp_path):
    outside, inside = str(tmp_path / "elsewhere"), str(roots / "shop")
    member = api_for(alice)
    for value in (outside, f"file://{outside}"):
        response = _import(member, _file(repository=value))
        assert response.status_code == 400 and response.json()["code"] == "repository_refused", response.json()
        assert response.json()["fields"]["errors"][0].startswith("mission.repository: a local repository")
    response = _import(member, _file(workspace=outside))  # the former name: the same rules, its own path
    assert response.status_code == 400 and response.json()["fields"]["errors"][0].startswith("mission.workspace: ")
    assert not Mission.objects.exists()

    response = _import(member, _file(repository=f"file://{inside}"))
    assert response.status_code == 201, response.json()
    assert Mission.objects.get(key="shop").repository == inside

    response = _import(api_for(staff), _file(repository=outside, credentials_env="SHOP_TOKEN"))
    assert response.status_code == 200, response.json()
    mission = Mission.objects.get(key="shop")
    assert (mission.repository, mission.credentials_env) == (outside, "SHOP_TOKEN")

    # the member re-imports the file unchanged: the repository staff set is not judged again
    response = _import(member, mission_export(mission=mission).replace("title: Shop\n", "title: Shop 2\n"))
    assert response.status_code == 200, response.json()
    assert Mission.objects.get(key="shop").title == "Shop 2"
    # the command line acts as an operator
    assert mission_import(document=_file(repository=outside + "-cli"))[0].repository == outside + "-cli"


def test_the_import_command_resolves_a_relative_repository_and_acts_as_staff(tmp_path, no_roots):
    path = tmp_path / "plans" / "shop.yaml"
    path.parent.mkdir()
    path.write_text(_file(workspace="../code"), encoding="utf-8")  # the former name, still read
    call_command("import_mission", str(path), stdout=io.StringIO())
    assert Mission.objects.get(key="shop").repository == str(tmp_path / "code")


def test_a_mission_file_credentials_env_is_a_variable_name(api_for, alice):
    for name in BAD_ENV_NAMES:
        response = _import(api_for(alice), _file(credentials_env=name))
        assert response.status_code == 400 and response.json()["code"] == "invalid_mission_file", response.json()
        assert response.json()["fields"]["errors"] == [
            "mission.credentials_env: credentials_env is the name of an environment variable (letters, digits, _)"
        ]
    assert not Mission.objects.exists()


def test_export_writes_repository_and_credentials_env_and_round_trips(api_for, alice, monkeypatch):
    monkeypatch.setenv("SHOP_TOKEN", SECRET)
    mission, _ = mission_import(
        document=_file(workspace=ACCEPTED_URLS[3], credentials_env="SHOP_TOKEN", description="d"), user=alice
    )
    text = mission_export(mission=mission)
    data = yaml.safe_load(text)["mission"]
    assert (data["repository"], data["credentials_env"]) == (ACCEPTED_URLS[3], "SHOP_TOKEN")
    assert "workspace" not in data and SECRET not in text
    assert mission_import(document=text, user=alice)[1] is False  # re-importing the export changes nothing
    response = _import(api_for(alice), text)
    assert response.status_code == 200 and response.json()["changed"] is False
    # and into a fresh database
    mission.delete()
    again, _ = mission_import(document=text, user=alice)
    assert (again.repository, again.credentials_env) == (ACCEPTED_URLS[3], "SHOP_TOKEN")
    assert mission_export(mission=again) == text


# ------------------------------------------------------------------ admin


def _form(instance: Mission | None = None, **changes) -> MissionForm:
    data = {
        "key": "adm",
        "title": "Admin",
        "status": "planning",
        "retry_budget": 3,
        "validator": "composite",
        "executor": "manual",
        "on_protected_change": "fail",
        "protected_paths": "[]",
    }
    if instance is not None:
        data.update({k: v for k, v in model_to_dict(instance).items() if v is not None and k != "members"})
        data["protected_paths"] = "[]"
    data.update(changes)
    return MissionForm(data=data, instance=instance)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_the_admin_form_refuses_a_hostile_repository_with_the_reason(name):
    form = _form(repository=HOSTILE[name])
    assert not form.is_valid()
    assert list(form.errors) == ["repository"] and form.errors["repository"][0]


def test_the_admin_form_accepts_urls_and_local_paths_and_checks_credentials_env(no_roots, tmp_path):
    for value in ACCEPTED_URLS:
        form = _form(repository=value, credentials_env="SHOP_TOKEN")
        assert form.is_valid(), form.errors
    form = _form(repository=f"file://{tmp_path}/repo")  # admin users are staff
    assert form.is_valid(), form.errors
    mission = form.save()
    assert mission.repository == f"{tmp_path}/repo"
    form = _form(mission, title="Renamed")
    assert form.is_valid(), form.errors
    form = _form(key="adm-bad", repository=HOSTILE["password-in-url"])
    assert not form.is_valid()
    assert form.errors == {"repository": ["put the token in the variable credentials_env names, not in the URL"]}
    for name in BAD_ENV_NAMES:
        form = _form(key="adm-env", credentials_env=name)
        assert not form.is_valid() and list(form.errors) == ["credentials_env"]


def test_the_admin_change_page_shows_repository_and_credentials_env(admin_client):
    mission = Mission.objects.create(key="adm", title="Admin", repository=ACCEPTED_URLS[0], credentials_env="TOK")
    page = admin_client.get(f"/admin/missions/mission/{mission.pk}/change/")
    assert page.status_code == 200
    form = page.context["adminform"].form
    assert "repository" in form.fields and "credentials_env" in form.fields and "workspace" not in form.fields
    assert (form.initial["repository"], form.initial["credentials_env"]) == (ACCEPTED_URLS[0], "TOK")
