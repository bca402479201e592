"""WebSocket stream of a mission's live events: the same JSON as SSE, with the event id.

Refuses (close code 4403) anyone who may not see the mission, signed-in or not.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from missions.events import group_name
from missions.selectors import can_see_mission

FORBIDDEN = 4403


class MissionConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.mission_id = int(self.scope["url_route"]["kwargs"]["mission_id"])
        user = self.scope.get("user")
        allowed = await database_sync_to_async(can_see_mission)(user=user, mission_id=self.mission_id)
        if not allowed:
            await self.close(code=FORBIDDEN)
            return
        self.group = group_name(self.mission_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def mission_event(self, message: dict) -> None:
        await self.send_json({"id": message["id"], "event": message["event"], "data": message["data"]})
