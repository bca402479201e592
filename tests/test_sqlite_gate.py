"""The embedded database's write queue (fusion_site/sqlite/base.py): writers of one
process wait for each other on a lock that every way out of a transaction releases."""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import OperationalError, connection, connections, transaction

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not settings.IS_SQLITE, reason="the embedded (SQLite) configuration only"),
]

WAIT = 30.0  # seconds: generous, never a measure of speed


def gate():
    from fusion_site.sqlite.base import gate

    return gate(str(connection.settings_dict["NAME"]))


def in_thread(fn) -> dict:
    """Run fn in a thread of its own (its own connection); its result or exception."""
    out: dict = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except Exception as exc:  # noqa: BLE001 — handed to the test
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    out["thread"] = thread
    return out


def test_a_second_writer_waits_for_the_first_and_then_writes():
    users = get_user_model()
    inside, release = threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            users.objects.create(username="first")
            inside.set()
            assert release.wait(WAIT)

    one = in_thread(first)
    assert inside.wait(WAIT)
    second_started = threading.Event()

    def second() -> list[str]:
        second_started.set()
        with transaction.atomic():
            users.objects.create(username="second")
        return sorted(users.objects.values_list("username", flat=True))

    two = in_thread(second)
    assert second_started.wait(WAIT)
    assert "result" not in two and "error" not in two  # queued behind the first's transaction
    assert gate().held()  # the first's, on this process's queue (not SQLite's polling)
    release.set()
    one["thread"].join(WAIT)
    two["thread"].join(WAIT)
    assert "error" not in one and "error" not in two, (one, two)
    assert two["result"] == ["first", "second"]
    assert not gate().held()


def test_a_writer_that_waits_past_the_timeout_gets_sqlites_own_error(settings_timeout):
    inside, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            inside.set()
            assert release.wait(WAIT)

    one = in_thread(holder)
    assert inside.wait(WAIT)

    def blocked() -> None:
        with transaction.atomic():
            get_user_model().objects.create(username="late")

    two = in_thread(blocked)
    two["thread"].join(WAIT)  # gives up after the connection's timeout
    release.set()
    one["thread"].join(WAIT)
    assert isinstance(two.get("error"), OperationalError) and "database is locked" in str(two["error"])
    assert not get_user_model().objects.filter(username="late").exists()


def test_a_rolled_back_or_failed_transaction_lets_the_next_writer_in():
    users = get_user_model()
    with pytest.raises(ValueError), transaction.atomic():
        users.objects.create(username="undone")
        raise ValueError("rolled back")
    with pytest.raises(Exception), transaction.atomic():  # noqa: B017, PT011 — any database error
        users.objects.create(username="dup")
        users.objects.create(username="dup")  # unique: the transaction fails
    connection.close()  # a connection closed outside a transaction holds nothing either
    other = in_thread(lambda: users.objects.create(username="next").username)
    other["thread"].join(WAIT)
    assert other.get("result") == "next", other
    assert sorted(users.objects.values_list("username", flat=True)) == ["next"]
    assert not gate().held()


@pytest.fixture
def settings_timeout():
    """A one-second lock timeout for this test's connections."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    before = options.get("timeout")
    options["timeout"] = 1
    connections.close_all()
    yield
    options["timeout"] = before
    connections.close_all()


def test_a_holder_gone_without_a_word_is_taken_over():
    """An exception raised into a thread between the queue and its BEGIN (Dramatiq's time
    limit does that) can leave the queue naming a connection in no transaction: the next
    writer goes on, and SQLite's own lock still keeps writers apart."""

    class Gone:
        connection = None  # closed: no transaction

    def write() -> str:
        with transaction.atomic():
            return get_user_model().objects.create(username="after").username

    gate()._holder = Gone()
    other = in_thread(write)
    other["thread"].join(WAIT)
    assert other.get("result") == "after", other
    assert not gate().held()
