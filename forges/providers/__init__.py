"""The forges' HTTP APIs, one adapter per provider (docs/FORGES.md, "Statuses and comments out").

An adapter only shapes requests (`ForgeRequest`) and reads what the forge answered
(`created_id`); `forges/providers/http.py` sends them. `ADAPTERS` names each provider's;
a provider without one (`generic`) answers nothing.
"""

from __future__ import annotations

from forges.providers.base import Adapter, ForgeRequest, StatusPost
from forges.providers.gitea import Gitea
from forges.providers.github import GitHub
from forges.providers.gitlab import GitLab

ADAPTERS: dict[str, Adapter] = {"github": GitHub(), "gitlab": GitLab(), "gitea": Gitea()}


def adapter_for(provider: str) -> Adapter | None:
    return ADAPTERS.get(provider)


__all__ = ["ADAPTERS", "Adapter", "ForgeRequest", "StatusPost", "adapter_for"]
