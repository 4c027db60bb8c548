"""Writes of the chat app: sessions, messages and model-call records (synchronous ORM code); a stored message reaches
the session's sockets only after the commit."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from chatapp.chats.access import Owner
from chatapp.chats.memory import chat_session_lock, memory_engine, memory_key_of, session_scope_key
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession, Message, ModelCall, TurnLease
from chatapp.realtime.broadcast import event_broadcast_on_commit, session_sockets_close_on_commit
from chatapp.realtime.protocol import ChatMessageEvent
from memory.api import KeyFact, get_counter, value_spans

# Titles from a first message (docs/memory.md §11): at most 60 characters (a rename allows 200), without the values
# of these kinds (amounts and dates stay), each left out as "…"; under 2 letters left: "Chat <id>".
TITLE_MAX_CHARS = 60
TITLE_HIDDEN_KINDS = frozenset({"id", "email", "phone", "url", "secret"})
TITLE_ELISION = "…"
TITLE_MIN_LETTERS = 2
_ELISIONS = re.compile(r"…(?:[\s,;:/&+-]*…)+")


def chat_session_create(*, owner: Owner, mode: str, title: str = "") -> ChatSession:
    """A new chat session of a user, else of a browser session key. Raises ``ValueError`` for an owner with neither
    or an unknown ``mode``."""
    if mode not in ChatSession.Mode.values:
        raise ValueError(f"unknown chat mode {mode!r}")
    if owner.user_id is None and not owner.session_key:
        raise ValueError("a chat session needs a user or a browser session key as its owner")
    return ChatSession.objects.create(
        owner_id=owner.user_id,
        owner_session_key="" if owner.user_id is not None else owner.session_key or "",
        mode=mode,
        title=title[:200],
    )


def title_plain(text: str) -> str:
    """``text`` on one line without bidirectional controls, which would reorder the chat list around a title."""
    return " ".join(text.translate(_BIDI_CONTROLS).split())


# Embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) and the direction marks.
_BIDI_CONTROLS = dict.fromkeys([*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C])


def chat_session_title_from_text(*, text: str, session_id: int) -> str:
    """The chat's title from its first message, on one line without bidirectional controls, cut at a word; pure.
    Values are left out before the cut, so half a value cannot slip through."""
    text = text.translate(_BIDI_CONTROLS)
    kept: list[str] = []
    position = 0
    for start, end, kind in value_spans(text):
        if kind in TITLE_HIDDEN_KINDS:
            kept += [text[position:start], TITLE_ELISION]
            position = end
    kept.append(text[position:])
    title = " ".join("".join(kept).split())
    title = _ELISIONS.sub(TITLE_ELISION, title)
    title = title.replace(f"{TITLE_ELISION}.", TITLE_ELISION)  # "account ACC-7731." -> "account …"
    if sum(character.isalpha() for character in title) < TITLE_MIN_LETTERS:
        return f"Chat {session_id}"
    if len(title) > TITLE_MAX_CHARS:
        cut = title[: TITLE_MAX_CHARS - 1]
        space = cut.rfind(" ")
        if space > TITLE_MAX_CHARS // 2:
            cut = cut[:space]
        cut = cut.rstrip(" ,;:-")
        # A cut right after a left-out value: its "…" marks the cut too.
        title = cut if cut.endswith(TITLE_ELISION) else cut + TITLE_ELISION
    return title


def chat_session_rename(*, session: ChatSession, title: str) -> ChatSession:
    """Rename without moving the chat in the list; at most 200 characters, empty shows "Chat <id>"."""
    session.title = title_plain(title)[:200]
    ChatSession.objects.filter(pk=session.pk).update(title=session.title)
    return session


def chat_session_mode_set(*, session: ChatSession, mode: str) -> ChatSession:
    """Switch ``session`` to ``mode`` from its next turn on. Raises ``ValueError`` for an unknown mode."""
    if mode not in ChatSession.Mode.values:
        raise ValueError(f"unknown chat mode {mode!r}")
    session.mode = mode
    ChatSession.objects.filter(pk=session.pk).update(mode=mode)
    return session


def chat_session_delete(*, session: ChatSession) -> None:
    """Delete ``session`` and its memory state in one transaction, the row locked first so that no running memory
    write survives it (docs/memory.md F-41); then its sockets stop its turns and close with 4404."""
    session_id = session.pk
    with transaction.atomic():
        chat_session_lock(session_id)
        memory_engine().forget(memory_key_of(session_id))
        session.delete()
        session_sockets_close_on_commit(session_id)


def message_facts_store(*, message: Message, scope_key: str | None = None) -> list[KeyFact]:
    """Store the rule key facts of a just-stored user message or tool call (docs/memory.md §11), inside its
    transaction; returns them. No query without a candidate; ``scope_key`` is read when not given."""
    if message.origin == Message.Origin.APP:
        return []
    if not (message.role == Message.Role.USER or (message.role == Message.Role.ASSISTANT and message.tool_calls)):
        return []
    stored = {
        "id": message.pk,
        "role": message.role,
        "content": message.content,
        "tool_calls": message.tool_calls,
        "created_at": timezone.localtime(message.created) if message.created else None,
    }
    engine = memory_engine()
    if scope_key is None:
        if not engine.has_rule_facts(stored):
            return []
        session = ChatSession.objects.filter(pk=message.session_id).first()
        if session is None:
            return []
        scope_key = session_scope_key(session)
    return engine.facts_on_store(memory_key_of(message.session_id), scope_key=scope_key, messages=[stored])


def message_token_count(wire: dict[str, Any]) -> int:
    """Tokens ``wire`` costs in a chat-model request (docs/memory.md §5)."""
    return get_counter(chat_endpoint().model).count_message(wire)


def reply_message_store(
    *,
    session_id: int,
    reply_to_id: int | None,
    role: str,
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str = "",
    name: str = "",
    status: str = Message.Status.COMPLETE,
    origin: str = Message.Origin.MODEL,
    step: int = 1,
    usage: ModelCallUsage | None = None,
    version: int = 1,
) -> Message:
    """Store one assistant or tool message of the turn ``reply_to_id`` with its token count, tool-call facts and
    ``usage``, in one transaction; a final reply also deletes the turn's lease. ``origin`` ``app``: never sent to
    the model (F-37); ``version``: of the turn's reply (ReplyVersion). Raises ``ValueError`` for another role."""
    if role not in (Message.Role.ASSISTANT, Message.Role.TOOL):
        raise ValueError(f"a reply is an assistant or tool message, not {role!r}")
    wire: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        wire["tool_calls"] = tool_calls
    if tool_call_id:
        wire["tool_call_id"] = tool_call_id
    if name:
        wire["name"] = name
    with transaction.atomic():
        message = Message.objects.create(
            session_id=session_id,
            reply_to_id=reply_to_id,
            role=role,
            content=content,
            tool_calls=tool_calls or None,
            tool_call_id=tool_call_id,
            name=name,
            status=status,
            origin=origin,
            version=version,
            token_count=message_token_count(wire),
        )
        ChatSession.objects.filter(pk=session_id).update(updated=timezone.now())
        if message.tool_calls:
            message_facts_store(message=message)
        if reply_to_id is not None and message.is_final_reply:
            TurnLease.objects.filter(user_message_id=reply_to_id).delete()
        if usage is not None:
            model_call_usage_save(usage)
        event_broadcast_on_commit(session_id, ChatMessageEvent(message=message.as_dict(), step=step))
    return message


def model_call_record(
    *,
    session_id: int,
    reply_to_id: int,
    mode: str,
    step: int,
    model: str,
    context: dict[str, Any],
    estimated_tokens: int,
) -> ModelCall:
    """Record a request before it is sent: ``context`` is ``MemoryContext.as_dict()`` plus the ``tools`` sent."""
    return ModelCall.objects.create(
        session_id=session_id,
        reply_to_id=reply_to_id,
        mode=mode,
        step=step,
        model=model,
        context=context,
        estimated_tokens=estimated_tokens,
    )


@dataclass(frozen=True, kw_only=True)
class ModelCallUsage:
    """The provider's report of a model call: tokens (None: unreported) and the finish reason; ``context``: the
    record's context to store instead (None: unchanged)."""

    model_call_id: int
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str
    context: dict[str, Any] | None = None


def model_call_usage_save(usage: ModelCallUsage) -> None:
    context = {} if usage.context is None else {"context": usage.context}
    ModelCall.objects.filter(pk=usage.model_call_id).update(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        finish_reason=usage.finish_reason[:32],
        **context,
    )
