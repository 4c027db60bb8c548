"""Key facts in the database (docs/memory.md §11): store, supersede, pin, hide and edit; nothing is deleted."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connection, transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from memory.facts import operations as fact_ops
from memory.facts import rules as fact_rules
from memory.facts import scope as fact_scope
from memory.facts import values as fact_values
from memory.models import KeyFact
from memory.ports import ConversationAlive, RunSync
from memory.text.provenance import own_text
from memory.text.secrets import secret_spans

logger = logging.getLogger(__name__)


class KeyFactNotFound(Exception):
    """No such fact in that conversation: unknown or another chat's (the app answers 404 either way)."""


# Tries of a write that lost a race on the one-active-value constraint; a retry finds the winner as a restatement.
FACT_WRITE_TRIES = 3


# Fact ids are 64-bit database keys; a larger id names no fact (and would overflow the driver).
FACT_ID_MAX = 2**63 - 1


def _facts_with_replaces(rows: QuerySet[KeyFact]) -> QuerySet[KeyFact]:
    """``rows`` with ``replaces_value`` (the newest value each one superseded), in the same query."""
    replaced = KeyFact.objects.filter(superseded_by=OuterRef("pk")).order_by("-id").values("value")[:1]
    return rows.annotate(replaces_value=Subquery(replaced))


def key_fact_list_active(*, memory_key: str) -> list[fact_values.KeyFact]:
    """Active, unhidden facts, oldest first, ``replaces`` filled: a request's ``load_facts``. Fixed SQL, as it
    runs every request and Django would build and compile the query each time."""
    return [row.as_fact() for row in KeyFact.objects.raw(_ACTIVE_FACTS_SQL, [memory_key])]


# The rows of _facts_with_replaces over active, unhidden facts (tests/memory/test_key_fact_services.py compares).
_ACTIVE_FACTS_SQL = (
    f"SELECT f.*, (SELECT r.value FROM {KeyFact._meta.db_table} r WHERE r.superseded_by_id = f.id "
    f"ORDER BY r.id DESC LIMIT 1) AS replaces_value FROM {KeyFact._meta.db_table} f "
    "WHERE f.memory_key = %s AND f.invalidated_at IS NULL AND NOT f.hidden_by_user ORDER BY f.id"
)


def key_fact_list_for_owner(*, memory_key: str, scope_key: str) -> list[fact_values.KeyFact]:
    """A request's ``load_facts`` with owner-wide facts (docs/memory.md §11 "Owner-wide"): the chat's active facts and
    the personal-slot facts of owner ``scope_key``'s chats, current and ended, read in one query over the chat's and
    the owner's indexes, resolved by :func:`memory.facts.scope.owner_view`. Another owner's facts are never read."""
    with connection.cursor() as cursor:
        cursor.execute(_OWNER_FACTS_SQL, [memory_key, scope_key, *_PERSONAL_KEYS])
        rows = cursor.fetchall()
    return fact_scope.owner_view(_fact_of_row(row, memory_key=memory_key) for row in rows)


_PERSONAL_KEYS = sorted(fact_scope.PERSONAL_SLOTS)


# Read as plain rows: an owner's personal facts of many chats would cost a model instance each.
_OWNER_FACT_COLUMNS = (
    "id",
    "memory_key",
    "kind",
    "key",
    "value",
    "text",
    "source_message_id",
    "excerpt",
    "extractor",
    "valid_from",
    "invalidated_at",
    "superseded_by_id",
    "pinned_by_user",
    "hidden_by_user",
    "last_seen_message_id",
    "operation",
    "polarity",
    "provenance",
    "changed_by_message_id",
)


# _ACTIVE_FACTS_SQL's chat, or a personal slot of the owner's (each term has its index: SQLite's OR optimization,
# PostgreSQL's BitmapOr).
_OWNER_FACTS_SQL = (
    f"SELECT {', '.join(f'f.{column}' for column in _OWNER_FACT_COLUMNS)}, "
    f"(SELECT r.value FROM {KeyFact._meta.db_table} r WHERE r.superseded_by_id = f.id "
    f"ORDER BY r.id DESC LIMIT 1) AS replaces_value FROM {KeyFact._meta.db_table} f "
    "WHERE (f.memory_key = %s AND f.invalidated_at IS NULL AND NOT f.hidden_by_user) "
    f"OR (f.scope_key = %s AND f.key IN ({', '.join(['%s'] * len(_PERSONAL_KEYS))}) AND NOT f.hidden_by_user) "
    "ORDER BY f.id"
)


def _fact_of_row(row: Sequence[Any], *, memory_key: str) -> fact_values.KeyFact:
    """A fact from a row of ``_OWNER_FACTS_SQL``; ``chat`` set for another chat's."""
    (
        fact_id,
        chat,
        kind,
        key,
        value,
        text,
        source_message_id,
        excerpt,
        extractor,
        valid_from,
        invalidated_at,
        superseded_by,
        pinned_by_user,
        hidden_by_user,
        last_seen_message_id,
        operation,
        polarity,
        provenance,
        changed_by_message_id,
        replaces,
    ) = row
    return fact_values.KeyFact(
        id=fact_id,
        kind=kind,
        key=key,
        value=value,
        text=text,
        source_message_id=source_message_id,
        excerpt=excerpt,
        extractor=extractor,
        valid_from=_aware(valid_from),
        invalidated_at=_aware(invalidated_at),
        superseded_by=superseded_by,
        pinned_by_user=bool(pinned_by_user),
        hidden_by_user=bool(hidden_by_user),
        last_seen_message_id=last_seen_message_id,
        replaces=replaces or "",
        operation=operation,
        polarity=polarity,
        provenance=provenance,
        changed_by_message_id=changed_by_message_id,
        chat="" if chat == memory_key else chat,
    )


def _aware(value: datetime | str | None) -> datetime | None:
    """A datetime column as the ORM gives it: SQLite's are naive (or text without its converter), in the
    connection's time zone."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is None or value.tzinfo is not None:
        return value
    return timezone.make_aware(value, connection.timezone)


def key_fact_list(*, memory_key: str) -> list[fact_values.KeyFact]:
    """Every fact, oldest first, retired and hidden ones included (the inspector's list), ``replaces`` filled."""
    return [row.as_fact() for row in _facts_with_replaces(KeyFact.objects.filter(memory_key=memory_key))]


def _fact_get(*, memory_key: str, fact_id: int) -> fact_values.KeyFact:
    if not 0 < fact_id <= FACT_ID_MAX:
        raise KeyFactNotFound(f"no key fact {fact_id} in {memory_key}")
    row = _facts_with_replaces(KeyFact.objects.filter(pk=fact_id, memory_key=memory_key)).first()
    if row is None:
        raise KeyFactNotFound(f"no key fact {fact_id} in {memory_key}")
    return row.as_fact()


def _storable(candidate: fact_values.FactCandidate) -> bool:
    """Fits its columns unchanged: a verbatim value is never cut."""
    return (
        bool(candidate.value)
        and len(candidate.value) <= fact_values.MAX_VALUE_CHARS
        and bool(candidate.key)
        and len(candidate.key) <= fact_values.MAX_KEY_CHARS
    )


def _fact_row(
    candidate: fact_values.FactCandidate,
    *,
    memory_key: str,
    scope_key: str,
    extractor: str,
    valid_from: datetime | None,
) -> KeyFact:
    kind = candidate.kind if candidate.kind in fact_values.FACT_KINDS else "other"
    return KeyFact(
        memory_key=memory_key,
        scope_key=scope_key,
        kind=kind,
        key=candidate.key,
        value=candidate.value,
        text=(candidate.text or candidate.value)[: fact_values.MAX_TEXT_CHARS],
        source_message_id=candidate.source_message_id,
        excerpt=candidate.excerpt,
        extractor=extractor[:64],
        valid_from=valid_from,
        last_seen_message_id=candidate.source_message_id,
        operation="add" if candidate.operation == "retract" else candidate.operation,
        polarity=candidate.polarity,
        provenance=candidate.provenance,
    )


def _fact_write_retried(
    write: Callable[[], list[fact_values.KeyFact]], *, memory_key: str, give_up_quietly: bool = True
) -> list[fact_values.KeyFact]:
    """Run ``write`` in a savepoint, again after a lost race (IntegrityError), :data:`FACT_WRITE_TRIES` times;
    then ``[]`` with ``give_up_quietly`` (a fact must not fail the caller's stored message), else raise."""
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


def key_facts_store_rule(
    *, memory_key: str, scope_key: str, messages: list[dict[str, Any]], owner_wide: bool = False
) -> list[fact_values.KeyFact]:
    """Store the rule facts of just-stored messages (dicts with ``id``, ``role``, ``content``, ``tool_calls``,
    ``created_at``); returns those created (docs/memory.md §11 "Rule extraction"). A value an active fact of its slot
    holds only moves its ``last_seen_message_id``; a correction or update supersedes the slot's newest value, a
    withdrawal retracts what it names (F-46, F-48). With ``owner_wide``, a withdrawal of a personal fact another of the
    owner's chats holds is recorded here as a retracted copy; that chat's row is untouched ("Owner-wide"). No query
    when no message yields a candidate or a withdrawal."""
    found: list[tuple[fact_values.FactCandidate, datetime | None]] = []
    withdrawals: list[tuple[str, int, datetime | None]] = []
    for message in messages:
        created_at = message.get("created_at")
        valid_from = created_at if isinstance(created_at, datetime) else None
        found.extend(
            (candidate, valid_from) for candidate in fact_rules.message_rule_facts(message) if _storable(candidate)
        )
        text = message.get("content") if message.get("role") == "user" else None
        text = own_text(text) if isinstance(text, str) else None  # a quoted "no longer" withdraws nothing (F-49)
        if text and isinstance(message.get("id"), int) and fact_ops.withdrawal_sentences(text):
            withdrawals.append((text, message["id"], valid_from))
    if not found and not withdrawals:
        return []

    def write() -> list[fact_values.KeyFact]:
        changing = withdrawals or any(candidate.operation != "add" for candidate, _ in found)
        rows = KeyFact.objects.filter(memory_key=memory_key, invalidated_at__isnull=True)
        if not changing:
            rows = rows.filter(value__in={candidate.value for candidate, _ in found})
        elif withdrawals and owner_wide:
            rows = KeyFact.objects.filter(
                Q(memory_key=memory_key) | Q(scope_key=scope_key, key__in=_PERSONAL_KEYS), invalidated_at__isnull=True
            )
        fetched = list(rows)
        current = [row.as_fact() for row in fetched if row.memory_key == memory_key]
        elsewhere = [replace(row.as_fact(), chat=row.memory_key) for row in fetched if row.memory_key != memory_key]
        elsewhere = [fact for fact in elsewhere if fact_scope.owner_wide(fact)]
        new: dict[str, KeyFact] = {}
        restated: dict[int, set[int]] = {}
        ended: dict[int, tuple[int, KeyFact | str]] = {}  # fact id -> (message id, new row or "retract")
        withdrawn_elsewhere: dict[tuple[str, str], KeyFact] = {}
        now = timezone.now()
        for text, message_id, said_at in withdrawals:
            for fact in fact_ops.withdrawn(text, current):
                ended.setdefault(fact.id, (message_id, "retract"))
            own_values = {(fact.key, fact.value.casefold()) for fact in current}
            for fact in fact_ops.withdrawn(text, [*current, *elsewhere]):
                if fact.chat and (fact.key, fact.value.casefold()) not in own_values:
                    withdrawn_elsewhere.setdefault(
                        (fact.key, fact.value.casefold()),
                        _retracted_copy(
                            fact,
                            memory_key=memory_key,
                            scope_key=scope_key,
                            text=text,
                            message_id=message_id,
                            said_at=said_at,
                            now=now,
                        ),
                    )
        for candidate, valid_from in found:
            message_id = candidate.source_message_id
            held = [fact.id for fact in current if fact.value == candidate.value and fact.id not in ended]
            if candidate.operation == "retract":
                for fact_id in held:
                    ended.setdefault(fact_id, (message_id, "retract"))
            elif held:
                restated.setdefault(message_id, set()).update(held)
            elif candidate.value in new:
                row = new[candidate.value]
                row.last_seen_message_id = max(row.last_seen_message_id or 0, message_id)
            else:
                old = None
                if candidate.operation in ("supersede", "correct"):
                    old = fact_ops.corrected(candidate, [f for f in current if f.id not in ended])
                if old is not None and candidate.key != old.key:
                    candidate = replace(candidate, key=old.key)
                new[candidate.value] = _fact_row(
                    candidate, memory_key=memory_key, scope_key=scope_key, extractor="rule", valid_from=valid_from
                )
                if old is not None:
                    ended[old.id] = (message_id, new[candidate.value])
        created = KeyFact.objects.bulk_create(list(new.values())) if new else []
        if withdrawn_elsewhere:
            KeyFact.objects.bulk_create(list(withdrawn_elsewhere.values()))
        for fact_id, (message_id, by) in ended.items():
            KeyFact.objects.filter(pk=fact_id, pinned_by_user=False).update(
                invalidated_at=now,
                superseded_by=None if by == "retract" else by,
                changed_by_message_id=message_id,
                updated_at=now,
            )
        for message_id in sorted(restated):
            KeyFact.objects.filter(
                Q(last_seen_message_id__isnull=True) | Q(last_seen_message_id__lt=message_id),
                pk__in=restated[message_id],
            ).update(last_seen_message_id=message_id, updated_at=now)
        replaced = {by.pk: fact_id for fact_id, (_, by) in ended.items() if isinstance(by, KeyFact)}
        values = {fact.id: fact.value for fact in current}
        return [row.as_fact(replaces=values.get(replaced.get(row.pk, 0), "")) for row in created]

    return _fact_write_retried(write, memory_key=memory_key)


def _retracted_copy(
    fact: fact_values.KeyFact,
    *,
    memory_key: str,
    scope_key: str,
    text: str,
    message_id: int,
    said_at: datetime | None,
    now: datetime,
) -> KeyFact:
    """This chat's record that message ``message_id`` (``text``, said at ``said_at``) withdrew ``fact`` of another
    chat: a copy of its slot and value, retracted by that message and dated by it, so the owner's other chats see
    when the withdrawal came (§11 "Owner-wide")."""
    at = re.search(re.escape(fact.value), text, re.IGNORECASE)
    start, end = (at.start(), at.end()) if at else (0, 0)
    return KeyFact(
        memory_key=memory_key,
        scope_key=scope_key,
        kind=fact.kind if fact.kind in fact_values.FACT_KINDS else "other",
        key=fact.key,
        value=fact.value,
        text=fact.text,
        source_message_id=message_id,
        excerpt=fact_rules.excerpt_around(text, start, end, secrets=secret_spans(text)),
        extractor="rule",
        valid_from=said_at,
        invalidated_at=said_at or now,
        last_seen_message_id=message_id,
        changed_by_message_id=message_id,
        operation="retract",
        polarity=fact.polarity,
        provenance=fact.provenance,
    )


def key_facts_apply(
    *,
    memory_key: str,
    scope_key: str,
    candidates: list[fact_values.FactCandidate],
    valid_from: dict[int, datetime],
    alive: ConversationAlive | None = None,
) -> list[fact_values.KeyFact]:
    """Store validated extraction candidates and retire what they supersede (same slot, unpinned) in one
    transaction; returns the facts created, ``replaces`` filled (docs/memory.md §11, F-28). A ``retract`` ends what it
    names, a preference ends the other polarity's value of its topic (F-46, F-47). Restatements and values retired
    since their message (no revival) are skipped; nothing is written once ``alive`` fails (F-41)."""
    storable = [candidate for candidate in candidates if _storable(candidate)]
    if not storable:
        return []

    def write() -> list[fact_values.KeyFact]:
        if alive is not None and not alive(memory_key):
            return []
        active = set(
            KeyFact.objects.filter(
                memory_key=memory_key,
                invalidated_at__isnull=True,
                value__in={candidate.value for candidate in storable},
            ).values_list("key", "value")
        )
        retired_seen: dict[tuple[str, str], int] = {}
        for key, value, *seen in KeyFact.objects.filter(
            memory_key=memory_key,
            invalidated_at__isnull=False,
            value__in={candidate.value for candidate in storable},
        ).values_list("key", "value", "source_message_id", "last_seen_message_id", "changed_by_message_id"):
            retired_seen[(key, value)] = max(retired_seen.get((key, value), 0), *(n or 0 for n in seen))
        wanted = {fact_id for candidate in storable for fact_id in candidate.supersedes}
        rows = KeyFact.objects.filter(memory_key=memory_key, invalidated_at__isnull=True, pinned_by_user=False)
        rows = rows.filter(Q(pk__in=wanted) | Q(kind="preference"))
        if connection.features.has_select_for_update:
            rows = rows.select_for_update()
        retirable: dict[int, KeyFact] = {row.pk: row for row in rows}
        retracted: dict[int, int] = {}
        for candidate in (candidate for candidate in storable if candidate.operation == "retract"):
            for fact_id in candidate.supersedes:
                old = retirable.get(fact_id)
                if old is not None and (old.key == candidate.key or fact_ops.same_topic(old.value, candidate.value)):
                    retracted[retirable.pop(fact_id).pk] = candidate.source_message_id
        planned: list[tuple[KeyFact, list[KeyFact]]] = []
        for candidate in storable:
            if candidate.operation == "retract" or (candidate.key, candidate.value) in active:
                continue
            if candidate.source_message_id <= retired_seen.get((candidate.key, candidate.value), -1):
                continue  # replaced after that message: not revived by a late extraction
            active.add((candidate.key, candidate.value))
            row = _fact_row(
                candidate,
                memory_key=memory_key,
                scope_key=scope_key,
                extractor=candidate.extractor,
                valid_from=valid_from.get(candidate.source_message_id),
            )
            ends = [
                fact_id
                for fact_id in dict.fromkeys(candidate.supersedes)
                if fact_id in retirable and retirable[fact_id].key == candidate.key
            ]
            ends += [
                old.pk
                for old in retirable.values()
                if old.pk not in ends and fact_ops.turns_around(candidate, old.as_fact())
            ]
            retired = [retirable.pop(fact_id) for fact_id in ends]
            planned.append((row, sorted(retired, key=lambda old: old.pk)))
        now = timezone.now()
        for fact_id, message_id in retracted.items():
            KeyFact.objects.filter(pk=fact_id).update(
                invalidated_at=now, changed_by_message_id=message_id, updated_at=now
            )
        if not planned:
            return []
        KeyFact.objects.bulk_create([row for row, _ in planned])
        for row, retired in planned:
            if retired:
                KeyFact.objects.filter(pk__in=[old.pk for old in retired]).update(
                    invalidated_at=now, superseded_by=row, changed_by_message_id=row.source_message_id, updated_at=now
                )
        return [row.as_fact(replaces=retired[-1].value if retired else "") for row, retired in planned]

    return _fact_write_retried(write, memory_key=memory_key)


def key_fact_pin(*, memory_key: str, fact_id: int, pinned: bool) -> fact_values.KeyFact:
    """Pin or unpin a fact (kept in the block, superseded only by the owner's edit; docs/memory.md §11); returns it
    as stored. Raises :class:`KeyFactNotFound`."""
    if 0 < fact_id <= FACT_ID_MAX:
        KeyFact.objects.filter(pk=fact_id, memory_key=memory_key).update(
            pinned_by_user=pinned, updated_at=timezone.now()
        )
    return _fact_get(memory_key=memory_key, fact_id=fact_id)


def key_fact_hide(*, memory_key: str, fact_id: int, hidden: bool) -> fact_values.KeyFact:
    """Hide or restore a fact (a hidden fact is never put in a request); returns it as stored. Raises
    :class:`KeyFactNotFound`."""
    if 0 < fact_id <= FACT_ID_MAX:
        KeyFact.objects.filter(pk=fact_id, memory_key=memory_key).update(
            hidden_by_user=hidden, updated_at=timezone.now()
        )
    return _fact_get(memory_key=memory_key, fact_id=fact_id)


def key_fact_edit(*, memory_key: str, fact_id: int, value: str) -> fact_values.KeyFact:
    """The owner's correction (docs/memory.md §11): a new ``user`` fact of the slot holding ``value`` (or the active
    one already holding it, shown again) supersedes this one, even if pinned; returns the current fact. Raises
    :class:`KeyFactNotFound`, ``ValueError`` (empty, over ``MAX_VALUE_CHARS``, already superseded), and
    ``IntegrityError`` after :data:`FACT_WRITE_TRIES` lost races."""
    value = " ".join(value.split())
    if not value:
        raise ValueError("a key fact needs a value")
    if len(value) > fact_values.MAX_VALUE_CHARS:
        raise ValueError(f"a key fact's value has at most {fact_values.MAX_VALUE_CHARS} characters")
    if not 0 < fact_id <= FACT_ID_MAX:
        raise KeyFactNotFound(f"no key fact {fact_id} in {memory_key}")

    def write() -> list[fact_values.KeyFact]:
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
                text=(old.text.replace(old.value, value) if old.value in old.text else value)[
                    : fact_values.MAX_TEXT_CHARS
                ],
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


class OrmFactStore:
    """:class:`memory.facts.store.FactStore` over the database; ``run_sync`` picks the thread, ``alive`` guards
    writes (F-41)."""

    def __init__(self, *, run_sync: RunSync = sync_to_async, alive: ConversationAlive | None = None) -> None:
        self.run_sync = run_sync
        self.alive = alive

    async def active(self, memory_key: str, *, scope_key: str | None = None) -> list[fact_values.KeyFact]:
        if scope_key is not None:
            owned: list[fact_values.KeyFact] = await self.run_sync(key_fact_list_for_owner)(
                memory_key=memory_key, scope_key=scope_key
            )
            return owned
        facts: list[fact_values.KeyFact] = await self.run_sync(key_fact_list_active)(memory_key=memory_key)
        return facts

    async def every(self, memory_key: str) -> list[fact_values.KeyFact]:
        facts: list[fact_values.KeyFact] = await self.run_sync(key_fact_list)(memory_key=memory_key)
        return facts

    async def apply(
        self,
        memory_key: str,
        *,
        scope_key: str,
        candidates: Sequence[fact_values.FactCandidate],
        valid_from: Mapping[int, datetime],
    ) -> list[fact_values.KeyFact]:
        created: list[fact_values.KeyFact] = await self.run_sync(key_facts_apply)(
            memory_key=memory_key,
            scope_key=scope_key,
            candidates=list(candidates),
            valid_from=dict(valid_from),
            alive=self.alive,
        )
        return created
