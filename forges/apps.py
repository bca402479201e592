from django.apps import AppConfig


class ForgesConfig(AppConfig):
    name = "forges"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Forges"

    def ready(self) -> None:
        from forges import receivers  # noqa: F401  (subscribes to the plan's hooks: missions/hooks.py)
        from forges.inbound import actors  # noqa: F401  (declares the actor that receive.py sends to by name)
