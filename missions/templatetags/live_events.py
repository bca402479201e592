"""The event catalogue in the page: the dashboard's script (`static/dashboard/live.js`)
subscribes to exactly the types of `missions.event_catalogue.EVENT_TYPES` (an EventSource needs
one listener per type), read from the JSON element this tag renders."""

from __future__ import annotations

from django import template
from django.utils.html import json_script
from django.utils.safestring import SafeString

from missions.event_catalogue import EVENT_TYPES

register = template.Library()


@register.simple_tag
def live_event_types() -> SafeString:
    return json_script(list(EVENT_TYPES), "live-event-types")
