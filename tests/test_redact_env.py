"""Redaction follows the environment as it is now: a secret set, changed or removed after
an earlier call is redacted by its current value (the secrets are recomputed only when
the environment changes, fusion_site/runtime/redact.py)."""

from __future__ import annotations

from fusion_site.runtime.redact import REDACTED, redact


def test_a_secret_set_after_an_earlier_call_is_redacted(monkeypatch):
    monkeypatch.delenv("FUSION_TEST_API_KEY", raising=False)
    assert redact("value: sesame-1234567") == "value: sesame-1234567"
    monkeypatch.setenv("FUSION_TEST_API_KEY", "sesame-1234567")
    assert redact("value: sesame-1234567") == f"value: {REDACTED}"


def test_a_changed_secret_is_redacted_by_its_new_value(monkeypatch):
    monkeypatch.setenv("FUSION_TEST_API_KEY", "first-secret-value")
    assert redact("first-secret-value") == REDACTED
    monkeypatch.setenv("FUSION_TEST_API_KEY", "second-secret-value")
    assert redact("second-secret-value") == REDACTED
    assert redact("first-secret-value") == "first-secret-value"


def test_a_removed_secret_is_no_longer_a_secret(monkeypatch):
    monkeypatch.setenv("FUSION_TEST_API_KEY", "gone-secret-value")
    assert redact("gone-secret-value") == REDACTED
    monkeypatch.delenv("FUSION_TEST_API_KEY")
    assert redact("gone-secret-value") == "gone-secret-value"
