"""The transport side of live events (docs/DASHBOARD.md, "Streams for programs"):

- `auth`: who a stream request is (session, or `Authorization: Token` for programs) and
  which channels they may read;
- `layer`: the in-memory Channels layer of the embedded configuration, safe to publish
  to from any thread;
- `views`: the SSE view and the bookkeeping of its open streams (ending them when access
  is revoked, re-checking access while they are open).

`missions.outbox` publishes, `missions.access` announces revocations; neither imports this package
(the SSE streams subscribe to its `access_revoked` signal). The names below are the ones
settings, URLs and other modules use by their old paths (`missions.streams.X`). Patch
tunables such as `KEEP_ALIVE_SECONDS` on `missions.streams.views`, where they are read.
"""

from missions.streams.auth import (
    MAX_CHANNELS,
    EventsTokenMiddleware,
    MissionChannelManager,
    authorization_token,
    channel_mission_id,
    token_user,
    user_channels,
)
from missions.streams.layer import InMemoryChannelLayer
from missions.streams.views import _Sent, _take, events, kick_listeners

__all__ = [
    "MAX_CHANNELS",
    "EventsTokenMiddleware",
    "InMemoryChannelLayer",
    "MissionChannelManager",
    "_Sent",
    "_take",
    "authorization_token",
    "channel_mission_id",
    "events",
    "kick_listeners",
    "token_user",
    "user_channels",
]
