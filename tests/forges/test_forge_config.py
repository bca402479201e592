"""A mission's forge as the mission file sets it (`forge:`), as the API shows it, and its
secret: the owner's and staff's to read and rotate, never another member's, never in the
admin's pages, the events or the audit (docs/FORGES.md)."""

from __future__ import annotations

import json
import logging

import pytest
import yaml
from django.test import Client
from django_eventstream.models import Event as StoredEvent

from forges.models import DEFAULT_FEATURE_PATTERN, Delivery, Forge
from missions.errors import Forbidden, Invalid
from missions.models import MissionEvent
from missions.services.files import mission_export, mission_file_import
from missions.services.files.forge_section import DEFAULT_CONTEXT
from missions.services.files.forge_section import DEFAULT_FEATURE_PATTERN as FILE_PATTERN
from missions.services.files.schema import MissionFileForge
from tests.missions.file_helpers import sample

from .conftest import github_pr, hook, processed, push_payload

pytestmark = pytest.mark.django_db(transaction=True)

FORGE = {
    "provider": "github",
    "api_url": "https://api.github.com",
    "repository": "acme/shop",
    "feature_pattern": r"\[([a-z0-9-]+)\]",
    "context": "shop-ci",
}


def with_forge(**changes) -> dict:
    """The sample mission file (without its check, which only staff may set) and a forge."""
    document = sample()
    for milestone in document["milestones"]:
        for assertion in milestone.get("assertions", []):
            assertion.pop("check", None)
    document["forge"] = {**FORGE, **changes}
    return document


def errors_of(document, user=None) -> tuple[str, list[str]]:
    with pytest.raises((Invalid, Forbidden)) as info:
        mission_file_import(document=document, user=user)
    return info.value.code, info.value.fields["errors"]


def test_the_files_declaration_agrees_with_the_forges_columns():
    fields = MissionFileForge.model_fields
    assert FILE_PATTERN == DEFAULT_FEATURE_PATTERN
    assert fields["context"].default == DEFAULT_CONTEXT == Forge._meta.get_field("context").default
    for name in ("api_url", "repository", "token_env", "feature_pattern", "context", "provider"):
        limit = next(m.max_length for m in fields[name].metadata if hasattr(m, "max_length"))
        assert limit == Forge._meta.get_field(name).max_length, name
    provider = next(m for m in fields["provider"].metadata if hasattr(m, "choices"))
    assert set(provider.choices) == {c for c, _ in Forge._meta.get_field("provider").choices}


def test_importing_a_forge_section_creates_the_forge_with_a_secret_and_updates_it_later(staff):
    result = mission_file_import(document=with_forge(), user=staff)
    forge = Forge.objects.get(mission=result.mission)
    assert (forge.provider, forge.api_url, forge.repository, forge.context) == (
        "github",
        "https://api.github.com",
        "acme/shop",
        "shop-ci",
    )
    assert forge.feature_pattern == r"\[([a-z0-9-]+)\]" and forge.statuses and forge.comments
    secret = forge.secret
    assert len(secret) >= 32

    again = mission_file_import(document=with_forge(), user=staff)
    assert again.changed is False

    changed = mission_file_import(document=with_forge(provider="gitea", comments=False), user=staff)
    forge.refresh_from_db()
    assert changed.changed is True
    assert (forge.provider, forge.comments, forge.secret) == ("gitea", False, secret)  # the secret is kept

    document = with_forge()
    del document["forge"]
    without = mission_file_import(document=document, user=staff)  # no `forge:`: left alone
    assert without.changed is False and Forge.objects.filter(mission=result.mission).exists()


def test_export_writes_the_forge_section_without_its_secret_and_round_trips(staff):
    mission = mission_file_import(document=with_forge(token_env=""), user=staff).mission
    text = mission_export(mission=mission)
    assert Forge.objects.get(mission=mission).secret not in text
    exported = yaml.safe_load(text)["forge"]
    assert exported == {**FORGE, "token_env": "", "statuses": True, "comments": True}
    assert mission_file_import(document=text, user=staff).changed is False


def test_the_sections_mistakes_are_named_by_their_path_and_nothing_is_written():
    document = with_forge(feature_pattern="([unclosed", provider="bitbucket", color="red")
    document["forge"]["api_url"] = "ftp://example.com"
    code, errors = errors_of(document)
    assert code == "invalid_mission_file"
    assert errors[0] == "forge.color: unknown field"
    assert "forge.provider: must be one of github, gitlab, gitea, generic" in errors
    assert "forge.api_url: must be an http(s) URL" in errors
    assert any(line.startswith("forge.feature_pattern: must be a regular expression") for line in errors)
    assert not Forge.objects.exists()


def test_the_token_follows_the_credentials_rule(settings, staff, alice):
    settings.FUSION_GIT_CREDENTIALS = {"FORGE_TOKEN": ["https://api.github.com/"], "OTHER": ["https://x.example/"]}
    code, errors = errors_of(with_forge(token_env="OTHER"), staff)
    assert code == "credentials_not_allowed"
    assert errors == ["forge.token_env: 'OTHER' may not be used for https://api.github.com (FUSION_GIT_CREDENTIALS)"]

    code, errors = errors_of(with_forge(token_env="FORGE_TOKEN"), alice)
    assert (code, errors) == ("staff_only", ["forge.token_env: only staff may set this field"])
    assert not Forge.objects.exists()  # the whole import rolled back

    mission = mission_file_import(document=with_forge(token_env="FORGE_TOKEN"), user=staff).mission
    assert Forge.objects.get(mission=mission).token_env == "FORGE_TOKEN"
    mission.members.add(alice)
    # A member re-imports the file staff wrote: an unchanged token is not judged again.
    assert mission_file_import(document=with_forge(token_env="FORGE_TOKEN", context="x"), user=alice).changed

    settings.FUSION_MEMBERS_SET_CREDENTIALS = True
    mission_file_import(document=with_forge(token_env=""), user=alice)
    assert mission_file_import(document=with_forge(token_env="FORGE_TOKEN"), user=alice).changed


def test_the_api_and_the_mission_file_import_over_http_share_the_forge(api_for, staff):
    answer = api_for(staff).post(
        "/api/missions/import/", data=json.dumps(with_forge()), content_type="application/json"
    )
    assert answer.status_code == 201, answer.content
    forge = api_for(staff).get(f"/api/missions/{answer.json()['id']}/forge/").json()
    assert forge["repository"] == "acme/shop" and forge["secret"]


@pytest.fixture
def team(django_user_model, alice, staff):
    """Alice owns `shop` (bob is a member of it); bob owns `lab`, of which alice is no member."""
    bob = django_user_model.objects.create_user("bob")
    shop = mission_file_import(document=with_forge(), user=alice).mission
    shop.members.add(bob)
    lab_doc = with_forge()
    lab_doc["mission"]["key"] = "lab"
    lab = mission_file_import(document=lab_doc, user=bob).mission
    return alice, bob, staff, shop, lab


def test_members_see_the_forge_without_its_secret_the_owner_and_staff_with_it(api_for, team):
    alice, bob, staff, shop, lab = team
    url = f"/api/missions/{shop.pk}/forge/"
    secret = Forge.objects.get(mission=shop).secret

    owner_view = api_for(alice).get(url).json()
    member_view = api_for(bob).get(url).json()
    staff_view = api_for(staff).get(url).json()

    assert owner_view["secret"] == secret == staff_view["secret"]
    assert owner_view["hook_url"] == f"http://testserver/hooks/github/{shop.key}/"
    assert member_view["repository"] == "acme/shop" and member_view["secret_source"] == "forge"
    assert "secret" not in member_view and "hook_url" not in member_view
    assert secret not in json.dumps(member_view)
    # Alice is no member of bob's lab: it is not there for her at all.
    assert api_for(alice).get(f"/api/missions/{lab.pk}/forge/").status_code == 404
    assert api_for(None).get(url).status_code in (401, 403)


def test_only_the_owner_or_staff_rotate_the_secret_and_the_old_one_is_refused(api_for, team, idle_broker):
    alice, bob, staff, shop, _ = team
    url = f"/api/missions/{shop.pk}/forge/rotate-secret/"
    old = Forge.objects.get(mission=shop).secret

    refused = api_for(bob).post(url)
    assert refused.status_code == 403 and refused.json()["code"] == "owner_only"
    assert Forge.objects.get(mission=shop).secret == old

    rotated = api_for(alice).post(url)
    new = rotated.json()["secret"]
    assert rotated.status_code == 200 and new != old and Forge.objects.get(mission=shop).secret == new
    assert api_for(staff).post(url).status_code == 200

    payload = push_payload("refs/heads/main", "b" * 40)
    assert hook(Client(), shop, payload, secret=old).status_code == 401
    assert hook(Client(), shop, payload).status_code == 202


def test_a_members_secret_is_in_no_admin_page_event_stream_or_log(team, idle_broker, caplog):
    alice, bob, staff, shop, lab = team
    secrets = [Forge.objects.get(mission=m).secret for m in (shop, lab)]
    caplog.set_level(logging.DEBUG)
    client = Client()
    # Deliveries of every kind: matched nothing, refused, replayed.
    processed(hook(client, shop, github_pr(1, "b", "[cart-total] x", "c" * 40), event="pull_request"))
    hook(client, shop, push_payload("refs/heads/main", "d" * 40), secret=secrets[1])
    processed(hook(client, lab, push_payload("refs/heads/main", "e" * 40), delivery="r"))
    hook(client, lab, push_payload("refs/heads/main", "e" * 40), delivery="r")

    admin = Client()
    staff.is_superuser = True
    staff.save()
    admin.force_login(staff)
    pages = [
        admin.get("/admin/forges/forge/"),
        admin.get(f"/admin/forges/forge/{Forge.objects.get(mission=shop).pk}/change/"),
        admin.get("/admin/forges/delivery/"),
        *(admin.get(f"/admin/forges/delivery/{d.pk}/change/") for d in Delivery.objects.all()),
        admin.get("/admin/missions/missionevent/"),
    ]
    assert all(page.status_code == 200 for page in pages)
    assert "the signature is missing or wrong" in pages[2].content.decode()  # the list says why
    member = Client()
    member.force_login(bob)
    assert member.get("/admin/forges/forge/").status_code == 302  # the admin is staff's

    events = [json.dumps(e.payload) for e in MissionEvent.objects.all()]
    stream = [str(e.data) for e in StoredEvent.objects.all()]
    assert any("forge-delivery:processed" in text for text in stream)
    for secret in secrets:
        for text in [*(p.content.decode() for p in pages), *events, *stream, caplog.text]:
            assert secret not in text
