"""Admin for what a mission answers on its forge (the outbox). Rows change only through
the delivery service: every field is read-only; "Send again now" arms refused or pending
rows (after a person fixed the token or the repository)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from forges.models import Outbox
from forges.services.delivery import outbox_retry


@admin.register(Outbox)
class OutboxAdmin(admin.ModelAdmin):
    list_display = ("key", "forge", "kind", "state", "attempts", "last_status", "next_attempt_at", "delivered_at")
    list_filter = ("state", "kind", "forge__provider")
    search_fields = ("key", "last_error", "forge__repository", "forge__mission__key")
    list_select_related = ("forge",)
    ordering = ("-id",)
    actions = ("send_again",)
    readonly_fields = (
        "forge",
        "kind",
        "key",
        "payload",
        "state",
        "version",
        "delivered_version",
        "attempts",
        "next_attempt_at",
        "last_status",
        "last_error",
        "delivered_at",
        "lease_until",
        "created_at",
        "updated_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Outbox | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Outbox | None = None) -> bool:
        return False

    @admin.action(description="Send again now (refused or pending rows)", permissions=["view"])
    def send_again(self, request: HttpRequest, queryset: QuerySet[Outbox]) -> None:
        armed = outbox_retry(outbox_ids=list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{armed} row(s) armed to be sent again.", messages.SUCCESS)
