"""Reads of the chat app, synchronous ORM code; the knowledge-base search is :func:`chatapp.kb.search.kb_search`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db.models import Max, QuerySet
from django.http import Http404

from chatapp.chats.access import Owner, session_queryset_for_owner
from chatapp.models import ChatSession, Message, ReplyVersion

SYNC_MAX_MESSAGES = 500
# Appended to a reply the user stopped, in the model-facing copy only (docs/memory.md F-37).
STOPPED_REPLY_MARKER = "… [reply stopped by the user]"
CUT_OFF_REPLY_MARKER = "… [reply cut off at the token limit]"
# Either marker as a model may copy it into its own reply.
_ECHOED_MARKER_RE = re.compile(r"[ \t]*(?:…|\.\.\.)?[ \t]*\[reply (?:cut off at the token limit|stopped by the user)\]")


def echoed_markers_removed(text: str) -> str:
    """``text`` without the ending markers sent to the model after cut-off or stopped replies: a model that copies
    them would store a finished reply that reads as cut off. The text as it was when nothing else is left."""
    cleaned = _ECHOED_MARKER_RE.sub("", text)
    return cleaned if cleaned.strip() else text


def session_list_for_owner(*, owner: Owner) -> QuerySet[ChatSession]:
    return session_queryset_for_owner(owner).order_by("-updated", "-id")


def session_newest_of_owner(*, owner: Owner, session_ids: frozenset[int]) -> int | None:
    if not session_ids:
        return None
    rows = session_queryset_for_owner(owner).filter(pk__in=session_ids)
    return rows.order_by("-pk").values_list("pk", flat=True).first()


def chat_session_get(*, session_id: int) -> ChatSession:
    """No access check: for code acting on a stored turn. Raises ``ChatSession.DoesNotExist``."""
    return ChatSession.objects.get(pk=session_id)


def chat_session_exists(*, session_id: int) -> bool:
    return ChatSession.objects.filter(pk=session_id).exists()


def message_content_get(*, message_id: int) -> str:
    return Message.objects.filter(pk=message_id).values_list("content", flat=True).get() or ""


def message_list(*, session_id: int) -> list[Message]:
    return list(Message.objects.filter(session_id=session_id).order_by("id"))


def message_list_after(*, session_id: int, after_id: int, limit: int = SYNC_MAX_MESSAGES) -> tuple[list[Message], bool]:
    """``(messages, more)``: up to ``limit`` messages above ``after_id``, ascending; ``more``: further ones follow."""
    rows = list(Message.objects.filter(session_id=session_id, id__gt=after_id).order_by("id")[: limit + 1])
    return rows[:limit], len(rows) > limit


def message_last_id(*, session_id: int) -> int | None:
    return Message.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True).first()


def message_list_between(*, session_id: int, after_id: int, up_to_id: int, limit: int) -> list[Message]:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = Message.objects.filter(session_id=session_id, id__gt=after_id, id__lte=up_to_id)
    return list(rows.order_by("id")[:limit])


def message_list_for_context(*, session_id: int, boundary: int | None, turn_message_id: int) -> list[dict[str, Any]]:
    """The memory engine's increment: every message above ``boundary`` (never a page, F-15) as wire dicts with ``id``,
    ``token_count`` and ``created_at`` (day markers, F-52), without other turns' later messages (F-26) or app-written
    rows, a stopped or cut-off reply marked (docs/memory.md F-37). The turn's own messages are always in it (I2), even where another
    turn's compression folded them because keeping them would have overflowed the window."""
    # Raw SQL: read on every request, where building the same ORM query each time cost CPU.
    after = -1 if boundary is None else boundary
    turn = turn_message_id
    rows = Message.objects.raw(_CONTEXT_SQL, [session_id, turn, turn, str(Message.Origin.APP.value), after, turn, turn])
    return [_model_facing(row) for row in rows]


_CONTEXT_SQL = (
    f"SELECT * FROM {Message._meta.db_table} WHERE session_id = %s AND (id <= %s OR reply_to_id = %s) "
    "AND origin <> %s AND (id > %s OR id = %s OR reply_to_id = %s) ORDER BY id"
)


_ENDING_MARKERS: dict[str, str] = {
    Message.Status.STOPPED.value: STOPPED_REPLY_MARKER,
    Message.Status.CUT_OFF.value: CUT_OFF_REPLY_MARKER,
}


def _model_facing(row: Message) -> dict[str, Any]:
    marker = _ENDING_MARKERS.get(row.status)
    if marker is not None and row.role == Message.Role.ASSISTANT and not row.tool_calls:
        content = f"{(row.content or '').rstrip()}{marker}"
        return {"id": row.pk, **row.to_wire(), "content": content, "token_count": None, "created_at": row.created}
    return {"id": row.pk, **row.to_wire(), "token_count": row.token_count, "created_at": row.created}


def message_last_user_id(*, session_id: int) -> int | None:
    return (
        Message.objects.filter(session_id=session_id, role=Message.Role.USER)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )


@dataclass(frozen=True, kw_only=True)
class Lineage:
    """Where a chat and its edited copies diverge (docs/memory.md §8, "Edit into a new chat"): ``parent``, the chat
    this one copies (None when it is no copy, or its original was deleted), ``edited_id`` the copy's edited message,
    ``forks`` the copies made from this chat."""

    parent: ChatSession | None = None
    edited_id: int | None = None
    forks: tuple[ChatSession, ...] = ()

    @property
    def fork_points(self) -> frozenset[int]:
        """This chat's messages that were edited into a copy."""
        return frozenset(fork.forked_at_message_id for fork in self.forks if fork.forked_at_message_id is not None)


def chat_lineage_get(*, session: ChatSession) -> Lineage:
    """The chat's :class:`Lineage`: two queries, one more for a copy."""
    parent = ChatSession.objects.filter(pk=session.forked_from_id).first() if session.forked_from_id else None
    edited = None
    if session.forked_from_id or session.forked_at_message_id:
        edited = (
            Message.objects.filter(session=session, role=Message.Role.USER, client_message_id__startswith="edit-")
            .order_by("id")
            .values_list("id", flat=True)
            .first()
        )
    forks = tuple(ChatSession.objects.filter(forked_from=session).order_by("id"))
    return Lineage(parent=parent, edited_id=edited, forks=forks)


def reply_version_get(*, session_id: int, turn_id: int, number: int) -> tuple[ReplyVersion, int]:
    """Earlier version ``number`` of the reply to turn ``turn_id`` of the session and how many versions the reply has
    (the current one included). Raises ``Http404`` when there is no such version."""
    version = ReplyVersion.objects.filter(turn__session_id=session_id, turn_id=turn_id, number=number).first()
    if version is None:
        raise Http404("No such version of this reply.")
    current = Message.objects.filter(reply_to_id=turn_id).aggregate(latest=Max("version"))["latest"]
    earlier = ReplyVersion.objects.filter(turn_id=turn_id).aggregate(latest=Max("number"))["latest"] or 0
    return version, max(current or 0, earlier + 1)


def turn_replies_get(*, user_message: Message) -> list[Message]:
    return list(Message.objects.filter(reply_to=user_message).order_by("id"))


def memory_job_subject_get(*, session_id: int) -> tuple[str, int] | None:
    """``(mode, newest message id)`` for a memory job (docs/memory.md §10), or None: no session or no message."""
    session = ChatSession.objects.filter(pk=session_id).values_list("mode", flat=True).first()
    if session is None:
        return None
    last_id = Message.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True).first()
    return None if last_id is None else (session, last_id)
