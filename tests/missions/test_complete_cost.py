"""What one completion through the API costs in statements (docs/BENCHMARKS.md, "Loop throughput"):
the token; the task with its mission, read once under the visibility check (the service
does not read it again before the git work); in the transaction the locked read and the
writes; nothing for the answer."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from missions.models import LoopState, MissionFeature


@pytest.mark.parametrize("role", ["member", "staff"])
def test_a_completion_reads_the_task_twice_and_no_more(request, tree, idle_broker, django_assert_max_num_queries, role):
    # As in the loop: the task's feature is implementing already (task_create moved it).
    MissionFeature.objects.filter(pk=tree.f1.pk).update(loop_state=LoopState.IMPLEMENTING)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=request.getfixturevalue(role)).key}")
    # 8 on SQLite and on PostgreSQL, measured (9 while the service read the task again).
    with django_assert_max_num_queries(8), CaptureQueriesContext(connection) as queries:
        response = client.post(f"/api/tasks/{tree.task.pk}/complete/", {"revision": "c" * 40}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "done" and response.json()["revision"] == "c" * 40
    task_reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('SELECT "missions_task"')]
    assert len(task_reads) == 2, task_reads  # the visible one, then the locked one
