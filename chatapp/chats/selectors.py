"""Reads of the chat app (synchronous ORM code; async callers use ``database_sync_to_async``).

The knowledge-base search selector is :func:`chatapp.kb.search.kb_search`.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from chatapp.chats.access import Owner, session_queryset_for_owner
from chatapp.models import ChatSession, Message

SYNC_MAX_MESSAGES = 500
# Appended to a reply the user stopped, in the model-facing copy only (docs/memory.md F-37).
STOPPED_REPLY_MARKER = "… [reply stopped by the user]"


def session_list_for_owner(*, owner: Owner) -> QuerySet[ChatSession]:
    """The owner's chat sessions, most recently active first."""
    return session_queryset_for_owner(owner).order_by("-updated", "-id")


def session_newest_of_owner(*, owner: Owner, session_ids: frozenset[int]) -> int | None:
    """The newest (highest id) of the chat sessions ``session_ids`` that ``owner`` owns, or None
    (also for an empty set, without a query)."""
    if not session_ids:
        return None
    rows = session_queryset_for_owner(owner).filter(pk__in=session_ids)
    return rows.order_by("-pk").values_list("pk", flat=True).first()


def chat_session_get(*, session_id: int) -> ChatSession:
    """The chat session ``session_id`` (no access check: for code acting on a stored turn).
    Raises ``ChatSession.DoesNotExist``."""
    return ChatSession.objects.get(pk=session_id)


def chat_session_exists(*, session_id: int) -> bool:
    """Whether chat session ``session_id`` exists (False once it was deleted)."""
    return ChatSession.objects.filter(pk=session_id).exists()


def message_content_get(*, message_id: int) -> str:
    """The text of message ``message_id`` (``""`` for a message without text).
    Raises ``Message.DoesNotExist``."""
    return Message.objects.filter(pk=message_id).values_list("content", flat=True).get() or ""


def message_list(*, session_id: int) -> list[Message]:
    """Every message of the session in id order (for rendering a chat page)."""
    return list(Message.objects.filter(session_id=session_id).order_by("id"))


def message_list_after(*, session_id: int, after_id: int, limit: int = SYNC_MAX_MESSAGES) -> tuple[list[Message], bool]:
    """``(messages, more)``: up to ``limit`` messages of the session with an id above ``after_id``,
    ascending; ``more`` is True when further messages follow (ask again after the last id)."""
    rows = list(Message.objects.filter(session_id=session_id, id__gt=after_id).order_by("id")[: limit + 1])
    return rows[:limit], len(rows) > limit


def message_last_id(*, session_id: int) -> int | None:
    """The id of the session's newest message (None when it has none or is gone)."""
    return Message.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True).first()


def message_list_between(*, session_id: int, after_id: int, up_to_id: int, limit: int) -> list[Message]:
    """One page for reading a whole session with bounded memory (an export): at most ``limit``
    of its messages with ``after_id < id <= up_to_id``, ascending; ask again after the last id
    until a page comes back empty. ValueError for a ``limit`` below 1."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = Message.objects.filter(session_id=session_id, id__gt=after_id, id__lte=up_to_id)
    return list(rows.order_by("id")[:limit])


def message_list_for_context(*, session_id: int, boundary: int | None, turn_message_id: int) -> list[dict[str, Any]]:
    """The memory engine's increment for the turn opened by user message ``turn_message_id``.

    Every message of the session with an id above ``boundary`` (all when None), ascending id,
    never a page (docs/memory.md F-15), as wire dicts plus ``id``, ``token_count`` and ``created_at`` (the
    day markers of F-52; only keys that are set) -- except the messages of *other* turns stored after this turn's user message. Those
    belong to a concurrent turn (a second tab, docs/memory.md F-26); leaving them out keeps this turn's
    user message the current turn. Coverage is unaffected: the engine only summarizes history
    before the current turn, so the boundary never passes ``turn_message_id`` and the left-out
    messages stay in the increment of later requests.

    This is the model-facing copy of the history (docs/memory.md F-37): rows the app wrote in
    place of a reply (``origin`` ``app``: error notes, "too large" refusals, interrupted turns) are
    left out, so they are neither sent nor summarized; their turn is then a user message without
    a reply, which the engine treats as ordinary history (only the last user message opens the
    current turn). A reply the user stopped ends with :data:`STOPPED_REPLY_MARKER`, its
    ``token_count`` None so that the engine counts the marked text.
    """
    # Read on every request: written in SQL, so Django does not build and compile the query each
    # time (bench/ws_load.py profile, issue 11); the same rows as
    # Message.objects.filter(session_id=…).filter(Q(id__lte=turn) | Q(reply_to_id=turn))
    # .exclude(origin=APP).filter(id__gt=boundary).order_by("id").
    after = -1 if boundary is None else boundary
    rows = Message.objects.raw(
        _CONTEXT_SQL, [session_id, turn_message_id, turn_message_id, str(Message.Origin.APP.value), after]
    )
    return [_model_facing(row) for row in rows]


_CONTEXT_SQL = (
    f"SELECT * FROM {Message._meta.db_table} WHERE session_id = %s AND (id <= %s OR reply_to_id = %s) "
    "AND origin <> %s AND id > %s ORDER BY id"
)


def _model_facing(row: Message) -> dict[str, Any]:
    """``row`` as the engine reads it: its wire dict plus ``id`` and ``token_count`` (tokens), a
    stopped reply marked as cut off (docs/memory.md F-37)."""
    if row.status == Message.Status.STOPPED and row.role == Message.Role.ASSISTANT and not row.tool_calls:
        content = f"{(row.content or '').rstrip()}{STOPPED_REPLY_MARKER}"
        return {"id": row.pk, **row.to_wire(), "content": content, "token_count": None, "created_at": row.created}
    return {"id": row.pk, **row.to_wire(), "token_count": row.token_count, "created_at": row.created}


def message_last_user_id(*, session_id: int) -> int | None:
    """The id of the session's newest user message (None when it has none)."""
    return (
        Message.objects.filter(session_id=session_id, role=Message.Role.USER)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )


def turn_replies_get(*, user_message: Message) -> list[Message]:
    """The stored assistant and tool messages of the turn ``user_message`` opened, in id order."""
    return list(Message.objects.filter(reply_to=user_message).order_by("id"))


def memory_job_subject_get(*, session_id: int) -> tuple[str, int] | None:
    """What a memory job needs to know of session ``session_id`` (docs/memory.md §10): its mode
    and the id of its newest message, or None when the session is gone or has no message."""
    session = ChatSession.objects.filter(pk=session_id).values_list("mode", flat=True).first()
    if session is None:
        return None
    last_id = Message.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True).first()
    return None if last_id is None else (session, last_id)
