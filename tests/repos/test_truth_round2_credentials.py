"""Credentials are bound to where they may go (docs/REPOSITORIES.md, "Credentials").

The deployment lists the variables a mission's `credentials_env` may name and, for each,
the URL prefixes its value may be sent to (`FUSION_GIT_CREDENTIALS`). Anything else is
refused for everyone, only staff name a variable at all (unless
`FUSION_MEMBERS_SET_CREDENTIALS`), and the git adapter never hands a secret to a URL
outside its prefixes, even for a row stored before the rule or a setting changed since.
"""

from __future__ import annotations

import secrets

import pytest

from fusion_site.repos import sources
from fusion_site.repos.snapshots import snapshot
from fusion_site.repos.sources import SourceUnavailable
from missions.models import Mission

from .httpgit import HttpGit
from .test_credentials import OverPlainHttp

URL = "https://github.com/acme/shop.git"

pytestmark = pytest.mark.django_db


@pytest.fixture
def listed(settings):
    settings.FUSION_GIT_CREDENTIALS = {"GITHUB_TOKEN": ["https://github.com/acme/"]}
    settings.FUSION_MEMBERS_SET_CREDENTIALS = False
    return settings


def test_a_member_naming_any_worker_variable_is_refused_and_nothing_changes(api_for, alice, listed):
    client = api_for(alice)
    created = client.post("/api/missions/", {"key": "shop", "title": "Shop", "repository": URL}, format="json")
    assert created.status_code == 201, created.json()
    mission_id = created.json()["id"]
    for name in ("SECRET_KEY", "DATABASE_URL", "OTHER_TEAM_TOKEN"):
        response = client.patch(f"/api/missions/{mission_id}/", {"credentials_env": name}, format="json")
        assert response.status_code == 400, response.json()
        assert response.json()["code"] == "credentials_not_allowed"
        assert list(response.json()["fields"]) == ["credentials_env"]
    assert Mission.objects.get(pk=mission_id).credentials_env == ""


def test_a_listed_variable_outside_its_prefixes_is_refused_even_for_staff(api_for, staff, listed):
    for url in ("https://github.com/acme-evil/shop.git", "https://github.com.evil.com/acme/shop.git"):
        response = api_for(staff).post(
            "/api/missions/",
            {"key": "s", "title": "S", "repository": url, "credentials_env": "GITHUB_TOKEN"},
            format="json",
        )
        assert response.status_code == 400 and response.json()["code"] == "credentials_not_allowed", url
    ok = api_for(staff).post(
        "/api/missions/",
        {"key": "s", "title": "S", "repository": URL, "credentials_env": "GITHUB_TOKEN"},
        format="json",
    )
    assert ok.status_code == 201, ok.json()
    # Moving the repository elsewhere under the same variable is refused too.
    moved = api_for(staff).patch(
        f"/api/missions/{ok.json()['id']}/", {"repository": "https://gitlab.com/acme/shop.git"}, format="json"
    )
    assert moved.status_code == 400 and moved.json()["code"] == "credentials_not_allowed"


def test_only_staff_name_a_variable_unless_the_deployment_lets_members(api_for, alice, listed):
    body = {"key": "s", "title": "S", "repository": URL, "credentials_env": "GITHUB_TOKEN"}
    refused = api_for(alice).post("/api/missions/", body, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "staff_only"
    listed.FUSION_MEMBERS_SET_CREDENTIALS = True
    assert api_for(alice).post("/api/missions/", body, format="json").status_code == 201


def test_a_mission_file_and_the_admin_form_refuse_an_unlisted_variable(alice, listed):
    from missions.admin.forms import MissionForm
    from missions.errors import Invalid
    from missions.services.files import mission_import

    document = {"mission": {"key": "f", "title": "F", "repository": URL, "credentials_env": "SECRET_KEY"}}
    with pytest.raises(Invalid) as refused:
        mission_import(document=document, user=alice)
    assert refused.value.code == "credentials_not_allowed"
    assert refused.value.fields["errors"][0].startswith("mission.credentials_env: credentials_env 'SECRET_KEY'")
    form = MissionForm(
        data={
            "key": "adm",
            "title": "Adm",
            "repository": URL,
            "credentials_env": "SECRET_KEY",
            "protected_paths": "[]",
            "allowed_validators": "[]",
            "on_protected_change": "fail",
            "validator": "composite",
            "executor": "manual",
            "retry_budget": 3,
            "status": "planning",
        }
    )
    assert not form.is_valid()
    assert "credentials_env" in form.errors and "FUSION_GIT_CREDENTIALS" in form.errors["credentials_env"][0]
    assert not Mission.objects.exists()


@pytest.mark.parametrize(
    ("url", "inside"),
    [
        ("https://github.com/acme/shop.git", True),
        ("https://GitHub.com./acme/shop.git", True),
        ("https://github.com:443/acme/shop.git", True),
        ("https://github.com/acme", True),
        ("https://github.com/acme-evil/shop.git", False),
        ("https://github.com.evil.com/acme/shop.git", False),
        ("https://evil.com/github.com/acme/shop.git", False),
        ("https://github.com:8443/acme/shop.git", False),
        ("ssh://git@github.com/acme/shop.git", False),
        ("https://github.com/acme/../evil/shop.git", False),
        ("https://github.com/acme/%2e%2e/evil/shop.git", False),
        ("https://github.com/acme%2Fevil/shop.git", False),
        ("https://github.com/other/shop.git", False),
        ("git@github.com:acme/shop.git", False),
    ],
)
def test_prefixes_compare_scheme_host_port_and_whole_path_segments(url, inside):
    from fusion_site.repos.sources import url_within

    assert url_within(url, "https://github.com/acme/") is inside
    assert url_within("git@github.com:acme/shop.git", "ssh://git@github.com/acme/")


def test_git_never_receives_a_stored_variable_the_deployment_does_not_allow(tmp_path, git_repo, monkeypatch, settings):
    """A row stored before the rule (or a setting changed since) names SECRET_KEY-like
    variable: git goes without credentials, so the server never sees its value."""
    monkeypatch.setattr(sources, "URL_SCHEMES", (*sources.URL_SCHEMES, "http"))
    secret = "django-insecure-" + secrets.token_hex(16)
    monkeypatch.setenv("FUSION_TEST_SECRET_KEY", secret)
    with HttpGit(tmp_path / "http", user="x-access-token", token=secret) as server:
        server.bare("shop.git", source=git_repo.path)
        revision = git_repo.git("rev-parse", "HEAD").strip()
        source = OverPlainHttp(url=server.url("shop.git"), local=False, credentials_env="FUSION_TEST_SECRET_KEY")
        settings.FUSION_GIT_CREDENTIALS = {"GITHUB_TOKEN": [server.url("")]}  # another variable only
        with pytest.raises(SourceUnavailable), snapshot(source, revision):
            pass
        assert server.authorized == 0
        assert all(secret not in value for value in sources.git_env(source).values())
        # Listed for another host, it still does not go here.
        settings.FUSION_GIT_CREDENTIALS = {"FUSION_TEST_SECRET_KEY": ["https://github.com/acme/"]}
        assert all(secret not in value for value in sources.git_env(source).values())
        assert server.authorized == 0
