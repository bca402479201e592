"""Staff read the outbox in the admin (every field read-only) and send refused rows again
once the cause is fixed."""

from __future__ import annotations

import pytest
from django.urls import reverse

from forges.models import Outbox, OutboxKind, OutboxState

pytestmark = pytest.mark.django_db


def test_staff_read_the_outbox_and_send_a_refused_row_again(admin_client, forge_mission, fake_forge):
    forge = forge_mission()
    row = Outbox.objects.create(
        forge=forge,
        kind=OutboxKind.STATUS,
        key="status:" + "b" * 40 + ":success",
        payload={"sha": "b" * 40, "state": "success", "description": "2/2 assertions passed"},
        state=OutboxState.REFUSED,
        last_status=401,
        last_error="HTTP 401: Bad credentials",
    )
    listing = admin_client.get(reverse("admin:forges_outbox_changelist"))
    assert listing.status_code == 200 and row.key in listing.content.decode()
    page = admin_client.get(reverse("admin:forges_outbox_change", args=[row.pk]))
    assert page.status_code == 200 and "Bad credentials" in page.content.decode()
    assert admin_client.get(reverse("admin:forges_outbox_add")).status_code == 403
    answer = admin_client.post(
        reverse("admin:forges_outbox_changelist"), {"action": "send_again", "_selected_action": [row.pk]}
    )
    assert answer.status_code == 302
    row.refresh_from_db()
    assert row.state == OutboxState.PENDING and row.next_attempt_at is not None
