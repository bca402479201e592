"""The run journal: every check, model call, tool call and host decision as a
hash-chained `JournalEntry` (payload canonicalized with RFC 8785, sha256)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import rfc8785
from django.db import IntegrityError, connections, transaction

from validation import fastpaths
from validation.models import JournalEntry, ValidatorRun

logger = logging.getLogger(__name__)


def canonical(value: Any) -> bytes:
    return rfc8785.dumps(value)


def sha256_of(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def entry_hash(*, seq: int, kind: str, key: str, payload: Any, prev: str) -> str:
    return sha256_of({"seq": seq, "kind": kind, "key": key, "payload": payload, "prev": prev})


class JournalIntegrityError(Exception):
    def __init__(self, message: str, *, seq: int | None = None):
        super().__init__(message)
        self.seq = seq


def _jsonable(payload: Any) -> Any:
    # RFC 8785 has no floats beyond IEEE doubles and no non-string keys: normalize first.
    return json.loads(json.dumps(payload, default=str))


def append(*, run_id: int, kind: str, key: str = "", payload: Any) -> JournalEntry:
    return append_many(run_id=run_id, entries=[(kind, key, payload)])[-1]


Entry = tuple[str, str, Any]  # (kind, key, payload)


@dataclass
class Held:
    """The entries of one run kept back in this thread (`held`)."""

    run_id: int
    entries: list[Entry] = field(default_factory=list)

    def take(self) -> list[Entry]:
        entries, self.entries = self.entries, []
        return entries


_holding = threading.local()


@contextlib.contextmanager
def held(run_id: int) -> Iterator[Held]:
    """Inside the block, entries this thread appends for `run_id` with `hold=True` are kept
    back instead of written: the runner hands a run's check results to its completion,
    which journals them with the accepted decision in its own transaction (one write
    transaction per run instead of two). Any other append for the run in the block writes
    them first, in one statement with its own (the chain keeps the order of the appends).
    An exception leaving the block writes them, in a transaction of their own, before it
    propagates; after a normal exit they are the caller's to write (`Held.take`)."""
    box, previous = Held(run_id), getattr(_holding, "box", None)
    _holding.box = box
    try:
        yield box
    except BaseException:
        if box.entries:
            try:
                append_many(run_id=run_id, entries=box.take())
            except Exception:  # noqa: BLE001 — the block's own exception says more; this one is logged
                logger.warning("could not journal the held entries of run %s", run_id, exc_info=True)
        raise
    finally:
        _holding.box = previous


def append_many(*, run_id: int, entries: list[Entry], hold: bool = False) -> list[JournalEntry]:
    """Entries `(kind, key, payload)` chained onto the run's journal in their order, in one
    transaction (the caller's, without a savepoint, when nested): one read of the chain's
    head, one insert. `hold`: kept back instead, inside a `held` block for this run in this
    thread (nothing is returned); written now anywhere else."""
    box = getattr(_holding, "box", None)
    if box is not None and box.run_id == run_id:
        if hold:
            box.entries.extend(entries)
            return []
        entries = [*box.take(), *entries]
    if not entries:
        return []
    payloads = [_jsonable(payload) for _kind, _key, payload in entries]
    # Nested in the caller's transaction, no savepoint: its write lock (SQLite) or the run's
    # row lock taken below orders the appenders, so no other writer takes a seq meanwhile.
    nested = transaction.get_connection(JournalEntry.objects.db).in_atomic_block
    for _attempt in range(5):
        try:
            with transaction.atomic(savepoint=False):
                # The run's row lock orders the appenders of one run (a run's checks finish
                # in parallel threads); a lost race without it could repeat indefinitely.
                # (SQLite has no row locks: its write lock orders them, and no query is made.)
                if connections[ValidatorRun.objects.db].features.has_select_for_update:
                    fastpaths.run_lock(run_id=run_id)
                seq, prev = fastpaths.journal_head(run_id=run_id) or (0, "")
                rows = []
                for (kind, full_key, _raw), payload in zip(entries, payloads, strict=True):
                    seq += 1
                    key = full_key[:200]  # hashed as stored: `verify_chain` reads the stored key
                    digest = entry_hash(seq=seq, kind=kind, key=key, payload=payload, prev=prev)
                    rows.append(
                        JournalEntry(
                            run_id=run_id,
                            seq=seq,
                            kind=kind,
                            key=key,
                            payload=payload,
                            sha256=digest,
                            prev_sha256=prev,
                        )
                    )
                    prev = digest
                return fastpaths.journal_insert(entries=rows)
        except IntegrityError:
            if nested:
                raise
            continue  # another writer took this seq (no row lock on SQLite); chain onto its entry
    raise JournalIntegrityError(f"could not append to the journal of run {run_id}")


@dataclass
class ChainReport:
    ok: bool
    entries: int
    first_bad_seq: int | None = None
    message: str = ""


def verify_chain(run_id: int) -> ChainReport:
    prev = ""
    count = 0
    for entry in JournalEntry.objects.filter(run_id=run_id).order_by("seq").iterator():
        count += 1
        expected = entry_hash(seq=entry.seq, kind=entry.kind, key=entry.key, payload=entry.payload, prev=prev)
        if entry.seq != count or entry.prev_sha256 != prev or entry.sha256 != expected:
            return ChainReport(
                False, count, entry.seq, f"journal entry {entry.seq} ({entry.kind} {entry.key}) does not verify"
            )
        prev = entry.sha256
    return ChainReport(True, count)


class JournalMiss(Exception):
    """A replay needed an answer the journal does not hold; replay never calls out.
    `in_flight`: the run did send that request and never got its answer (it ended, or
    its worker died, while waiting). `past_end`: the journal holds no later model call
    either (the run ended before it sent this one)."""

    def __init__(self, message: str, *, in_flight: bool = False, past_end: bool = False):
        super().__init__(message)
        self.in_flight = in_flight
        self.past_end = past_end


class CallLog:
    """The answered calls of one run, keyed by (kind, key), served instead of calling again.

    Live (`live=True`): a call whose answer is journaled is served from the journal (a
    resumed run never pays twice); any other call runs and is journaled as a request
    entry before and a response entry after, so a worker that dies in between leaves a
    request without an answer, which is sent again. Replay (`live=False`): nothing is
    written and a call without a journaled answer is a `JournalMiss`.
    """

    def __init__(self, run_id: int, *, live: bool = True):
        self.run_id = run_id
        self.live = live
        self._answers: dict[tuple[str, str], Any] = {}
        for row in entries(run_id).values("kind", "key", "payload"):
            self._answers[(row["kind"], row["key"])] = row["payload"]  # a later entry wins

    def answer(self, kind: str, key: str) -> Any:
        return self._answers.get((kind, key[:200]))

    def last_model_call(self) -> int:
        """The highest ordinal of a journaled model request (0: none)."""
        return max(
            (
                p.get("ordinal", 0)
                for (kind, _), p in self._answers.items()
                if kind == "model_request" and isinstance(p, dict)
            ),
            default=0,
        )

    def record(self, kind: str, key: str, payload: Any) -> Any:
        payload = _jsonable(payload)
        if self.live:
            append(run_id=self.run_id, kind=kind, key=key, payload=payload)
        self._answers[(kind, key[:200])] = payload
        return payload

    def call(
        self, *, request_kind: str, response_kind: str, key: str, request: Any, live_fn, what: str
    ) -> tuple[Any, bool]:
        """(answer, served_from_journal)"""
        served = self.answer(response_kind, key)
        if served is not None:
            return served, True
        if not self.live:
            raise JournalMiss(
                f"{what} is not in the journal (key {key}); a replay never makes a live call",
                in_flight=self.answer(request_kind, key) is not None,
            )
        self.record(request_kind, key, request)
        return self.record(response_kind, key, live_fn()), False


def entries(run_id: int, *, kind: str | None = None, key: str | None = None):
    qs = JournalEntry.objects.filter(run_id=run_id).order_by("seq")
    if kind:
        qs = qs.filter(kind=kind)
    if key is not None:
        qs = qs.filter(key=key)
    return qs
