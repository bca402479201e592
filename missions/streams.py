"""Who may read which event stream: `missions` for any signed-in user (it carries only
ids and states of missions they can see on reload), `mission-<id>` for those who may see
the mission."""

from __future__ import annotations

from django_eventstream.channelmanager import DefaultChannelManager

from missions.events import GLOBAL_CHANNEL
from missions.selectors import can_see_mission


class MissionChannelManager(DefaultChannelManager):
    def can_read_channel(self, user, channel: str) -> bool:
        if user is None or not user.is_authenticated:
            return False
        if channel == GLOBAL_CHANNEL:
            return True
        prefix, _, raw_id = channel.partition("-")
        if prefix != "mission" or not raw_id.isdigit():
            return False
        return can_see_mission(user=user, mission_id=int(raw_id))
