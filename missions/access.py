"""Who sees a mission by name (`audience`), and ending the live streams of those who lose
access (`revoke_on_commit`) once the change that took it away has committed."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import transaction
from django.dispatch import Signal

from missions.delivery import group_name, mission_channel
from missions.models import Mission

logger = logging.getLogger(__name__)

# Sent after commit with `mission_id`, `channel` (the mission's) and `user_ids` (who lost
# access). The SSE streams of this process subscribe (`missions.streams.views`): this
# module stays below the transport and imports nothing of it.
access_revoked = Signal()


def audience(mission_id: int) -> set[int]:
    """The ids of the users who see a mission by name (its owner and members; staff see
    every mission and never lose access by a membership change)."""
    owner, members = (
        Mission.objects.filter(pk=mission_id).values_list("owner_id", flat=True).first(),
        set(Mission.members.through.objects.filter(mission_id=mission_id).values_list("user_id", flat=True)),
    )
    return members | ({owner} if owner is not None else set())


def revoke_on_commit(mission_id: int, user_ids: set[int]) -> None:
    """After commit, end the live streams of those of `user_ids` who may no longer see
    the mission: SSE streams of this process at once, through `access_revoked` (those of other processes when they
    re-check access, every KEEP_ALIVE_SECONDS), WebSocket connections of every process
    through the mission's Channels group (close code 4403)."""
    if user_ids:
        transaction.on_commit(lambda: _revoke(mission_id, set(user_ids)))


def _revoke(mission_id: int, user_ids: set[int]) -> None:
    # Runs after commit: a failure here must not turn the committed change into an error
    # (nor skip the callbacks after it). The streams' periodic re-check remains.
    try:
        _revoke_now(mission_id, user_ids)
    except Exception:  # noqa: BLE001
        logger.exception("revoking the live streams of mission %s failed", mission_id)


def _revoke_now(mission_id: int, user_ids: set[int]) -> None:
    staff = set(get_user_model().objects.filter(pk__in=user_ids, is_staff=True).values_list("pk", flat=True))
    revoked = user_ids - audience(mission_id) - staff  # whoever was given access back meanwhile keeps it
    if not revoked:
        return
    for receiver, result in access_revoked.send_robust(
        sender=None, mission_id=mission_id, channel=mission_channel(mission_id), user_ids=revoked
    ):
        if isinstance(result, Exception):  # the WebSocket connections below are closed all the same
            logger.error("ending the SSE streams of mission %s failed (%s)", mission_id, receiver, exc_info=result)
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group_name(mission_id), {"type": "mission.access", "revoked": sorted(revoked)})
