"""The security matrix of the command line: whoever has the shell has the database, so
every command runs trusted like staff for every role and `--user` only names the actor in
the audit log; an unknown user changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from missions.models import (
    Milestone,
    Mission,
    MissionEvent,
    MissionFeature,
    Task,
)
from tests.reliability.conftest import ROLES, mission_rows, user_of

pytestmark = pytest.mark.django_db


@dataclass
class Cli:
    name: str
    args: Callable[[Any], list[str]]
    effect: Callable[[Any], bool] = field(default=lambda w: True)


CLI = [
    Cli(
        "mission pause",
        lambda w: ["mission", "pause", w.mission.key],
        lambda w: Mission.objects.get(pk=w.mission.pk).status == "paused",
    ),
    Cli(
        "mission autopilot-on",
        lambda w: ["mission", "autopilot-on", w.mission.key],
        lambda w: Mission.objects.get(pk=w.mission.pk).autopilot,
    ),
    Cli("mission status", lambda w: ["mission", "status", w.mission.key]),
    Cli(
        "task start",
        lambda w: ["task", "start", str(w.t2.pk)],
        lambda w: Task.objects.get(pk=w.t2.pk).status == "in_progress",
    ),
    Cli(
        "task fail",
        lambda w: ["task", "fail", str(w.t2.pk), "--reason", "cli"],
        lambda w: Task.objects.get(pk=w.t2.pk).status == "failed",
    ),
    Cli(
        "validate_milestone",
        lambda w: ["validate_milestone", f"{w.mission.key}/m2"],
        lambda w: Milestone.objects.get(pk=w.m2.pk).status == "complete",
    ),
    Cli(
        "repair_feature clear",
        lambda w: ["repair_feature", str(w.f1.pk), "--mode", "clear", "--reason", "cli"],
        lambda w: MissionFeature.objects.get(pk=w.f1.pk).loop_state == "implementing",
    ),
]


def _actor_of_last_event(w) -> int | None:
    return MissionEvent.objects.filter(mission=w.mission).order_by("-seq").values_list("actor_id", flat=True).first()


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("cli", CLI, ids=[c.name for c in CLI])
def test_cli_matrix(cli, role, users, world, tmp_path):
    """The CLI runs with the server's own credentials (whoever has the shell has the
    database): it is trusted like staff for every role, and `--user` only names the actor
    in the audit log. An unknown user is exit code 2 and changes nothing."""
    w = world
    user = user_of(users, role)
    args = cli.args(w) + (["--user", user.username] if user is not None else [])
    events_before = MissionEvent.objects.filter(mission=w.mission).count()
    with open(tmp_path / "out", "w") as out:
        call_command(*args, stdout=out, stderr=out)
    assert cli.effect(w)
    if MissionEvent.objects.filter(mission=w.mission).count() > events_before:
        assert _actor_of_last_event(w) == (user.pk if user else None)


@pytest.mark.parametrize("cli", CLI, ids=[c.name for c in CLI])
def test_cli_with_an_unknown_user_changes_nothing(cli, world, tmp_path):
    before = mission_rows(world.mission.pk)
    with pytest.raises(CommandError) as info, open(tmp_path / "out", "w") as out:
        call_command(*cli.args(world), "--user", "nobody-like-this", stdout=out, stderr=out)
    assert info.value.returncode == 2
    assert mission_rows(world.mission.pk) == before
