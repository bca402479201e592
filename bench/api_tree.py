"""Benchmark: `GET /api/missions/{id}/tree/` for a mission of 100 and of 5,000 features.

Run:  .venv/bin/python bench/api_tree.py

Uses its own SQLite database in a temporary FUSION_DATA_DIR (migrated here), or the
PostgreSQL database named by DATABASE_URL (already migrated; the missions and the user
made here have unique keys and are deleted at the end). The small mission is the
baseline measured in the same run: the tree answers in a constant number of queries,
so with 50x the data the time should grow about linearly (serialization), never worse.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA_DIR = tempfile.mkdtemp(prefix="fusion-bench-")
os.environ["FUSION_DATA_DIR"] = DATA_DIR  # before settings are read: its own SQLite file
os.environ["DJANGO_SETTINGS_MODULE"] = "fusion_site.settings"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from missions.models import ContractAssertion, FeatureAssertion, Milestone, Mission, MissionFeature, Slice  # noqa: E402

FEATURES_PER_SLICE = 10
SLICES_PER_MILESTONE = 5
SIZES = ((100, 30), (5000, 10))  # (features, requests measured)


def build_mission(key: str, n_features: int) -> Mission:
    """Milestones -> slices -> features with 1 or 2 linked assertions each, in bulk."""
    with transaction.atomic():
        mission = Mission.objects.create(key=key, title=f"Bench {n_features}")
        n_slices = -(-n_features // FEATURES_PER_SLICE)
        n_milestones = -(-n_slices // SLICES_PER_MILESTONE)
        milestones = Milestone.objects.bulk_create(
            Milestone(mission=mission, key=f"m{i}", title=f"Milestone {i}", order=i) for i in range(n_milestones)
        )
        slices = Slice.objects.bulk_create(
            Slice(
                mission=mission,
                milestone=milestones[i // SLICES_PER_MILESTONE],
                key=f"s{i}",
                title=f"Slice {i}",
                order=i,
            )
            for i in range(n_slices)
        )
        features = MissionFeature.objects.bulk_create(
            MissionFeature(
                mission=mission,
                slice=slices[i // FEATURES_PER_SLICE],
                key=f"f{i}",
                title=f"Feature {i}",
                description="x" * 200,
                order=i,
            )
            for i in range(n_features)
        )
        assertions, owners = [], []
        for i, feature in enumerate(features):
            for j in range(1 + i % 2):  # alternately one and two assertions per feature
                milestone = milestones[(i // FEATURES_PER_SLICE) // SLICES_PER_MILESTONE]
                assertions.append(
                    ContractAssertion(
                        mission=mission,
                        milestone=milestone,
                        key=f"VAL-{i}-{j}",
                        title=f"Assertion {i}.{j}",
                        statement=f"feature {i} satisfies property {j}",
                        order=len(assertions),
                    )
                )
                owners.append(feature)
        assertions = ContractAssertion.objects.bulk_create(assertions, batch_size=500)
        FeatureAssertion.objects.bulk_create(
            (FeatureAssertion(feature=f, assertion=a) for f, a in zip(owners, assertions, strict=True)), batch_size=500
        )
    return mission


def measure(client: Client, mission: Mission, n_requests: int) -> dict:
    url = f"/api/missions/{mission.pk}/tree/"
    warm = client.get(url)  # first request: caches, connection
    assert warm.status_code == 200, warm.content[:300]
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    n_queries = len(queries)  # now: every request_started resets the connection's query log
    times = []
    for _ in range(n_requests):
        start = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200
    body = response.json()
    n_features = sum(len(s["features"]) for m in body["milestones"] for s in m["slices"])
    return {
        "features": n_features,
        "median_ms": statistics.median(times),
        "queries": n_queries,
        "bytes": len(response.content),
        "requests": n_requests,
    }


def _pending_migrations() -> bool:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    return bool(executor.migration_plan(executor.loader.graph.leaf_nodes()))


def main() -> int:
    if connection.vendor == "sqlite":
        call_command("migrate", verbosity=0)
    elif _pending_migrations():
        print(
            "bench/api_tree.py: the database of DATABASE_URL has unapplied migrations; "
            "run `manage.py migrate` first (a benchmark does not change a schema it does not own)",
            file=sys.stderr,
        )
        return 2
    tag = uuid.uuid4().hex[:10]
    user = get_user_model().objects.create_user(f"bench-staff-{tag}", is_staff=True)
    missions: list[Mission] = []
    try:
        client = Client()
        client.force_login(user)
        results = []
        for n_features, n_requests in SIZES:
            started = time.perf_counter()
            mission = build_mission(f"bench-tree-{tag}-{n_features}", n_features)
            missions.append(mission)
            built_s = time.perf_counter() - started
            row = measure(client, mission, n_requests)
            assert row["features"] == n_features and row["queries"] > 0, row
            row["build_s"] = built_s
            results.append(row)

        print(f"GET /api/missions/{{id}}/tree/  database={connection.vendor}  (median of N requests, staff user)")
        print(
            f"{'features':>9} {'N':>4} {'median ms':>10} {'queries':>8} {'ms/1k features':>15} {'KiB':>8} {'build s':>8}"
        )
        for r in results:
            print(
                f"{r['features']:>9} {r['requests']:>4} {r['median_ms']:>10.1f} {r['queries']:>8} "
                f"{r['median_ms'] / r['features'] * 1000:>15.1f} {r['bytes'] / 1024:>8.0f} {r['build_s']:>8.1f}"
            )
        small, large = results
        print(f"ratio_time_large_over_small={large['median_ms'] / small['median_ms']:.1f}")
        print(f"data_ratio={large['features'] // small['features']}")
        print(f"queries_small={small['queries']} queries_large={large['queries']}")
        return 0
    finally:
        for mission in missions:
            mission.delete()
        user.delete()
        connection.close()
        shutil.rmtree(DATA_DIR, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
