"""What the operator commands (`mission`, `task`, `repair_feature`) share: finding the
objects they are given, the user they act as (or who owns what `import_mission` and `demo`
import), and one set of exit codes.

Exit codes: 0 done; 1 refused by the rules (the object is in a state that does not allow
it, or the input is invalid — the message says why); 2 unknown object or user, or bad
arguments (as argparse itself answers usage errors).
"""

from __future__ import annotations

from typing import TypeVar

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from missions.errors import DomainError
from missions.models import Milestone, Mission, MissionFeature, Task

_Keyed = TypeVar("_Keyed", Milestone, MissionFeature)

REFUSED = 1
NOT_FOUND = 2


def not_found(message: str) -> CommandError:
    return CommandError(message, returncode=NOT_FOUND)


def refused(exc: DomainError, prefix: str = "") -> CommandError:
    return CommandError(f"{prefix}{exc.detail} [{exc.code}]", returncode=REFUSED)


def find_mission(ref: str) -> Mission:
    mission = Mission.objects.filter(key=ref).first()
    if mission is None and ref.isascii() and ref.isdigit():
        mission = Mission.objects.filter(pk=int(ref)).first()
    if mission is None:
        raise not_found(f"no mission with key or id {ref!r}")
    return mission


def find_task(ref: str) -> Task:
    task = None
    if ref.isascii() and ref.isdigit():
        task = Task.objects.select_related("mission", "feature").filter(pk=int(ref)).first()
    if task is None:
        raise not_found(f"no task with id {ref!r}")
    return task


def _by_ref(model: type[_Keyed], noun: str, ref: str, mission: str | None = None) -> _Keyed:
    """An object of the plan by id, key or MISSION/KEY (`mission`: a mission key it must
    be in); CommandError when there is none or the key is ambiguous."""
    qs = model._default_manager.select_related("mission")
    if mission:
        qs = qs.filter(mission__key=mission)
    if ref.isdigit():
        found = qs.filter(pk=int(ref)).first()
    else:
        mission_key, _, key = ref.rpartition("/")
        qs = qs.filter(key=key)
        if mission_key:
            qs = qs.filter(mission__key=mission_key)
        if qs.count() > 1:
            raise CommandError(
                f"{noun} key {key!r} is used in several missions; write MISSION/{noun.upper()} or give --mission"
            )
        found = qs.first()
    if found is None:
        raise CommandError(f"no {noun} {ref!r} (give an id, a key or MISSION/KEY)")
    return found


def feature_by_ref(ref: str) -> MissionFeature:
    """A feature by id, key or MISSION/KEY; CommandError when there is none or the key is ambiguous."""
    return _by_ref(MissionFeature, "feature", ref)


def find_milestone(ref: str, mission: str | None = None) -> Milestone:
    """A milestone by id, key or MISSION/KEY, in the mission of key `mission` when given."""
    try:
        return _by_ref(Milestone, "milestone", ref, mission)
    except CommandError as exc:
        raise not_found(str(exc)) from exc


def find_feature(ref: str):
    try:
        return feature_by_ref(ref)
    except CommandError as exc:
        raise not_found(str(exc)) from exc


def find_user(username: str | None):
    """The user an operator command acts as (named in the audit log); None = the command line."""
    if not username:
        return None
    User = get_user_model()
    user = User.objects.filter(**{User.USERNAME_FIELD: username}).first()
    if user is None:
        raise not_found(f"no user {username!r}")
    return user


def add_user_argument(parser) -> None:
    parser.add_argument(
        "--user", dest="username", default=None, help="act as this user (named in the mission's audit log)"
    )


def add_owner_argument(parser) -> None:
    """`--owner USERNAME` of the commands that import a mission (`import_mission`, `demo`)."""
    parser.add_argument(
        "--owner",
        default=None,
        metavar="USERNAME",
        help="the user who owns the mission: it sees the mission as if it had imported it through the API",
    )
