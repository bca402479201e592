"""`manage.py check` reports misconfigured validator profiles (errors) and agent keys
whose variable is not set in this environment (warnings: the workers may have it)."""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks

from fusion_site.runtime import sandbox
from validation.profiles import all_profiles, profile_problems, profile_warnings


@checks.register()
def validator_profiles(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for name, profile in all_profiles().items():
        for problem in profile_problems(name, profile):
            messages.append(checks.Error(problem, id="fusion.E001", hint="Fix FUSION_VALIDATORS."))
        if not profile_problems(name, profile):
            for warning in profile_warnings(name, profile):
                messages.append(
                    checks.Warning(
                        warning,
                        id="fusion.W001",
                        hint="Set it where the workers run; the key itself never goes in a profile.",
                    )
                )
    return messages


@checks.register(deploy=True)
def sandbox_in_use(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`manage.py check --deploy`: what the code under judgment runs in (docs/SANDBOX.md)."""
    current = sandbox.status()
    if current.confined:
        return []
    hint = "Install bubblewrap (Debian: apt install bubblewrap) and set FUSION_SANDBOX=required. See docs/SANDBOX.md."
    if current.mode == "required":
        return [
            checks.Error(
                f"FUSION_SANDBOX=required but no sandbox works here ({current.detail}): every run will end in error.",
                id="fusion.E010",
                hint=hint,
            )
        ]
    return [
        checks.Warning(
            f"checks run UNSANDBOXED ({current.detail}): the code under judgment can read and write everything "
            "the service's user can, its database and secret key included.",
            id="fusion.W010",
            hint=hint,
        )
    ]
