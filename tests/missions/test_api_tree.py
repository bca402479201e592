"""The REST API's tree endpoint (its content, query count and rollups), the OpenAPI schema,
the mission-file endpoints and updated_at."""

from __future__ import annotations

import pytest
import yaml
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from missions.models import (
    ContractAssertion,
    FeatureAssertion,
    LoopState,
    Milestone,
    Mission,
    MissionFeature,
    RollupState,
    Slice,
)
from tests.missions.api_helpers import MISSION_FILE

pytestmark = pytest.mark.django_db

# --------------------------------------------------------------------------- tree


def test_tree_content(api, member, tree):
    tree.a_linked.status = "passed"
    tree.a_linked.save()
    MissionFeature.objects.filter(pk=tree.f1.pk).update(loop_state=LoopState.PASSED)
    response = api(member).get(f"/api/missions/{tree.mission.pk}/tree/")
    assert response.status_code == 200
    body = response.json()
    assert (body["id"], body["key"], body["retry_budget"]) == (tree.mission.pk, "alpha", 3)
    assert [m["key"] for m in body["milestones"]] == ["m1", "m2"]
    m1, m2 = body["milestones"]
    assert m1["assertions"] == ["VAL-001", "VAL-002", "VAL-M01"]
    assert m1["rollup"] == {
        "state": "needs_coverage",
        "total": 3,
        "passed": 1,
        "failed": 0,
        "blocked": 0,
        "pending": 2,
        "unlinked": 1,
    }
    assert m2["rollup"]["state"] == "not_started" and m2["slices"] == [] and m2["assertions"] == []
    [s1] = m1["slices"]
    assert s1["key"] == "s1"
    features = {f["key"]: f for f in s1["features"]}
    assert [f["key"] for f in s1["features"]] == ["f1", "f2"]
    assert features["f1"]["loop_state"] == "passed" and features["f1"]["assertions"] == ["VAL-001"]
    assert features["f2"]["loop_state"] == "idle" and features["f2"]["assertions"] == []
    assert features["f1"]["budget_left"] == 3


def _bulk_mission(
    owner, member, key: str, n_features: int, per_slice: int = 10, slices_per_milestone: int = 5
) -> Mission:
    mission = Mission.objects.create(key=key, title=key, owner=owner)
    mission.members.set([member])
    n_slices = -(-n_features // per_slice)
    n_milestones = -(-n_slices // slices_per_milestone)
    milestones = Milestone.objects.bulk_create(
        Milestone(mission=mission, key=f"m{i}", title=f"M{i}", order=i) for i in range(n_milestones)
    )
    slices = Slice.objects.bulk_create(
        Slice(mission=mission, milestone=milestones[i // slices_per_milestone], key=f"s{i}", title=f"S{i}", order=i)
        for i in range(n_slices)
    )
    features = MissionFeature.objects.bulk_create(
        MissionFeature(mission=mission, slice=slices[i // per_slice], key=f"f{i}", title=f"F{i}", order=i)
        for i in range(n_features)
    )
    assertions = ContractAssertion.objects.bulk_create(
        ContractAssertion(
            mission=mission,
            milestone=slices[i // per_slice].milestone,
            key=f"VAL-{i}",
            title="a",
            statement="s",
            order=i,
        )
        for i in range(n_features)
    )
    FeatureAssertion.objects.bulk_create(
        FeatureAssertion(feature=f, assertion=a) for f, a in zip(features, assertions, strict=True)
    )
    return mission


@pytest.mark.parametrize("role", ["member", "staff"])
def test_tree_query_count_does_not_grow_with_the_mission(
    request, api, owner, member, django_assert_max_num_queries, role
):
    small = _bulk_mission(owner, member, "small", 3)
    large = _bulk_mission(owner, member, "large", 300)
    client = api(request.getfixturevalue(role))
    used = {}
    for mission, n in ((small, 3), (large, 300)):
        with django_assert_max_num_queries(12), CaptureQueriesContext(connection) as queries:
            response = client.get(f"/api/missions/{mission.pk}/tree/")
        assert response.status_code == 200
        features = [f for m in response.json()["milestones"] for s in m["slices"] for f in s["features"]]
        assert len(features) == n and all(len(f["assertions"]) == 1 for f in features)
        used[n] = len(queries)
    assert 0 < used[3] == used[300], used


def test_tree_rollups_agree_with_the_validation_endpoint(api, staff, tree):
    client = api(staff)
    tree.a_unlinked.status = "failed"
    tree.a_unlinked.save()
    body = client.get(f"/api/missions/{tree.mission.pk}/tree/").json()
    for milestone in body["milestones"]:
        rollup = client.get(f"/api/milestones/{milestone['id']}/validation/").json()
        assert {k: v for k, v in rollup.items() if k != "milestone"} == milestone["rollup"]
    assert body["milestones"][0]["rollup"]["state"] == "failed"


# --------------------------------------------------------------------------- OpenAPI


def test_schema_and_docs(api, member, client):
    response = api(member).get("/api/schema/")
    assert response.status_code == 200
    text = response.content.decode()
    for path in (
        "/api/missions/{id}/tree/",
        "/api/features/{id}/link/",
        "/api/milestones/{id}/validation/",
        "/api/missions/import/",
        "/api/missions/{id}/export/",
    ):
        assert path in text, path
    assert api(None).get("/api/schema/").status_code == 401
    client.force_login(member)
    response = client.get("/api/docs/")
    assert response.status_code == 200 and b"swagger" in response.content.lower()


def test_schema_validates_without_warnings(tmp_path):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    schema = yaml.safe_load(target.read_text())
    assert schema["openapi"].startswith("3.") and "/api/missions/" in schema["paths"]


# --------------------------------------------------------------------------- mission files


def test_import_and_export_through_the_api(api, member, stranger, counts):
    client = api(member)
    response = client.post("/api/missions/import/", MISSION_FILE, content_type="application/yaml")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["key"] == "shop" and body["owner"] == member.pk and body["changed"] is True
    mission = Mission.objects.get(key="shop")
    assert mission.retry_budget == 2
    assert list(
        FeatureAssertion.objects.filter(feature__mission=mission)
        .order_by("assertion__key")
        .values_list("assertion__key", flat=True)
    ) == ["VAL-CART-001", "VAL-CART-002"]
    assert Milestone.objects.get(mission=mission, key="m1").validation_state == RollupState.READY

    response = client.get(f"/api/missions/{mission.pk}/export/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/yaml")
    exported = yaml.safe_load(response.content.decode())
    assert exported["mission"]["key"] == "shop"
    feature = exported["milestones"][0]["slices"][0]["features"][0]
    assert feature["key"] == "cart-total" and sorted(feature["assertions"]) == ["VAL-CART-001", "VAL-CART-002"]

    # re-importing what was exported changes nothing
    rows = counts()
    response = client.post("/api/missions/import/", response.content.decode(), content_type="application/yaml")
    assert response.status_code == 200, response.content
    assert response.json()["changed"] is False
    assert counts() == rows

    # someone else's mission: not exportable, and its key cannot be taken over by an import
    assert api(stranger).get(f"/api/missions/{mission.pk}/export/").status_code == 404
    response = api(stranger).post("/api/missions/import/", MISSION_FILE, content_type="application/yaml")
    assert response.status_code == 403 and response.json()["code"] == "mission_key_taken"
    assert counts() == rows


def test_import_refuses_bad_files_and_writes_nothing(api, member, counts):
    client = api(member)
    rows = counts()
    response = client.post("/api/missions/import/", "", content_type="application/yaml")
    assert response.status_code == 400 and response.json()["code"] == "invalid_mission_file"
    response = client.post("/api/missions/import/", "mission: [unclosed", content_type="application/yaml")
    assert response.status_code == 400 and response.json()["code"] == "invalid_mission_file"
    broken = MISSION_FILE.replace("[VAL-CART-001, VAL-CART-002]", "[VAL-CART-404]")
    response = client.post("/api/missions/import/", broken, content_type="application/yaml")
    assert response.status_code == 400 and response.json()["code"] == "invalid_mission_file"
    assert response.json()["fields"]
    # a check executes code on the host: staff only, through files as through the API
    with_check = MISSION_FILE.replace(
        'statement: "cart_total([]) == 0"}', 'statement: "cart_total([]) == 0", check: {run: "pytest -q"}}'
    )
    response = client.post("/api/missions/import/", with_check, content_type="application/yaml")
    assert response.status_code == 403 and response.json()["code"] == "staff_only"
    assert counts() == rows
    assert api(None).post("/api/missions/import/", MISSION_FILE, content_type="application/yaml").status_code == 401
    assert counts() == rows


def test_import_as_json(api, staff):
    document = yaml.safe_load(MISSION_FILE)
    response = api(staff).post("/api/missions/import/", document, format="json")
    assert response.status_code == 201, response.content
    assert Mission.objects.get(key="shop").owner == staff


# --------------------------------------------------------------------------- misc


def test_updated_at_moves_on_api_writes(api, member, tree):
    MissionFeature.objects.filter(pk=tree.f1.pk).update(updated_at=timezone.now() - timezone.timedelta(days=1))
    old = MissionFeature.objects.get(pk=tree.f1.pk).updated_at
    response = api(member).patch(f"/api/features/{tree.f1.pk}/", {"description": "more"}, format="json")
    assert response.status_code == 200
    assert MissionFeature.objects.get(pk=tree.f1.pk).updated_at > old


def test_the_completions_task_read_sees_what_visible_missions_sees(owner, member, staff, stranger, tree, other_tree):
    """The completion's prepared read of its task and `visible_missions` are one rule."""
    from django.contrib.auth.models import AnonymousUser

    from missions.selectors import visible_missions, visible_task_with_mission

    for user in (owner, member, staff, stranger, AnonymousUser(), None):
        for task in (tree.task, other_tree.task):
            expected = visible_missions(user=user).filter(pk=task.mission_id).exists()
            got = visible_task_with_mission(user=user, pk=str(task.pk))
            assert (got is not None) == expected, (user, task.mission.key)
            if got is not None:
                assert got.pk == task.pk and got.mission.key == task.mission.key
