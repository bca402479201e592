"""The mission tree under concurrent writes: its reads are separate statements, and a row
written between two of them must not break it (`missions/api/tree.py`)."""

from __future__ import annotations

import pytest

from missions.models import ContractAssertion, FeatureAssertion

pytestmark = pytest.mark.django_db


def _features(tree: dict) -> dict[str, list[str]]:
    return {f["key"]: f["assertions"] for m in tree["milestones"] for sl in m["slices"] for f in sl["features"]}


def test_an_assertion_linked_between_the_reads_is_left_out_until_the_next_read(api, owner, tree, monkeypatch):
    reads = FeatureAssertion.objects.filter
    interleaved: list[ContractAssertion] = []

    def links_after_a_new_assertion(*args, **kwargs):
        # The assertions are read; another writer adds one, linked to f2, before the links are.
        if not interleaved:
            new = ContractAssertion(milestone=tree.milestone, key="VAL-003", title="New", statement="s", order=4)
            new.save()
            interleaved.append(new)
            FeatureAssertion.objects.bulk_create([FeatureAssertion(feature=tree.f2, assertion=new)])
        return reads(*args, **kwargs)

    monkeypatch.setattr(FeatureAssertion.objects, "filter", links_after_a_new_assertion)
    response = api(owner).get(f"/api/missions/{tree.mission.pk}/tree/")

    assert interleaved, "the write did not happen between the reads"
    assert response.status_code == 200, response.content
    body = response.json()
    m1 = body["milestones"][0]
    # One coherent view, the first read's: the new assertion is nowhere, its link neither.
    assert m1["assertions"] == ["VAL-001", "VAL-002", "VAL-M01"]
    assert _features(body) == {"f1": ["VAL-001"], "f2": []}
    assert (m1["rollup"]["total"], m1["rollup"]["unlinked"]) == (3, 1)

    monkeypatch.undo()
    again = api(owner).get(f"/api/missions/{tree.mission.pk}/tree/").json()
    assert again["milestones"][0]["assertions"] == ["VAL-001", "VAL-002", "VAL-M01", "VAL-003"]
    assert _features(again) == {"f1": ["VAL-001"], "f2": ["VAL-003"]}
    assert again["milestones"][0]["rollup"]["total"] == 4
