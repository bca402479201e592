"""The REST API links and unlinks features and assertions, and each write records its events."""

from __future__ import annotations

import pytest

from missions.models import (
    AssertionScope,
    ContractAssertion,
    FeatureAssertion,
    MissionEvent,
    RollupState,
)
from tests.missions.api_helpers import snapshot_tree

pytestmark = pytest.mark.django_db


def new_event_types(since_id: int) -> list[str]:
    return list(
        MissionEvent.objects.filter(pk__gt=since_id).order_by("mission_id", "seq").values_list("type", flat=True)
    )


def last_event_id() -> int:
    return MissionEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


# --------------------------------------------------------------------------- link / unlink


def test_link_and_unlink(api, member, tree, counts):
    client = api(member)
    url = f"/api/features/{tree.f2.pk}/"
    response = client.post(url + "link/", {"assertion": "VAL-002"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["assertion_keys"] == ["VAL-002"]

    rows = counts()
    response = client.post(url + "link/", {"assertion": "VAL-002"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "already_linked"
    response = client.post(url + "link/", {"assertion": str(tree.a_unlinked.pk)}, format="json")  # by id: same link
    assert response.status_code == 409 and response.json()["code"] == "already_linked"
    assert counts() == rows

    response = client.post(url + "link/", {"assertion": str(tree.a_linked.pk)}, format="json")  # by id
    assert response.status_code == 201
    assert response.json()["assertion_keys"] == ["VAL-001", "VAL-002"]

    response = client.post(url + "unlink/", {"assertion": "VAL-001"}, format="json")
    assert response.status_code == 200 and response.json()["assertion_keys"] == ["VAL-002"]
    rows = counts()
    response = client.post(url + "unlink/", {"assertion": "VAL-001"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "not_linked"
    response = client.post(url + "unlink/", {"assertion": str(tree.a_milestone.pk)}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "not_linked"
    assert counts() == rows
    assert list(FeatureAssertion.objects.filter(feature=tree.f2).values_list("assertion__key", flat=True)) == [
        "VAL-002"
    ]


@pytest.mark.parametrize("ref", ["VAL-M01", "id"])
def test_linking_a_milestone_scoped_assertion_is_refused(api, member, tree, counts, ref):
    rows = counts()
    value = str(tree.a_milestone.pk) if ref == "id" else ref
    response = api(member).post(f"/api/features/{tree.f2.pk}/link/", {"assertion": value}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "milestone_scoped" and "assertion" in response.json()["fields"]
    assert counts() == rows


@pytest.mark.parametrize("ref", ["VAL-404", "999999", "99999999999999999999999", "²", "VAL 001"])
def test_linking_an_unknown_assertion_is_refused(api, member, tree, counts, ref):
    rows = counts()
    response = api(member).post(f"/api/features/{tree.f2.pk}/link/", {"assertion": ref}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "unknown_assertion"
    assert counts() == rows


@pytest.mark.parametrize("body", [{}, {"assertion": ""}, {"assertion": None}, {"assertion": "  "}])
def test_link_without_an_assertion(api, member, tree, counts, body):
    rows = counts()
    response = api(member).post(f"/api/features/{tree.f2.pk}/link/", body, format="json")
    assert response.status_code == 400 and "assertion" in response.json()["fields"]
    assert counts() == rows


def test_cross_mission_assertion_is_refused(api, staff, tree, other_tree, counts):
    rows = counts()
    # staff sees both missions: the other mission's assertion is still not linkable
    response = api(staff).post(
        f"/api/features/{tree.f2.pk}/link/", {"assertion": str(other_tree.a_unlinked.pk)}, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "unknown_assertion"
    assert counts() == rows


def test_assertion_with_links_cannot_become_milestone_scoped(api, member, tree):
    before = snapshot_tree(tree)
    response = api(member).patch(f"/api/assertions/{tree.a_linked.pk}/", {"scope": "milestone"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "linked_assertion"
    assert snapshot_tree(tree) == before
    response = api(member).patch(f"/api/assertions/{tree.a_unlinked.pk}/", {"scope": "milestone"}, format="json")
    assert response.status_code == 200
    assert ContractAssertion.objects.get(pk=tree.a_unlinked.pk).scope == AssertionScope.MILESTONE


def test_feature_assertion_model_validation(tree, other_tree):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as info:
        FeatureAssertion(feature=tree.f2, assertion=tree.a_milestone).full_clean()
    assert "assertion" in info.value.message_dict
    with pytest.raises(ValidationError):
        FeatureAssertion(feature=tree.f2, assertion=other_tree.a_unlinked).full_clean()
    FeatureAssertion(feature=tree.f2, assertion=tree.a_unlinked).full_clean()  # a valid link passes


# --------------------------------------------------------------------------- events


def test_creating_an_assertion_writes_its_events(api, member, tree):
    since = last_event_id()
    response = api(member).post(
        "/api/assertions/",
        {"milestone": tree.milestone.pk, "key": "VAL-NEW", "title": "New", "statement": "s"},
        format="json",
    )
    assert response.status_code == 201
    assert new_event_types(since) == ["assertion:created", "milestone:validation:updated"]
    created, rollup = MissionEvent.objects.filter(pk__gt=since).order_by("seq")
    assert created.payload["key"] == "VAL-NEW" and created.actor == member
    assert rollup.payload["state"] == RollupState.NEEDS_COVERAGE and rollup.payload["milestone"] == tree.milestone.pk
    assert rollup.seq == created.seq + 1


def test_link_and_unlink_write_their_events(api, member, tree):
    client = api(member)
    since = last_event_id()
    assert client.post(f"/api/features/{tree.f2.pk}/link/", {"assertion": "VAL-002"}, format="json").status_code == 201
    assert new_event_types(since) == ["assertion:linked", "milestone:validation:updated"]
    linked = MissionEvent.objects.get(pk__gt=since, type="assertion:linked")
    assert linked.payload["feature"] == tree.f2.pk and linked.payload["key"] == "VAL-002"
    since = last_event_id()
    assert (
        client.post(f"/api/features/{tree.f2.pk}/unlink/", {"assertion": "VAL-002"}, format="json").status_code == 200
    )
    assert new_event_types(since) == ["assertion:unlinked", "milestone:validation:updated"]


def test_updating_and_deleting_an_assertion_write_their_events(api, member, tree):
    client = api(member)
    since = last_event_id()
    assert (
        client.patch(f"/api/assertions/{tree.a_unlinked.pk}/", {"title": "Changed"}, format="json").status_code == 200
    )
    assert new_event_types(since) == ["assertion:updated", "milestone:validation:updated"]
    since = last_event_id()
    assert (
        client.patch(f"/api/assertions/{tree.a_unlinked.pk}/", {"title": "Changed"}, format="json").status_code == 200
    )
    assert new_event_types(since) == []  # nothing changed, nothing announced
    since = last_event_id()
    assert client.delete(f"/api/assertions/{tree.a_unlinked.pk}/").status_code == 204
    assert new_event_types(since) == ["assertion:deleted", "milestone:validation:updated"]


def test_refused_writes_write_no_events(api, member, tree):
    client = api(member)
    since = last_event_id()
    client.post(f"/api/features/{tree.f1.pk}/link/", {"assertion": "VAL-001"}, format="json")  # already linked
    client.post(f"/api/features/{tree.f2.pk}/link/", {"assertion": "VAL-M01"}, format="json")  # milestone-scoped
    client.post(
        "/api/assertions/",
        {"milestone": tree.milestone.pk, "key": "VAL-001", "title": "d", "statement": "s"},
        format="json",
    )  # duplicate
    client.patch(f"/api/assertions/{tree.a_linked.pk}/", {"check": {"run": "id"}}, format="json")  # staff only
    assert new_event_types(since) == []
