from django.apps import AppConfig


class ForgesConfig(AppConfig):
    name = "forges"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Forges"

    def ready(self) -> None:
        from forges import (
            actors,  # noqa: F401  (declares the outbox's actor, sent to by name)
            receivers,  # noqa: F401  (subscribes to missions/hooks.py and validation/hooks.py)
        )
        from forges.inbound import actors as inbound_actors  # noqa: F401  (the deliveries' actor)
