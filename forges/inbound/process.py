"""The worker's side of a delivery: read its event, match it, record the outcome.

Idempotent: only a delivery still `received` is processed, and its outcome is written by a
compare-and-swap on that state, so a message delivered twice matches once (the completion
itself is idempotent for the same revision: `task_complete`).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from forges.inbound.matching import Outcome, outcome_of
from forges.inbound.parsing import event_of
from forges.models import Delivery, DeliveryState, Forge
from missions.locks import lock_mission
from missions.outbox import publish_on_commit

PROCESSED_EVENT = "forge-delivery:processed"


def delivery_process(*, delivery_id: int) -> str | None:
    """Process a received delivery; its new state, or None when there was nothing to do."""
    delivery = Delivery.objects.filter(pk=delivery_id).first()
    if delivery is None or delivery.state != DeliveryState.RECEIVED or delivery.mission_id is None:
        return None
    forge = Forge.objects.filter(mission_id=delivery.mission_id).first()
    if forge is None:
        outcome = Outcome(DeliveryState.IGNORED, "the mission follows no forge")
    else:
        event = event_of(provider=delivery.provider, event=delivery.event, payload=delivery.payload)
        outcome = outcome_of(forge=forge, event=event)
    return delivery.state if _finish(delivery, delivery.mission_id, outcome) else None


def _finish(delivery: Delivery, mission_id: int, outcome: Outcome) -> bool:
    fields = {
        "state": outcome.state,
        "reason": outcome.reason,
        "ref": outcome.ref,
        "head": outcome.head,
        "pull_number": outcome.pull_number,
        "task": outcome.task,
        "processed_at": timezone.now(),
    }
    with transaction.atomic():
        lock_mission(mission_id)
        if not Delivery.objects.filter(pk=delivery.pk, state=DeliveryState.RECEIVED).update(**fields):
            return False
        for name, value in fields.items():
            setattr(delivery, name, value)
        publish_on_commit(
            mission_id,
            PROCESSED_EVENT,
            {
                "delivery": delivery.pk,
                "provider": delivery.provider,
                "event": delivery.event,
                "state": outcome.state,
                "reason": outcome.reason,
                "task": outcome.task.pk if outcome.task is not None else None,
                "pull_number": outcome.pull_number,
            },
        )
    return True
