"""Who a stream request is, and which channels they may read (docs/DASHBOARD.md, "Streams for
programs").

- Sign-in: browsers use their session; programs send `Authorization: Token <key>` (a DRF
  token), read by `EventsTokenMiddleware` for SSE and by `missions.consumers` for the
  WebSocket. A bad token is an anonymous user, never a fall-back to another credential.
- Channels (django-eventstream): `mission-<id>` for anyone who may see the mission
  (`can_see_mission`); `missions` (the list feed) for staff only — it carries every
  mission's ids, states and reasons. A signed-in non-staff user who asks for
  `/events/missions/` is given the channels of their own missions instead (at most
  `MAX_CHANNELS`, the most recently active), so their list is live without seeing anyone
  else's events.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.utils.functional import SimpleLazyObject
from django_eventstream.channelmanager import DefaultChannelManager
from rest_framework.authtoken.models import Token

from missions.delivery import GLOBAL_CHANNEL, mission_channel
from missions.selectors import can_see_mission, visible_missions

# django-eventstream refuses a request for more than 10 channels.
MAX_CHANNELS = 10


# --- sign-in ---------------------------------------------------------------------------


def token_user(key: str):
    """The active user a DRF token names, or an anonymous user (a bad token never falls
    back to another credential)."""
    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return AnonymousUser()
    return token.user


def authorization_token(header: str | bytes | None) -> str | None:
    """`Authorization: Token <key>` -> key."""
    if not header:
        return None
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != "token":
        return None
    return key.strip() or None


class EventsTokenMiddleware:
    """Lets programs read the SSE streams with `Authorization: Token <key>` (browsers
    use their session). Only GET requests under /events/ are affected: a token never
    signs in a request that could change something, so CSRF stays intact."""

    prefix = "/events/"

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "GET" and request.path.startswith(self.prefix):
            key = authorization_token(request.META.get("HTTP_AUTHORIZATION"))
            if key is not None:
                # Lazy: resolved where the stream reads the database (see `views._db`).
                request.user = SimpleLazyObject(lambda: token_user(key))
        return self.get_response(request)


# --- which channels ----------------------------------------------------------------------


def user_channels(user) -> set[str]:
    """The channels that stand for `/events/missions/` for this user."""
    if user is None or not user.is_authenticated or user.is_staff:
        return {GLOBAL_CHANNEL}
    ids = list(visible_missions(user=user).order_by("-updated_at").values_list("pk", flat=True)[:MAX_CHANNELS])
    # No mission yet: ask for the global channel, which is refused (stream-error forbidden).
    return {mission_channel(pk) for pk in ids} or {GLOBAL_CHANNEL}


class MissionChannelManager(DefaultChannelManager):
    def get_channels_for_request(self, request, view_kwargs):
        channels = super().get_channels_for_request(request, view_kwargs)
        if channels == {GLOBAL_CHANNEL}:
            return user_channels(getattr(request, "user", None))
        return channels

    def can_read_channel(self, user, channel: str) -> bool:
        if user is None or not user.is_authenticated:
            return False
        if channel == GLOBAL_CHANNEL:
            return bool(user.is_staff)
        mission_id = channel_mission_id(channel)
        return mission_id is not None and can_see_mission(user=user, mission_id=mission_id)


def channel_mission_id(channel: str) -> int | None:
    """The mission of a `mission-<id>` channel; None for any other channel."""
    prefix, _, raw_id = channel.partition("-")
    return int(raw_id) if prefix == "mission" and raw_id.isdigit() else None


def still_allowed(user_id, channels) -> bool:
    """Whether the user may still read every channel of an open stream, in two queries
    (the same rule as `MissionChannelManager.can_read_channel`, for many channels)."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first() if user_id != "anonymous" else None
    if user is None:
        return False
    if user.is_staff:
        return True
    found = {channel_mission_id(c) for c in channels}
    ids = {i for i in found if i is not None}
    if len(ids) != len(found):
        return False  # the global channel (staff only), or a channel that is not a mission's
    return visible_missions(user=user).filter(pk__in=ids).count() == len(ids)
