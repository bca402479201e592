from django.apps import AppConfig


class ForgesConfig(AppConfig):
    name = "forges"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Forges"

    def ready(self) -> None:
        from forges import (
            actors,  # noqa: F401  (declares the actors that services send to by name)
            receivers,  # noqa: F401  (subscribes to the verdicts' hooks: validation/hooks.py)
        )
