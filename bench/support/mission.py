"""The benchmarks' mission: one milestone, one slice, N features with two cheap checks each
(a regex over the feature's file of the generated repository, and `python -c "print('ok')"`),
and a task per feature, ready to be completed."""

from __future__ import annotations

import os
import time

CHECK_RUN = {"run": "python -c \"print('ok')\"", "expect_output": "ok"}


def build_mission(repository: str, n: int, name: str = "bench"):
    """(mission, tasks, API token of its staff owner); Django must be set up."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from missions.models import ContractAssertion, Milestone, Mission, MissionFeature, Slice
    from missions.services.tasks import task_create

    stamp = f"{name}-{int(time.time() * 1000)}-{os.getpid()}"
    user = get_user_model().objects.create_user(stamp, password=os.urandom(12).hex(), is_staff=True, is_superuser=True)
    token = Token.objects.create(user=user).key
    mission = Mission.objects.create(key=stamp, title=name, status="active", repository=repository, owner=user)
    milestone = Milestone.objects.create(mission=mission, key="m", title="m")
    slice_ = Slice(milestone=milestone, key="s", title="s")
    slice_.save()
    tasks = []
    for i in range(n):
        feature = MissionFeature(slice=slice_, key=f"f{i}", title=f"f{i}")
        feature.save()
        a1 = ContractAssertion(
            milestone=milestone,
            key=f"F{i}-FILE",
            title="file",
            statement="s",
            check_spec={"file": f"f{i}.txt", "contains": f"feature {i}"},
        )
        a2 = ContractAssertion(milestone=milestone, key=f"F{i}-RUN", title="run", statement="s", check_spec=CHECK_RUN)
        a1.save()
        a2.save()
        feature.assertions.add(a1, a2)
        tasks.append(task_create(user=user, feature=feature))
    return mission, tasks, token
