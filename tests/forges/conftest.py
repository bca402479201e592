"""Fixtures of the forge tests (docs/FORGES.md): a real `git daemon` serving the mission's
repository (tests/gitserver.py, through the repository tests' fixtures), missions that
follow it on a forge, and a forge's webhook requests, signed as each provider signs them."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from typing import Any

import pytest

from forges.inbound.process import delivery_process
from forges.models import Delivery, Forge, PullRequest
from missions.models import Mission, MissionFeature, Task
from tests.repos.conftest import _repo_cache, daemon, served, url_mission  # noqa: F401 — fixtures by name
from tests.support.forge import fake_forge  # noqa: F401 — fixture
from tests.validation.conftest import build_mission  # noqa: F401 — fixture

_ids = itertools.count(1)


def follow(mission: Mission, provider: str = "github", **fields: Any) -> Forge:
    return Forge.objects.create(mission=mission, provider=provider, **fields)


def hex_signature(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signed_headers(provider: str, secret: str | None, body: bytes, event: str, delivery: str) -> dict[str, str]:
    """The headers a forge sends with `body`: its event, its delivery id and its proof of
    `secret` (none when `secret` is None)."""
    if provider == "github" or provider == "generic":
        headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery} if provider == "github" else {}
        if secret is not None:
            headers["X-Hub-Signature-256"] = "sha256=" + hex_signature(secret, body)
    elif provider == "gitea":
        headers = {"X-Gitea-Event": event, "X-Gitea-Delivery": delivery}
        if secret is not None:
            headers["X-Gitea-Signature"] = hex_signature(secret, body)
    else:
        headers = {"X-Gitlab-Event": event, "X-Gitlab-Event-UUID": delivery}
        if secret is not None:
            headers["X-Gitlab-Token"] = secret
    return headers


def hook(
    client,
    mission: Mission,
    payload: dict[str, Any],
    *,
    provider: str = "github",
    event: str = "push",
    secret: str | None = "",
    delivery: str | None = None,
    body: bytes | None = None,
):
    """POST a webhook to the mission's hook. `secret` "" (the default) signs with the
    mission's own; None sends no signature."""
    if secret == "":
        secret = Forge.objects.get(mission=mission).secret
    delivery = delivery or f"d-{next(_ids)}"
    if provider == "generic":
        payload = {"event": event, "delivery": delivery, **payload}
    body = json.dumps(payload).encode() if body is None else body
    headers = signed_headers(provider, secret, body, event, delivery)
    return client.post(f"/hooks/{provider}/{mission.key}/", data=body, content_type="application/json", headers=headers)


def push_payload(ref: str, after: str, before: str = "0" * 40) -> dict[str, Any]:
    return {"ref": ref, "before": before, "after": after, "repository": {"full_name": "acme/shop"}}


def github_pr(number: int, branch: str, title: str, head: str, action: str = "opened", **extra: Any) -> dict:
    return {
        "action": action,
        "number": number,
        "pull_request": {
            "number": number,
            "title": title,
            "html_url": f"https://github.com/acme/shop/pull/{number}",
            "head": {"ref": branch, "sha": head},
            "base": {"ref": "main"},
        },
        **extra,
    }


def gitlab_mr(iid: int, branch: str, title: str, head: str, action: str = "open", oldrev: str | None = None) -> dict:
    attrs = {
        "iid": iid,
        "title": title,
        "source_branch": branch,
        "action": action,
        "url": f"https://gitlab.example.com/acme/shop/-/merge_requests/{iid}",
        "last_commit": {"id": head},
    }
    if oldrev:
        attrs["oldrev"] = oldrev
    return {"object_kind": "merge_request", "object_attributes": attrs}


def processed(answer) -> Delivery:
    """The worker's step, run here: the delivery the answer names, processed."""
    delivery_id = answer.json()["delivery"]
    delivery_process(delivery_id=delivery_id)
    return Delivery.objects.get(pk=delivery_id)


def tasks_of(mission: Mission, key: str) -> list[Task]:
    return list(Task.objects.filter(mission=mission, feature__key=key).order_by("id"))


@pytest.fixture
def shop(served, alice):
    """An active mission over the served repository (features f1, f2, fix-login) that
    follows it on GitHub."""
    mission = url_mission(alice, served.url, ("f1", "f2", "fix-login"))
    follow(mission, "github")
    return mission


GREETING = {"file": "hello.py", "contains": r"def hello\("}
POLITE = {"file": "hello.py", "contains": "please"}
GOOD = {"hello.py": "def hello():\n    return 'hi, please'\n"}
RUDE = {"hello.py": "def hello():\n    return 'hi'\n"}
BAD = {"hello.py": "def goodbye():\n    pass\n"}


@pytest.fixture
def forge_mission(build_mission, fake_forge):  # noqa: F811 — the fixtures imported above
    """A mission with one feature `hello` (assertions GREET and POLITE, checked on files)
    following `acme/shop` on the local forge as `provider`."""

    def build(*, provider: str = "github", auto_fix: bool = False, **forge_fields) -> Forge:
        mission = build_mission({"hello": [("GREET", GREETING), ("POLITE", POLITE)]}, auto_fix=auto_fix)
        fields = {"api_url": fake_forge.api_url(provider), "repository": "acme/shop", **forge_fields}
        return Forge.objects.create(mission=mission, provider=provider, **fields)

    return build


def follow_pull(forge: Forge, number: int = 7, *, head: str = "") -> PullRequest:
    feature = MissionFeature.objects.get(mission=forge.mission, key="hello")
    return PullRequest.objects.create(
        forge=forge, number=number, feature=feature, branch="hello", title="[hello] say hello", head=head
    )
