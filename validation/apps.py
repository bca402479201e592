from django.apps import AppConfig


class ValidationConfig(AppConfig):
    name = "validation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from validation import (
            actors,  # noqa: F401  (declares the actors that services send to by name)
            receivers,  # noqa: F401  (subscribes to the plan's hooks: missions/hooks.py)
            system_checks,  # noqa: F401  (registers Django's system checks of the profiles)
        )
