"""Users of the end-to-end tests that sign in (the dashboard, the MCP server): each with a
known password and an API token. A conftest imports the fixtures it wants by name."""

from __future__ import annotations

import socket

import pytest

PASSWORDS = {"alice": "pw-alice-123", "bob": "pw-bob-12345", "staff": "pw-staff-123"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # The default hasher takes ~0.4 s per user by design; these tests are not about it.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _user(django_user_model, name: str, **extra):
    from rest_framework.authtoken.models import Token

    user = django_user_model.objects.create_user(name, password=PASSWORDS[name], **extra)
    user.token = Token.objects.create(user=user).key
    user.password_text = PASSWORDS[name]
    return user


@pytest.fixture
def alice(django_user_model):
    return _user(django_user_model, "alice")


@pytest.fixture
def bob(django_user_model):
    """Signed in, but a member of nothing."""
    return _user(django_user_model, "bob")


@pytest.fixture
def staff(django_user_model):
    return _user(django_user_model, "staff", is_staff=True)
