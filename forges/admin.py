"""Admin for a mission's forge and the webhook deliveries it received (staff only, as
the whole admin). Deliveries are a record: nothing is edited or added here. A forge's
secret is never on a page: the list and the form show it masked (the owner reads it
from `GET /api/missions/{id}/forge/`, and rotates it there)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models

from forges.models import Delivery, Forge
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
