"""Admin for a mission's forge, the webhook deliveries it received and what it answers
(the outbox); staff only, as the whole admin. Deliveries and the outbox are a record:
nothing is edited or added here ("Send again now" arms refused or pending outbox rows,
after a person fixed the token or the repository). A forge's secret is never on a page:
the list and the form show it masked (the owner reads it from
`GET /api/missions/{id}/forge/`, and rotates it there)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from forges.models import Delivery, Forge, Outbox
from forges.services.delivery import outbox_retry
from missions.admin import TIMESTAMPS, admin_link, pretty_json


def masked(secret: str) -> str:
    return "•" * 8 if secret else "(the deployment's)"


@admin.register(Forge)
class ForgeAdmin(admin.ModelAdmin):
    list_display = ("mission", "provider", "repository", "api_url", "token_env", "secret_masked", "refusal")
    list_filter = ("provider",)
    search_fields = ("mission__key", "repository")
    exclude = ("secret",)
    readonly_fields = ("secret_masked", "refusal", *TIMESTAMPS)
    raw_id_fields = ("mission",)
    actions = ("use_deployment_secret",)

    @admin.action(description="Use the deployment's webhook secret (FUSION_FORGE_WEBHOOK_SECRET)")
    def use_deployment_secret(self, request: Any, queryset: Any) -> None:
        # The forge's own secret goes; rotating it (the API) makes a new one.
        count = queryset.update(secret="")
        self.message_user(request, f"{count} forge(s) now use the deployment's secret.")

    def formfield_for_dbfield(self, db_field: Any, request: Any, **kwargs: Any) -> Any:
        if isinstance(db_field, models.URLField):
            kwargs["assume_scheme"] = "https"  # an API root typed without its scheme
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    @admin.display(description="secret")
    def secret_masked(self, obj: Forge) -> str:
        return masked(obj.secret)


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("id", "mission", "provider", "event", "state", "reason", "delivery_id", "created_at")
    list_filter = ("state", "provider")
    search_fields = ("mission__key", "delivery_id", "event", "reason")
    exclude = ("payload",)
    readonly_fields = (
        "mission",
        "provider",
        "delivery_id",
        "event",
        "state",
        "reason",
        "ref",
        "head",
        "pull_number",
        "task_link",
        "payload_json",
        "processed_at",
        *TIMESTAMPS,
    )

    @admin.display(description="task")
    def task_link(self, obj: Delivery) -> str:
        return admin_link(obj.task)

    @admin.display(description="payload")
    def payload_json(self, obj: Delivery) -> str:
        return pretty_json(obj.payload)

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


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
