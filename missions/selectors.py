"""Reads. Every query that depends on who asks goes through `visible_missions`."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q, QuerySet

from missions.models import Mission


def visible_missions(*, user: AbstractBaseUser | AnonymousUser | None) -> QuerySet[Mission]:
    if user is None or not user.is_authenticated:
        return Mission.objects.none()
    if user.is_staff:
        return Mission.objects.all()
    return Mission.objects.filter(Q(owner=user) | Q(members=user)).distinct()


def visible_mission_ids(*, user) -> QuerySet:
    if user is not None and user.is_authenticated and user.is_staff:
        return Mission.objects.values("id")
    return visible_missions(user=user).values("id")


def can_see_mission(*, user, mission_id: int) -> bool:
    return visible_missions(user=user).filter(pk=mission_id).exists()
