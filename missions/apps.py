from django.apps import AppConfig


class MissionsConfig(AppConfig):
    name = "missions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from missions import actors  # noqa: F401  (declares the actors that services send to by name)
