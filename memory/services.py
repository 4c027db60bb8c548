"""Persistence of memory state in the database: services write, selectors read.

The functions are synchronous ORM code; :class:`OrmSummaryStore` wraps them for the engine's
async storage port (:class:`memory.store.SummaryStore`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import numpy as np
from asgiref.sync import sync_to_async
from django.db import IntegrityError, connection, transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from memory import calibration, facts, summarizer
from memory.fulltext import fts5_match, query_terms
from memory.index import IndexPiece, VectorCache, VectorRow, vector_bytes
from memory.jobs import JobState, JobStatus, StepAttempt
from memory.models import CompressionEvent, KeyFact, MemoryItem, MemoryJobState, SessionSummary, TokenCalibration
from memory.recall import RecallCandidate, RecallItem, TermRarity, content_terms
from memory.store import CompressionRecord, Summary

logger = logging.getLogger(__name__)


def session_summary_get(*, memory_key: str) -> Summary:
    """The conversation's current summary, or an empty one (version 0) when it has none. Read on
    every request: written in SQL (the same row as ``SessionSummary.objects.filter(memory_key=…)
    .first()``), so Django does not build and compile the query each time (issue 11)."""
    row = next(iter(SessionSummary.objects.raw(_SUMMARY_SQL, [memory_key])), None)
    return Summary() if row is None else row.as_summary()


_SUMMARY_SQL = f"SELECT * FROM {SessionSummary._meta.db_table} WHERE memory_key = %s ORDER BY id LIMIT 1"


def session_summary_kind(*, memory_key: str, summary: Summary) -> str:
    """How the conversation's current ``summary`` (:func:`session_summary_get`) was written:
    :func:`memory.summarizer.summary_kind` of the compression event that wrote its version (one
    query), or its stored type when that event is gone or disagrees (``none`` before the first)."""
    if not summary.version:
        return summary.summary_type
    event = (
        CompressionEvent.objects.filter(
            memory_key=memory_key, kind=CompressionEvent.Kind.COMPRESSION, summary_version=summary.version
        )
        .order_by("-id")
        .values_list("result_type", "attempts")
        .first()
    )
    if event is None or event[0] != summary.summary_type:
        return summary.summary_type
    return summarizer.summary_kind(event[0], event[1] or [])


ConversationAlive = Callable[[str], bool]
"""``alive(memory_key)``: whether the conversation still exists, asked inside a write's transaction
by the app that owns it; it should lock the conversation's row so a concurrent delete waits for
the write or the write sees the delete (docs/memory.md F-41)."""


def session_summary_save(
    *,
    memory_key: str,
    expected_version: int,
    new: Summary,
    token_count: int,
    alive: ConversationAlive | None = None,
    same_boundary: bool = False,
) -> bool:
    """Compare-and-set write of a new summary (docs/memory.md §3 step 6).

    Succeeds (returns True) only if the stored version still equals ``expected_version`` and the
    boundary moves strictly forward; otherwise nothing is written and False is returned, so two
    concurrent compressions can never move the boundary backwards or overwrite a newer summary.
    ``new.version`` is ignored: the stored version becomes ``expected_version + 1``.
    ``token_count``: the summary text's size in tokens. With ``alive``, nothing is written and
    False is returned once the conversation is gone (deleted meanwhile, docs/memory.md F-41).
    With ``same_boundary`` the boundary may also stay where it is (a summary over the cap
    rewritten in place, docs/memory.md F-40); it still never moves back.
    """
    fields = {
        "content": new.content,
        "summary_type": new.summary_type,
        "last_message_id": new.last_message_id,
        "compressed_count": new.compressed_count,
        "token_count": token_count,
        "version": expected_version + 1,
        "updated_at": timezone.now(),
    }
    with transaction.atomic():
        if alive is not None and not alive(memory_key):
            return False
        if expected_version == 0:
            _, created = SessionSummary.objects.get_or_create(memory_key=memory_key, defaults=fields)
            if created:
                return True
        queryset = SessionSummary.objects.filter(memory_key=memory_key, version=expected_version)
        if new.last_message_id is not None:
            if same_boundary:
                queryset = queryset.exclude(last_message_id__gt=new.last_message_id)
            else:
                queryset = queryset.exclude(last_message_id__gte=new.last_message_id)
        return queryset.update(**fields) == 1


def compression_event_create(
    *, memory_key: str, record: CompressionRecord, alive: ConversationAlive | None = None
) -> CompressionEvent | None:
    """Store one compression event; with ``alive``, store nothing and return None once the
    conversation is gone (docs/memory.md F-41)."""
    with transaction.atomic():
        if alive is not None and not alive(memory_key):
            return None
        return CompressionEvent.objects.create(memory_key=memory_key, **record.fields())


def compression_event_list(*, memory_key: str, limit: int = 50) -> list[CompressionEvent]:
    """The conversation's most recent ``limit`` compression events, oldest first."""
    rows = list(CompressionEvent.objects.filter(memory_key=memory_key).order_by("-id")[:limit])
    return rows[::-1]


def compression_event_list_after(
    *, memory_key: str, after_id: int, up_to_id: int, limit: int
) -> list[CompressionEvent]:
    """One page of the conversation's compression events for reading them all with bounded
    memory (an export): at most ``limit`` events with ``after_id < id <= up_to_id``, oldest
    first; ask again after the last id until a page comes back empty. ValueError for a
    ``limit`` below 1."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = CompressionEvent.objects.filter(memory_key=memory_key, id__gt=after_id, id__lte=up_to_id)
    return list(rows.order_by("id")[:limit])


def session_memory_delete(*, memory_key: str) -> None:
    """Forget a conversation's memory state (its summary, events, job state, key facts,
    superseded ones included, and recall items); raw messages are not ours."""
    SessionSummary.objects.filter(memory_key=memory_key).delete()
    CompressionEvent.objects.filter(memory_key=memory_key).delete()
    MemoryJobState.objects.filter(memory_key=memory_key).delete()
    KeyFact.objects.filter(memory_key=memory_key).delete()
    MemoryItem.objects.filter(memory_key=memory_key).delete()


def summarizer_health_get(*, memory_key: str) -> dict[str, Any]:
    """The summarizer's health as of the conversation's last compression.

    ``status``: ``idle`` (no compression yet), ``ok`` (first primary attempt succeeded),
    ``retrying`` (the primary succeeded after failed attempts), ``failover`` (the failover model
    produced the summary) or ``raw_archive`` (every attempt failed; docs/memory.md §4, layer 3).
    ``last_error``: the newest failed attempt's error of that compression, ``""`` if none;
    ``attempts``: its attempt records; ``at``: when it happened (ISO 8601) or None.
    """
    event = (
        CompressionEvent.objects.filter(memory_key=memory_key, kind__in=("compression", "superseded"))
        .order_by("-id")
        .first()
    )
    if event is None:
        return {"status": "idle", "last_error": "", "attempts": [], "at": None}
    attempts = event.attempts or []
    errors = [attempt["error"] for attempt in attempts if not attempt.get("ok")]
    succeeded = next((attempt for attempt in attempts if attempt.get("ok")), None)
    if event.degraded or succeeded is None:
        status = "raw_archive"
    elif succeeded.get("phase") == "failover":
        status = "failover"
    elif errors:
        status = "retrying"
    else:
        status = "ok"
    return {
        "status": status,
        "last_error": errors[-1] if errors else "",
        "attempts": attempts,
        "at": event.created_at.isoformat(),
    }


class OrmSummaryStore:
    """The engine's storage port (:class:`memory.store.SummaryStore`) over the database.

    ``alive`` (see :data:`ConversationAlive`), when given, guards every write: the state of a
    conversation deleted while it was being compressed is never recreated (docs/memory.md F-41).
    Its compare-and-set then fails like a lost race (the engine reads again and finds nothing
    left to compress) and its events are not stored (returned with ``id`` None).
    """

    def __init__(self, *, alive: ConversationAlive | None = None) -> None:
        self.alive = alive

    async def get(self, memory_key: str) -> Summary:
        return await sync_to_async(session_summary_get)(memory_key=memory_key)

    async def compare_and_set(
        self, memory_key: str, *, expected_version: int, new: Summary, token_count: int, same_boundary: bool = False
    ) -> bool:
        return await sync_to_async(session_summary_save)(
            memory_key=memory_key,
            expected_version=expected_version,
            new=new,
            token_count=token_count,
            same_boundary=same_boundary,
            alive=self.alive,
        )

    async def record(self, memory_key: str, record: CompressionRecord) -> dict[str, Any]:
        event = await sync_to_async(compression_event_create)(memory_key=memory_key, record=record, alive=self.alive)
        if event is None:
            return {"id": None, "created_at": None, **record.fields()}
        return event.as_dict()


def memory_job_state_get(*, memory_key: str) -> JobState:
    """The conversation's memory-job state, or an idle one when no job has run."""
    row = MemoryJobState.objects.filter(memory_key=memory_key).first()
    return JobState(memory_key=memory_key) if row is None else row.as_state()


def memory_job_acquire(*, memory_key: str, owner: str, lease_seconds: float) -> JobState | None:
    """Take the conversation's job lease for ``owner`` for ``lease_seconds`` (docs/memory.md §10,
    "memory job"): one conditional UPDATE, so of two workers asking at once exactly one gets it.
    Returns the state as acquired (status ``running``), or None while another owner holds a lease
    that has not run out."""
    now = timezone.now()
    MemoryJobState.objects.get_or_create(memory_key=memory_key)
    free = Q(lease_owner="") | Q(lease_owner=owner) | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now)
    taken = (
        MemoryJobState.objects.filter(free, memory_key=memory_key).update(
            status="running", lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds), updated_at=now
        )
        == 1
    )
    return memory_job_state_get(memory_key=memory_key) if taken else None


def memory_job_renew(*, memory_key: str, owner: str, lease_seconds: float) -> bool:
    """Extend the lease ``owner`` holds by ``lease_seconds`` from now; False when it lost it."""
    now = timezone.now()
    return (
        MemoryJobState.objects.filter(memory_key=memory_key, lease_owner=owner).update(
            lease_expires_at=now + timedelta(seconds=lease_seconds), updated_at=now
        )
        == 1
    )


def memory_job_step_done(*, memory_key: str, owner: str, attempt: StepAttempt) -> bool:
    """Store one step's attempt and, if it succeeded, its new watermark, while ``owner`` still
    holds the lease (row locked for the read-modify-write); False, writing nothing, otherwise."""
    with transaction.atomic():
        row = MemoryJobState.objects.select_for_update().filter(memory_key=memory_key, lease_owner=owner).first()
        if row is None:
            return False
        if attempt.ok:
            row.watermarks = {**row.watermarks, attempt.step: attempt.watermark_after}
        row.attempts = {**row.attempts, attempt.step: attempt.as_dict()}
        row.save(update_fields=["watermarks", "attempts", "updated_at"])
    return True


def memory_job_release(*, memory_key: str, owner: str, status: JobStatus, error: str) -> None:
    """End ``owner``'s lease with the job's final ``status`` and ``error`` and count the run;
    nothing happens when ``owner`` no longer holds it."""
    with transaction.atomic():
        row = MemoryJobState.objects.select_for_update().filter(memory_key=memory_key, lease_owner=owner).first()
        if row is None:
            return
        row.status, row.last_error, row.lease_owner, row.lease_expires_at = status, error, "", None
        row.runs += 1
        row.save(update_fields=["status", "last_error", "lease_owner", "lease_expires_at", "runs", "updated_at"])


class OrmJobStore:
    """The memory jobs' shared state (:class:`memory.jobs.JobStore`) in the database."""

    async def get(self, memory_key: str) -> JobState:
        return await sync_to_async(memory_job_state_get)(memory_key=memory_key)

    async def acquire(self, memory_key: str, *, owner: str, lease_seconds: float) -> JobState | None:
        return await sync_to_async(memory_job_acquire)(memory_key=memory_key, owner=owner, lease_seconds=lease_seconds)

    async def renew(self, memory_key: str, *, owner: str, lease_seconds: float) -> bool:
        return await sync_to_async(memory_job_renew)(memory_key=memory_key, owner=owner, lease_seconds=lease_seconds)

    async def step_done(self, memory_key: str, *, owner: str, attempt: StepAttempt) -> bool:
        return await sync_to_async(memory_job_step_done)(memory_key=memory_key, owner=owner, attempt=attempt)

    async def release(self, memory_key: str, *, owner: str, status: JobStatus, error: str) -> None:
        await sync_to_async(memory_job_release)(memory_key=memory_key, owner=owner, status=status, error=error)


# ----------------------------------------------------------------------------------------------
# Key facts (docs/memory.md §11)
# ----------------------------------------------------------------------------------------------


class KeyFactNotFound(Exception):
    """No key fact with that id in that conversation: unknown, or another conversation's (the
    owning app answers 404 either way, so a fact id of another chat reveals nothing)."""


# Tries of a key-fact write that lost a race with a concurrent insert of the same active value
# (the partial unique constraint of :class:`memory.models.KeyFact`); each try reads again, so
# the value stored meanwhile is then found and treated as a restatement.
FACT_WRITE_TRIES = 3
# Fact ids are 64-bit database keys; a larger id names no fact (and would overflow the driver).
FACT_ID_MAX = 2**63 - 1


def _facts_with_replaces(rows: QuerySet[KeyFact]) -> QuerySet[KeyFact]:
    """``rows`` with ``replaces_value``: the value of the newest fact each one superseded (None
    when none), read by the same query (no query per fact)."""
    replaced = KeyFact.objects.filter(superseded_by=OuterRef("pk")).order_by("-id").values("value")[:1]
    return rows.annotate(replaces_value=Subquery(replaced))


def key_fact_list_active(*, memory_key: str) -> list[facts.KeyFact]:
    """The conversation's active key facts, oldest first: not superseded (``invalidated_at``
    NULL) and not hidden by the owner, each with ``replaces`` filled (docs/memory.md §11). What
    a request's ``load_facts`` returns. One query, read once per request: written in SQL, so
    Django does not build and compile it every time (bench/ws_load.py profile, issue 11)."""
    return [row.as_fact() for row in KeyFact.objects.raw(_ACTIVE_FACTS_SQL, [memory_key])]


# key_fact_list_active's query: the same rows and ``replaces_value`` as
# ``_facts_with_replaces(KeyFact.objects.filter(memory_key=…, invalidated_at__isnull=True,
# hidden_by_user=False))`` (tests/memory/test_key_fact_services.py compares the two).
_ACTIVE_FACTS_SQL = (
    f"SELECT f.*, (SELECT r.value FROM {KeyFact._meta.db_table} r WHERE r.superseded_by_id = f.id "
    f"ORDER BY r.id DESC LIMIT 1) AS replaces_value FROM {KeyFact._meta.db_table} f "
    "WHERE f.memory_key = %s AND f.invalidated_at IS NULL AND NOT f.hidden_by_user ORDER BY f.id"
)


def key_fact_list(*, memory_key: str) -> list[facts.KeyFact]:
    """Every key fact of the conversation, oldest first, superseded and hidden ones included
    (the inspector's list), each with ``replaces`` filled. One query."""
    return [row.as_fact() for row in _facts_with_replaces(KeyFact.objects.filter(memory_key=memory_key))]


def _fact_get(*, memory_key: str, fact_id: int) -> facts.KeyFact:
    if not 0 < fact_id <= FACT_ID_MAX:
        raise KeyFactNotFound(f"no key fact {fact_id} in {memory_key}")
    row = _facts_with_replaces(KeyFact.objects.filter(pk=fact_id, memory_key=memory_key)).first()
    if row is None:
        raise KeyFactNotFound(f"no key fact {fact_id} in {memory_key}")
    return row.as_fact()


def _storable(candidate: facts.FactCandidate) -> bool:
    """Whether ``candidate`` fits its columns unchanged (a value is never cut: it is verbatim)."""
    return (
        bool(candidate.value)
        and len(candidate.value) <= facts.MAX_VALUE_CHARS
        and bool(candidate.key)
        and len(candidate.key) <= facts.MAX_KEY_CHARS
    )


def _fact_row(
    candidate: facts.FactCandidate, *, memory_key: str, scope_key: str, extractor: str, valid_from: datetime | None
) -> KeyFact:
    kind = candidate.kind if candidate.kind in facts.FACT_KINDS else "other"
    return KeyFact(
        memory_key=memory_key,
        scope_key=scope_key,
        kind=kind,
        key=candidate.key,
        value=candidate.value,
        text=(candidate.text or candidate.value)[: facts.MAX_TEXT_CHARS],
        source_message_id=candidate.source_message_id,
        excerpt=candidate.excerpt,
        extractor=extractor[:64],
        valid_from=valid_from,
        last_seen_message_id=candidate.source_message_id,
    )


def _fact_write_retried(
    write: Callable[[], list[facts.KeyFact]], *, memory_key: str, give_up_quietly: bool = True
) -> list[facts.KeyFact]:
    """Run ``write`` in a transaction (a savepoint inside the caller's), again when it lost a
    race with a concurrent insert of the same active value (IntegrityError, see
    :data:`FACT_WRITE_TRIES`). After the last lost race nothing is written and, with
    ``give_up_quietly``, ``[]`` is returned (the caller's own transaction, e.g. a stored
    message, must not fail because of a fact); otherwise the IntegrityError propagates."""
    for attempt in range(1, FACT_WRITE_TRIES + 1):
        try:
            with transaction.atomic():
                return write()
        except IntegrityError:
            if attempt == FACT_WRITE_TRIES:
                if not give_up_quietly:
                    raise
                logger.warning("key facts of %s not stored: lost %s races for the same values", memory_key, attempt)
    return []


def key_facts_store_rule(*, memory_key: str, scope_key: str, messages: list[dict[str, Any]]) -> list[facts.KeyFact]:
    """Store the rule facts of just-stored messages (docs/memory.md §11, "rule extraction at
    store time"); returns the facts created, in message order.

    ``messages``: stored messages as dicts with ``id`` (int), ``role``, ``content``,
    ``tool_calls`` and ``created_at`` (aware datetime, becomes ``valid_from``);
    :func:`memory.facts.message_rule_facts` reads a user's text and an assistant's tool-call
    arguments. ``scope_key``: the conversation's owner, an opaque string of the owning app. A
    value already held by an active fact of the conversation (any slot, hidden ones too) is an
    exact restatement: no row is added, only that fact's ``last_seen_message_id`` moves up.
    Values longer than :data:`memory.facts.MAX_VALUE_CHARS` are not stored (never cut).

    Cost: no query at all when no message yields a candidate (most messages); otherwise one
    SELECT of the active facts with those values, one bulk INSERT and at most one UPDATE per
    restating message, in one transaction (a savepoint inside the caller's).
    """
    found: list[tuple[facts.FactCandidate, datetime | None]] = []
    for message in messages:
        created_at = message.get("created_at")
        valid_from = created_at if isinstance(created_at, datetime) else None
        found.extend((candidate, valid_from) for candidate in facts.message_rule_facts(message) if _storable(candidate))
    if not found:
        return []

    def write() -> list[facts.KeyFact]:
        held: dict[str, list[int]] = {}
        active = KeyFact.objects.filter(
            memory_key=memory_key, invalidated_at__isnull=True, value__in={candidate.value for candidate, _ in found}
        )
        for fact_id, value in active.values_list("id", "value"):
            held.setdefault(value, []).append(fact_id)
        new: dict[str, KeyFact] = {}
        restated: dict[int, set[int]] = {}
        for candidate, valid_from in found:
            message_id = candidate.source_message_id
            if candidate.value in held:
                restated.setdefault(message_id, set()).update(held[candidate.value])
            elif candidate.value in new:
                row = new[candidate.value]
                row.last_seen_message_id = max(row.last_seen_message_id or 0, message_id)
            else:
                new[candidate.value] = _fact_row(
                    candidate, memory_key=memory_key, scope_key=scope_key, extractor="rule", valid_from=valid_from
                )
        created = KeyFact.objects.bulk_create(list(new.values())) if new else []
        now = timezone.now()
        for message_id in sorted(restated):
            KeyFact.objects.filter(
                Q(last_seen_message_id__isnull=True) | Q(last_seen_message_id__lt=message_id),
                pk__in=restated[message_id],
            ).update(last_seen_message_id=message_id, updated_at=now)
        return [row.as_fact() for row in created]

    return _fact_write_retried(write, memory_key=memory_key)


def key_facts_apply(
    *,
    memory_key: str,
    scope_key: str,
    candidates: list[facts.FactCandidate],
    valid_from: dict[int, datetime],
    alive: ConversationAlive | None = None,
) -> list[facts.KeyFact]:
    """Store validated extraction candidates (:func:`memory.facts.validate_extraction`) in one
    transaction and apply their supersessions (docs/memory.md §11, F-28); returns the facts
    created, ``replaces`` filled.

    Each candidate becomes a row with its own ``extractor`` (``llm:<model>``) and
    ``valid_from[candidate.source_message_id]`` (None when missing), unless an active fact of
    the conversation already holds the same slot and value (then it is skipped: a restatement),
    or a retired fact (superseded, by a later message or by the user's own edit) holds the same
    value and was seen in a message at least as new as the candidate's: a replaced value comes
    back only when a newer message states it again (an extraction that runs after the user
    corrected a fact must not bring the old value back). Each id in ``candidate.supersedes`` that names an active fact of the same conversation and
    the **same slot** that the user did **not** pin is retired: ``invalidated_at`` now,
    ``superseded_by`` the new fact; its row is kept. Other ids are ignored. With ``alive`` (see
    :data:`ConversationAlive`), nothing is written and ``[]`` returned once the conversation is
    gone (docs/memory.md F-41).
    """
    storable = [candidate for candidate in candidates if _storable(candidate)]
    if not storable:
        return []

    def write() -> list[facts.KeyFact]:
        if alive is not None and not alive(memory_key):
            return []
        active = set(
            KeyFact.objects.filter(
                memory_key=memory_key,
                invalidated_at__isnull=True,
                value__in={candidate.value for candidate in storable},
            ).values_list("key", "value")
        )
        retired_seen: dict[str, int] = {}
        for value, source_id, seen_id in KeyFact.objects.filter(
            memory_key=memory_key,
            invalidated_at__isnull=False,
            value__in={candidate.value for candidate in storable},
        ).values_list("value", "source_message_id", "last_seen_message_id"):
            retired_seen[value] = max(retired_seen.get(value, 0), source_id or 0, seen_id or 0)
        wanted = {fact_id for candidate in storable for fact_id in candidate.supersedes}
        retirable: dict[int, KeyFact] = {}
        if wanted:
            rows = KeyFact.objects.filter(
                pk__in=wanted, memory_key=memory_key, invalidated_at__isnull=True, pinned_by_user=False
            )
            if connection.features.has_select_for_update:
                rows = rows.select_for_update()
            retirable = {row.pk: row for row in rows}
        planned: list[tuple[KeyFact, list[KeyFact]]] = []
        for candidate in storable:
            if (candidate.key, candidate.value) in active:
                continue
            if candidate.source_message_id <= retired_seen.get(candidate.value, -1):
                continue  # replaced after that message: not revived by a late extraction
            active.add((candidate.key, candidate.value))
            row = _fact_row(
                candidate,
                memory_key=memory_key,
                scope_key=scope_key,
                extractor=candidate.extractor,
                valid_from=valid_from.get(candidate.source_message_id),
            )
            retired = [
                retirable.pop(fact_id)
                for fact_id in dict.fromkeys(candidate.supersedes)
                if fact_id in retirable and retirable[fact_id].key == candidate.key
            ]
            planned.append((row, sorted(retired, key=lambda old: old.pk)))
        if not planned:
            return []
        KeyFact.objects.bulk_create([row for row, _ in planned])
        now = timezone.now()
        for row, retired in planned:
            if retired:
                KeyFact.objects.filter(pk__in=[old.pk for old in retired]).update(
                    invalidated_at=now, superseded_by=row, updated_at=now
                )
        return [row.as_fact(replaces=retired[-1].value if retired else "") for row, retired in planned]

    return _fact_write_retried(write, memory_key=memory_key)


def key_fact_pin(*, memory_key: str, fact_id: int, pinned: bool) -> facts.KeyFact:
    """Pin (``pinned`` True) or unpin fact ``fact_id`` of the conversation for the owner
    (docs/memory.md §11): a pinned fact is kept first in the block and is never superseded by
    an extraction, only by the user's own edit. Returns the fact as now stored. Raises
    :class:`KeyFactNotFound` for an id that is not a fact of ``memory_key``."""
    if 0 < fact_id <= FACT_ID_MAX:
        KeyFact.objects.filter(pk=fact_id, memory_key=memory_key).update(
            pinned_by_user=pinned, updated_at=timezone.now()
        )
    return _fact_get(memory_key=memory_key, fact_id=fact_id)


def key_fact_hide(*, memory_key: str, fact_id: int, hidden: bool) -> facts.KeyFact:
    """Hide (``hidden`` True) or restore fact ``fact_id`` of the conversation for the owner
    (docs/memory.md §11): a hidden fact stays stored but is never put in a request. Returns the
    fact as now stored. Raises :class:`KeyFactNotFound` for an id that is not a fact of
    ``memory_key``."""
    if 0 < fact_id <= FACT_ID_MAX:
        KeyFact.objects.filter(pk=fact_id, memory_key=memory_key).update(
            hidden_by_user=hidden, updated_at=timezone.now()
        )
    return _fact_get(memory_key=memory_key, fact_id=fact_id)


def key_fact_edit(*, memory_key: str, fact_id: int, value: str) -> facts.KeyFact:
    """The owner's correction of fact ``fact_id`` (docs/memory.md §11): a new current fact of the
    same slot, kind and source message with ``value`` (spacing normalised), ``extractor``
    ``user``, ``valid_from`` now, pinned if the old one was; the edited fact is kept, retired
    (``invalidated_at``, ``superseded_by``), even if pinned (the user may retire their own pin).
    Its ``text`` says the new value where the old one said the old value. Returns the new fact
    (``replaces`` = the old value); an unchanged value changes nothing and returns the fact. When
    another current fact of the slot already holds ``value``, that one becomes the current fact
    (shown again if hidden) instead of a duplicate.

    Raises :class:`KeyFactNotFound` for an id that is not a fact of ``memory_key``, and
    ``ValueError`` for an empty value, one over :data:`memory.facts.MAX_VALUE_CHARS` characters,
    or a fact already superseded (edit the current one); ``IntegrityError`` only after
    :data:`FACT_WRITE_TRIES` lost races with concurrent inserts of the same value.
    """
    value = " ".join(value.split())
    if not value:
        raise ValueError("a key fact needs a value")
    if len(value) > facts.MAX_VALUE_CHARS:
        raise ValueError(f"a key fact's value has at most {facts.MAX_VALUE_CHARS} characters")
    if not 0 < fact_id <= FACT_ID_MAX:
        raise KeyFactNotFound(f"no key fact {fact_id} in {memory_key}")

    def write() -> list[facts.KeyFact]:
        rows = KeyFact.objects.filter(pk=fact_id, memory_key=memory_key)
        if connection.features.has_select_for_update:
            rows = rows.select_for_update()
        old = rows.first()
        if old is None:
            raise KeyFactNotFound(f"no key fact {fact_id} in {memory_key}")
        if old.invalidated_at is not None:
            raise ValueError(f"key fact {fact_id} was superseded: edit the current one")
        if value == old.value:
            return [old.as_fact()]
        now = timezone.now()
        current = KeyFact.objects.filter(
            memory_key=memory_key, key=old.key, value=value, invalidated_at__isnull=True
        ).first()
        if current is None:
            current = KeyFact.objects.create(
                memory_key=memory_key,
                scope_key=old.scope_key,
                kind=old.kind,
                key=old.key,
                value=value,
                text=(old.text.replace(old.value, value) if old.value in old.text else value)[: facts.MAX_TEXT_CHARS],
                source_message_id=old.source_message_id,
                excerpt=old.excerpt,
                extractor="user",
                valid_from=now,
                pinned_by_user=old.pinned_by_user,
                last_seen_message_id=old.last_seen_message_id,
            )
        elif current.hidden_by_user:
            KeyFact.objects.filter(pk=current.pk).update(hidden_by_user=False, updated_at=now)
        KeyFact.objects.filter(pk=old.pk).update(invalidated_at=now, superseded_by=current, updated_at=now)
        return [current.as_fact()]

    (edited,) = _fact_write_retried(write, memory_key=memory_key, give_up_quietly=False)
    return _fact_get(memory_key=memory_key, fact_id=edited.id)


# ----------------------------------------------------------------------------------------------
# The recall index (docs/memory.md §12)
# ----------------------------------------------------------------------------------------------

# Items embedded per batch by the memory job and by memory_reindex.
EMBED_BATCH = 16
# The full-text expression that migration 0005_memoryitem indexes (PostgreSQL: the GIN index is
# used only when a query repeats it exactly).
_PG_BODY = "to_tsvector('english', CASE WHEN i.search_text = '' THEN i.text ELSE i.search_text END)"
# Candidates of one recall search from each side (full-text hits, nearest by cosine): a wide
# pool, since the gate and not the search decides (docs/memory.md §12; 200 found the evidence of
# 83 % of the LoCoMo questions, 50 of 73 %).
RECALL_POOL = 200
# The nearest items by cosine taken into one search (the dense side's thresholds were calibrated
# on 50, bench/recall_calibrate.py).
RECALL_DENSE_POOL = 50
# Identifier kinds of memory.facts.rule_facts that make an exact identifier match.
IDENTIFIER_KINDS = frozenset({"id", "email", "phone"})

_vectors = VectorCache()


def memory_items_write(
    *,
    memory_key: str,
    scope_key: str,
    message_ids: Iterable[int],
    pieces: Sequence[IndexPiece],
    alive: ConversationAlive | None = None,
) -> tuple[int, int]:
    """Make the stored items of messages ``message_ids`` of the conversation equal ``pieces``
    (docs/memory.md §12, "the index"); returns ``(inserted, deleted)``.

    ``pieces``: :func:`memory.index.message_pieces` of those messages (a message without a piece
    loses its items). A stored item whose slot (message, piece number) and text are unchanged is
    kept with its embedding; a changed one is deleted and inserted again (a new id, no
    embedding); items beyond a message's pieces are deleted. So writing the same pieces twice
    changes nothing (``memory_reindex`` is idempotent). One transaction; with ``alive`` (see
    :data:`ConversationAlive`) nothing is written and ``(0, 0)`` returned once the conversation
    is gone (docs/memory.md F-41).
    """
    ids = sorted(set(message_ids))
    if not ids:
        return (0, 0)
    wanted = {piece.slot: piece for piece in pieces}
    with transaction.atomic():
        if alive is not None and not alive(memory_key):
            return (0, 0)
        stale: list[int] = []
        kept: set[tuple[int, int]] = set()
        for chunk_start in range(0, len(ids), 500):
            chunk = ids[chunk_start : chunk_start + 500]
            rows = MemoryItem.objects.filter(memory_key=memory_key, last_message_id__in=chunk).values_list(
                "id", "last_message_id", "piece", "text", "scope_key"
            )
            for item_id, last_id, number, text, owner in rows:
                piece = wanted.get((last_id, number))
                if piece is not None and piece.text == text and owner == scope_key:
                    kept.add(piece.slot)
                else:
                    stale.append(item_id)
        if stale:
            MemoryItem.objects.filter(pk__in=stale).delete()
        new = [
            MemoryItem(
                scope_key=scope_key,
                memory_key=memory_key,
                message_ids=list(piece.message_ids),
                last_message_id=piece.last_message_id,
                piece=piece.piece,
                role=piece.role,
                text=piece.text,
                search_text=piece.search_text,
                token_count=piece.tokens,
                created_at=piece.created_at,
            )
            for piece in pieces
            if piece.slot not in kept
        ]
        MemoryItem.objects.bulk_create(new, batch_size=500)
    return (len(new), len(stale))


def memory_items_unembedded(*, memory_key: str, model: str, limit: int = EMBED_BATCH) -> list[tuple[int, str, int]]:
    """``(id, text, last_message_id)`` of up to ``limit`` items of the conversation without an
    embedding of ``model`` (none, or another model's), oldest first."""
    rows = MemoryItem.objects.filter(memory_key=memory_key).exclude(embedding_model=model).order_by("id")
    return list(rows.values_list("id", "text", "last_message_id")[:limit])


def memory_item_embeddings_exist(*, scope_key: str, model: str) -> bool:
    """Whether any item of owner ``scope_key`` has an embedding of ``model`` (one query unless
    :func:`memory_item_embeddings_known` knows): without one, a query vector would find nothing
    (docs/memory.md §12)."""
    known = memory_item_embeddings_known(scope_key=scope_key, model=model)
    if known is not None:
        return known
    key = (scope_key, model)
    found = MemoryItem.objects.filter(scope_key=scope_key, embedding_model=model).exists()
    if found:
        _embedded_owners.add(key)
        _unembedded_until.pop(key, None)
    else:
        _unembedded_until[key] = time.monotonic() + UNEMBEDDED_RECHECK_SECONDS
    return found


# (owner, model) pairs known to have embedded items: once true it stays true for the process (a
# stale answer after an owner's every item is deleted only costs one query vector that finds
# nothing), so a turn asks the database only until the first embedding exists.
_embedded_owners: set[tuple[str, str]] = set()
# ...and pairs known to have none, asked again after this many seconds (or at once after this
# process stores an embedding): a new owner's turns do not ask on every request, and another
# worker's first embeddings are seen within it (until then the question is not embedded).
UNEMBEDDED_RECHECK_SECONDS = 10.0
_unembedded_until: dict[tuple[str, str], float] = {}


def memory_item_embeddings_known(*, scope_key: str, model: str) -> bool | None:
    """What this process already knows of :func:`memory_item_embeddings_exist` for owner
    ``scope_key`` and ``model``, without a query (None: it must ask the database). Safe to call
    from the event loop: an async caller skips a trip to a database thread when it knows."""
    key = (scope_key, model)
    if key in _embedded_owners:
        return True
    if _unembedded_until.get(key, 0.0) > time.monotonic():
        return False
    return None


def memory_items_unembedded_exist(*, memory_key: str, model: str) -> bool:
    """Whether the conversation has an item without an embedding of ``model``."""
    return MemoryItem.objects.filter(memory_key=memory_key).exclude(embedding_model=model).exists()


def memory_item_embeddings_save(*, vectors: dict[int, np.ndarray], model: str) -> int:
    """Store embeddings of ``model``: item id → L2-normalised vector (all of one dimension).
    Items deleted meanwhile are skipped; returns how many were stored. Touches neither the text
    nor the full-text index."""
    if not vectors:
        return 0
    rows = list(MemoryItem.objects.filter(pk__in=list(vectors)).only("id"))
    for row in rows:
        vector = vectors[row.pk]
        row.embedding, row.embedding_model, row.embedding_dim = vector_bytes(vector), model, int(vector.shape[-1])
    MemoryItem.objects.bulk_update(rows, ["embedding", "embedding_model", "embedding_dim"], batch_size=200)
    # Some owner has embeddings now: ask again (now, and once they are committed, in case a
    # request in between found none yet).
    _unembedded_until.clear()
    transaction.on_commit(_unembedded_until.clear)
    return len(rows)


def memory_index_status(*, memory_key: str) -> dict[str, Any]:
    """The conversation's index for the inspector: ``items`` (count), ``embedded`` (items with an
    embedding) and ``models`` (embedding model → item count). One query."""
    counts: dict[str, int] = {}
    for model in MemoryItem.objects.filter(memory_key=memory_key).values_list("embedding_model", flat=True):
        counts[model] = counts.get(model, 0) + 1
    return {
        "items": sum(counts.values()),
        "embedded": sum(count for model, count in counts.items() if model),
        "models": {model: count for model, count in counts.items() if model},
    }


def _scope_sql(alias: str) -> str:
    """The owner-scope condition of a recall query (see :func:`recall_candidates`); its
    parameters are those of :func:`_scope_params`."""
    return (
        f"{alias}.scope_key = %s AND (({alias}.memory_key = %s AND {alias}.last_message_id <= %s) "
        f"OR (%s AND {alias}.memory_key <> %s))"
    )


def _scope_params(scope_key: str, memory_key: str, boundary: int | None, scope: str) -> list[Any]:
    # No boundary: nothing of this chat is in its summary yet (-1 is below every message id).
    return [scope_key, memory_key, boundary if boundary is not None else -1, scope == "owner", memory_key]


def _lexical_ids(terms: list[str], scope_params: list[Any], limit: int) -> list[int]:
    """Item ids matching any of ``terms`` within the scope, best first (``bm25`` on SQLite,
    ``ts_rank_cd`` on PostgreSQL), at most ``limit``; ``[]`` on other databases."""
    if not terms:
        return []
    if connection.vendor == "sqlite":
        match = fts5_match(terms)
        if not match:
            return []
        sql = (
            "SELECT i.id FROM memory_memoryitem_fts JOIN memory_memoryitem i ON i.id = memory_memoryitem_fts.rowid "
            f"WHERE memory_memoryitem_fts MATCH %s AND {_scope_sql('i')} "
            "ORDER BY bm25(memory_memoryitem_fts), i.id LIMIT %s"
        )
        params: list[Any] = [match, *scope_params, limit]
    elif connection.vendor == "postgresql":
        any_term = " || ".join(["phraseto_tsquery('english', %s)"] * len(terms))
        sql = (
            f"SELECT i.id FROM memory_memoryitem i, (SELECT {any_term} AS query) q "
            f"WHERE {_PG_BODY} @@ q.query AND {_scope_sql('i')} "
            f"ORDER BY ts_rank_cd({_PG_BODY}, q.query) DESC, i.id LIMIT %s"
        )
        params = [*terms, *scope_params, limit]
    else:
        return []
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def recall_term_rarity(*, scope_key: str, query: str) -> TermRarity:
    """How rare the terms of ``query`` are among the items of owner ``scope_key``
    (docs/memory.md §12, "gate"): the number of the owner's items, and for each content term of
    the query (:func:`memory.recall.content_terms` of each search term of
    :func:`memory.fulltext.query_terms`) the number of those items the full-text search finds
    for it (SQLite FTS5, PostgreSQL ``to_tsvector``; the same stemming as the search itself). One
    statement. On another database, no frequencies (every term then counts as held by every
    item and weighs next to nothing: only identifiers and cosines admit). Storage errors
    propagate."""
    terms = query_terms(query)
    # Each search term, and the content terms of the query it stands for ("东 京" for "东京").
    stands_for = {term: content_terms(term.replace(" ", "") if " " in term else term) for term in terms}
    searched = [term for term in terms if stands_for[term]]
    if connection.vendor == "sqlite":
        matches = [fts5_match([term]) for term in searched]
        searched = [term for term, match in zip(searched, matches, strict=True) if match]
        # The full-text match first (a join lets SQLite test MATCH row by row: 100 times slower).
        counts = [
            "(SELECT count(*) FROM memory_memoryitem i WHERE i.scope_key = %s AND i.id IN "
            "(SELECT rowid FROM memory_memoryitem_fts WHERE memory_memoryitem_fts MATCH %s))"
        ] * len(searched)
        params: list[Any] = [value for match in matches if match for value in (scope_key, match)]
    elif connection.vendor == "postgresql":
        counts = [
            "(SELECT count(*) FROM memory_memoryitem i "
            f"WHERE {_PG_BODY} @@ phraseto_tsquery('english', %s) AND i.scope_key = %s)"
        ] * len(searched)
        params = [value for term in searched for value in (term, scope_key)]
    else:
        searched, counts, params = [], [], []
    sql = "SELECT " + ", ".join(["(SELECT count(*) FROM memory_memoryitem WHERE scope_key = %s)", *counts])
    with connection.cursor() as cursor:
        cursor.execute(sql, [scope_key, *params])
        row = cursor.fetchone()
    frequencies: dict[str, int] = {}
    for term, count in zip(searched, row[1:], strict=True):
        for content in stands_for[term]:
            frequencies[content] = max(frequencies.get(content, 0), int(count))
    return TermRarity(documents=int(row[0]), frequencies=frequencies)


def _vector_reader(scope_key: str) -> Callable[[int, Sequence[int]], Iterable[VectorRow]]:
    def read(after: int, ids: Sequence[int]) -> Iterable[VectorRow]:
        rows = MemoryItem.objects.filter(Q(id__gt=after) | Q(id__in=list(ids)), scope_key=scope_key)
        return rows.values_list(
            "id", "memory_key", "last_message_id", "embedding", "embedding_model", "embedding_dim"
        ).iterator(chunk_size=2000)

    return read


@dataclass(frozen=True, kw_only=True)
class LexicalHits:
    """The full-text side of one recall search (:func:`recall_lexical_hits`): ``lexical``, item
    ids matching any query term, best first; ``exact``, item ids holding an identifier of the
    query; ``identifiers``, those identifiers (ids, emails, phones, verbatim); ``items``, the
    rows of those hits by id (empty: read with the candidates)."""

    lexical: list[int]
    exact: list[int]
    identifiers: list[str]
    items: dict[int, RecallItem] = field(default_factory=dict)


def recall_lexical_hits(
    *,
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    scope: Literal["chat", "owner"],
    query: str,
    limit: int = RECALL_POOL,
    titles: Callable[[set[str]], Mapping[str, str]] | None = None,
) -> LexicalHits:
    """The full-text part of :func:`recall_candidates` on its own, so that a caller can run it
    while the query is being embedded (docs/memory.md §12): the ``limit`` best full-text hits and
    the items holding an identifier of ``query``, in the same scope, with their rows (chat titles
    by ``titles``, as for :func:`recall_candidates`). Storage errors propagate."""
    scope_params = _scope_params(scope_key, memory_key, boundary, scope)
    identifiers = [
        candidate.value
        for candidate in facts.rule_facts(query, message_id=0)
        if candidate.kind in IDENTIFIER_KINDS and candidate.value
    ]
    exact: list[int] = []
    for value in identifiers:
        exact.extend(_lexical_ids(query_terms(value), scope_params, limit))
    lexical = _lexical_ids(query_terms(query), scope_params, limit)
    found = list(dict.fromkeys([*lexical, *exact]))
    items = _scoped_items(found, scope_key, memory_key, boundary, scope, titles) if found else {}
    return LexicalHits(lexical=lexical, exact=exact, identifiers=identifiers, items=items)


def _scoped_items(
    ids: Sequence[int],
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    scope: Literal["chat", "owner"],
    titles: Callable[[set[str]], Mapping[str, str]] | None,
) -> dict[int, RecallItem]:
    """The items ``ids`` that are in the scope of :func:`recall_candidates`, by id, their chat
    titles filled by ``titles`` (``""`` without it). One query, two with titles."""
    rows = MemoryItem.objects.filter(pk__in=list(ids), scope_key=scope_key).filter(
        (Q(memory_key=memory_key, last_message_id__lte=boundary) if boundary is not None else Q(pk__in=[]))
        | (~Q(memory_key=memory_key) if scope == "owner" else Q(pk__in=[]))
    )
    found = list(rows.values_list(*_ITEM_COLUMNS))
    named = titles({row[1] for row in found}) if titles is not None and found else {}
    return {row[0]: _item(row, title=named.get(row[1], "")) for row in found}


def recall_candidates(
    *,
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    scope: Literal["chat", "owner"],
    query: str,
    query_vector: np.ndarray | None,
    limit: int = RECALL_POOL,
    embedding_model: str | None = None,
    dense_limit: int | None = None,
    hits: LexicalHits | None = None,
    titles: Callable[[set[str]], Mapping[str, str]] | None = None,
) -> list[RecallCandidate]:
    """The items that may be recalled for ``query`` in conversation ``memory_key`` of owner
    ``scope_key`` (docs/memory.md §12, "scope"), unranked: the caller's admission gate decides.

    Eligible items belong to ``scope_key`` (never another owner's: the condition is part of
    every query) and are either of this conversation with every message id ≤ ``boundary`` (its
    summary's boundary; None: none of them), or, with ``scope`` ``owner``, of the owner's other
    conversations. Candidates: the ``limit`` best full-text hits (``lexical_rank`` 1, 2, …; any
    term of :func:`memory.fulltext.query_terms` matching), the ``dense_limit`` (default: ``limit``, at most
    :data:`RECALL_DENSE_POOL`) items whose embedding is
    most similar to ``query_vector`` (an L2-normalised vector, None for lexical-only; compared
    only with embeddings of ``embedding_model`` when given, else of the same dimension) through
    the per-owner :class:`memory.index.VectorCache`, and the items holding an identifier of the
    query verbatim (an id, email or phone of :func:`memory.facts.rule_facts`, compared without
    case). ``cosine`` is filled for every candidate with a cached embedding. ``chat_title`` is
    ``""`` (the owning app fills it). Order: lexical hits by rank, then the others by cosine.
    ``hits``: the full-text side already searched (:func:`recall_lexical_hits` with the same
    scope, query and titles; its rows are used as they are), else it is searched here.
    ``titles``: the owning app's titles of the conversations found (memory key → title, called
    with the set of their keys, once per read of rows); without it, or for a key it leaves out,
    ``chat_title`` is ``""``. Storage errors propagate.
    """
    if hits is None:
        hits = recall_lexical_hits(
            scope_key=scope_key,
            memory_key=memory_key,
            boundary=boundary,
            scope=scope,
            query=query,
            limit=limit,
            titles=titles,
        )
    lexical, exact, identifiers = hits.lexical, hits.exact, hits.identifiers
    cosines: dict[int, float] = {}
    dense: list[int] = []
    if query_vector is not None and query_vector.size:
        vector = np.asarray(query_vector, dtype=np.float32).reshape(-1)

        def eligible(chats: np.ndarray, last_ids: np.ndarray) -> np.ndarray:
            here = (chats == memory_key) & (last_ids <= (boundary if boundary is not None else -1))
            return here | (chats != memory_key) if scope == "owner" else here

        nearest, extra = _vectors.search(
            scope_key,
            model=embedding_model,
            query=vector,
            read=_vector_reader(scope_key),
            eligible=eligible,
            limit=dense_limit if dense_limit is not None else min(limit, RECALL_DENSE_POOL),
            also=[*lexical, *exact],
        )
        dense = [hit.id for hit in nearest]
        cosines = {**extra, **{hit.id: hit.cosine for hit in nearest}}
    wanted = list(dict.fromkeys([*lexical, *exact, *dense]))
    if not wanted:
        return []
    # The full-text side's rows were read with its hits (while the query was being embedded).
    found = {item_id: hits.items[item_id] for item_id in wanted if item_id in hits.items}
    missing = [item_id for item_id in wanted if item_id not in hits.items]
    if missing:
        found.update(_scoped_items(missing, scope_key, memory_key, boundary, scope, titles))
    gone = [item_id for item_id in dense if item_id not in found]
    if gone:
        _vectors.forget(scope_key, gone)
    ranks = {item_id: rank for rank, item_id in enumerate(lexical, start=1)}
    folded = [value.casefold() for value in identifiers]
    dense_ids = set(dense)
    candidates = []
    for item_id in wanted:
        item = found.get(item_id)
        if item is None:
            continue
        lowered = item.text.casefold()
        identifier_match = any(value in lowered for value in folded)
        if item_id not in ranks and item_id not in dense_ids and not identifier_match:
            continue  # found only by an identifier's phrase, without the identifier verbatim
        candidates.append(
            RecallCandidate(
                item=item,
                lexical_rank=ranks.get(item_id),
                cosine=cosines.get(item_id),
                identifier_match=identifier_match,
            )
        )
    candidates.sort(
        key=lambda c: (
            c.lexical_rank is None,
            c.lexical_rank or 0,
            -(c.cosine if c.cosine is not None else -2.0),
        )
    )
    return candidates


_ITEM_COLUMNS = ("id", "memory_key", "message_ids", "role", "text", "token_count", "created_at")


def _item(row: Sequence[Any], *, title: str) -> RecallItem:
    """A :class:`RecallItem` of a row of :data:`_ITEM_COLUMNS`."""
    item_id, chat, message_ids, role, text, tokens, created_at = row
    return RecallItem(
        id=item_id,
        memory_key=chat,
        chat_title=title,
        message_ids=tuple(int(message_id) for message_id in message_ids),
        role=role,
        text=text,
        tokens=tokens,
        created_at=created_at,
    )


def recall_neighbors(
    *,
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    scope: Literal["chat", "owner"],
    anchors: Sequence[RecallItem],
) -> dict[int, tuple[RecallItem, ...]]:
    """The items next to each of ``anchors`` in its chat (docs/memory.md §12, "context"): anchor
    id → (the next item, the one before), in the chat's order (message id, then piece), each
    only when it exists and is in the same scope as :func:`recall_candidates` (never another
    owner's, never in this chat's retained window: at most ``boundary``). An anchor's chat title
    is its neighbours'. One statement for all anchors (two lookups each on the unique index of
    ``memory_key, last_message_id, piece``), one more for the rows. Storage errors propagate."""
    if not anchors:
        return {}
    scope_params = _scope_params(scope_key, memory_key, boundary, scope)
    # The first comparison lets the index seek; the second orders pieces of the same message.
    after = (
        "m.last_message_id >= a.last_message_id AND (m.last_message_id > a.last_message_id "
        "OR (m.last_message_id = a.last_message_id AND m.piece > a.piece))"
    )
    before = (
        "m.last_message_id <= a.last_message_id AND (m.last_message_id < a.last_message_id "
        "OR (m.last_message_id = a.last_message_id AND m.piece < a.piece))"
    )
    branches, params = [], []
    for anchor in anchors:
        for step, (condition, order) in enumerate(((after, ""), (before, " DESC"))):
            branches.append(
                f"SELECT {int(anchor.id)}, {step}, (SELECT m.id FROM memory_memoryitem m, memory_memoryitem a "
                f"WHERE a.id = {int(anchor.id)} AND m.memory_key = a.memory_key AND ({condition}) "
                f"AND {_scope_sql('m')} ORDER BY m.last_message_id{order}, m.piece{order} LIMIT 1)"
            )
            params.extend(scope_params)
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(branches), params)
        found = [(int(anchor_id), int(step), item_id) for anchor_id, step, item_id in cursor.fetchall() if item_id]
    rows = {row[0]: row for row in MemoryItem.objects.filter(pk__in=[f[2] for f in found]).values_list(*_ITEM_COLUMNS)}
    titles = {anchor.id: anchor.chat_title for anchor in anchors}
    neighbors: dict[int, list[RecallItem]] = {}
    for anchor_id, _, item_id in sorted(found, key=lambda f: (f[0], f[1])):
        if item_id in rows:
            neighbors.setdefault(anchor_id, []).append(_item(rows[item_id], title=titles[anchor_id]))
    return {anchor_id: tuple(items) for anchor_id, items in neighbors.items()}


def recall_cache_clear() -> None:
    """Forget this process's cached vectors and which owners have embeddings (tests; after
    switching the embedding model)."""
    _vectors.clear()
    _embedded_owners.clear()
    _unembedded_until.clear()


def token_calibration_get(*, model: str) -> calibration.Calibration:
    """The estimate calibration of chat model ``model`` (docs/memory.md §5, "Calibration"):
    the stored one, or factor 1.0 with no samples when none is stored. One SELECT."""
    row = TokenCalibration.objects.filter(model=model).first()
    return calibration.Calibration(model=model) if row is None else row.as_calibration()


def token_calibration_record(
    *, model: str, estimated_tokens: int, prompt_tokens: int | None
) -> calibration.Calibration:
    """Move ``model``'s calibration by one chat call: ``estimated_tokens`` our estimate of the
    request sent, ``prompt_tokens`` the provider's ``usage.prompt_tokens`` (None: not reported).
    The rule is :func:`memory.calibration.calibration_observe`; a call that gives no sample (no
    figure, a tiny request, an outlier) writes nothing. The row is read and written in one
    transaction under a row lock (SQLite: the transaction's write lock, taken at its start), so
    calls on several workers all count. Returns the calibration now."""
    if calibration.sample_ratio(estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens) is None:
        return token_calibration_get(model=model)
    with transaction.atomic():
        row = TokenCalibration.objects.select_for_update().filter(model=model).first()
        current = calibration.Calibration(model=model) if row is None else row.as_calibration()
        moved = calibration.calibration_observe(current, estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens)
        if row is None:
            try:
                with transaction.atomic():
                    TokenCalibration.objects.create(model=model, factor=moved.factor, samples=moved.samples)
            except IntegrityError:  # another worker stored the first sample meanwhile: count ours on top
                row = TokenCalibration.objects.select_for_update().get(model=model)
                moved = calibration.calibration_observe(
                    row.as_calibration(), estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens
                )
        if row is not None:
            TokenCalibration.objects.filter(pk=row.pk).update(
                factor=moved.factor, samples=moved.samples, updated_at=timezone.now()
            )
        return moved
