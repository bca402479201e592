"""Deliveries a lost message left waiting: recorded `received` (the forge was answered
202) but never processed, because the process that was to send or run their message
died first (an embedded broker's queue is in memory). The recovery sweep sends them
again; processing is idempotent, so a delivery whose message was only slow is still
matched once."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from forges.inbound.receive import PROCESS_ACTOR
from forges.models import Delivery, DeliveryState
from fusion_site.runtime.queue import send_on_commit


def deliveries_redrive(*, grace_seconds: int | None = None) -> list[int]:
    """Send again every delivery still `received` after the grace (FUSION_REDRIVE_GRACE):
    the ids sent."""
    grace = settings.FUSION_REDRIVE_GRACE if grace_seconds is None else grace_seconds
    before = timezone.now() - timedelta(seconds=grace)
    waiting = list(
        Delivery.objects.filter(state=DeliveryState.RECEIVED, created_at__lte=before)
        .order_by("id")
        .values_list("pk", flat=True)
    )
    for delivery_id in waiting:
        send_on_commit(PROCESS_ACTOR, delivery_id)
    return waiting
