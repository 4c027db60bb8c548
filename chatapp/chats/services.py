"""Writes of the chat app: sessions, messages and model-call records (synchronous ORM code).

Async callers wrap these with :func:`chatapp.orm_threads.orm_async`. Every function that stores
a message tells the session's sockets about it only after the commit
(:func:`chatapp.realtime.broadcast.event_broadcast_on_commit`). Turn orchestration lives in
:mod:`chatapp.conversation.runner`; the memory engine's own tables are written by the ``memory`` app only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from chatapp.chats.access import Owner
from chatapp.chats.memory import chat_session_lock, chat_session_scope_key, memory_engine, memory_key_of
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession, Message, ModelCall, TurnLease
from chatapp.realtime.broadcast import event_broadcast_on_commit, session_sockets_close_on_commit
from chatapp.realtime.protocol import ChatMessageEvent
from memory.api import KeyFact, get_counter, value_spans

# The longest title a chat gets from its first message, in characters (a rename allows 200).
TITLE_MAX_CHARS = 60
# What a title made from a message never shows: identifiers, contact data and secrets, as the
# key-fact rules find them (memory.api.value_spans, docs/memory.md §11). Amounts and dates stay.
TITLE_HIDDEN_KINDS = frozenset({"id", "email", "phone", "url", "secret"})
# Stands for each value left out of a title, and for the cut end of a long one.
TITLE_ELISION = "…"
# A title with fewer letters than this (values left out) is replaced by the neutral one.
TITLE_MIN_LETTERS = 2
_ELISIONS = re.compile(r"…(?:[\s,;:/&+-]*…)+")


def chat_session_create(*, owner: Owner, mode: str, title: str = "") -> ChatSession:
    """A new chat session for ``owner`` (a user, else an anonymous browser session key).

    Raises ``ValueError`` for an owner with neither (the caller must create the browser session
    first) or for an unknown ``mode``.
    """
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


def chat_session_title_from_text(*, text: str, session_id: int) -> str:
    """The title of chat ``session_id`` made from its first message ``text``: the text on one line
    with every identifier, email, phone number, URL, card number and secret left out (each
    becomes ``…``; :data:`TITLE_HIDDEN_KINDS`), cut at a word to at most :data:`TITLE_MAX_CHARS`
    characters. When fewer than :data:`TITLE_MIN_LETTERS` letters are left, the neutral
    ``"Chat <session_id>"`` (what the page shows for an untitled chat). Pure; never raises.

    Values are removed before the text is cut, so a value cut in half cannot slip through.
    """
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
        # A cut right after a left-out value: its "…" marks the cut too ("invoice ……" before).
        title = cut if cut.endswith(TITLE_ELISION) else cut + TITLE_ELISION
    return title


def chat_session_rename(*, session: ChatSession, title: str) -> ChatSession:
    """Give ``session`` the title ``title`` (surrounding spaces removed, at most 200 characters;
    an empty title makes the page show "Chat <id>"). Does not move it in the session list."""
    session.title = " ".join(title.split())[:200]
    ChatSession.objects.filter(pk=session.pk).update(title=session.title)
    return session


def chat_session_mode_set(*, session: ChatSession, mode: str) -> ChatSession:
    """Switch ``session`` to ``mode`` (agent or quick-answer) from its next turn on; a turn
    already running keeps its mode. Raises ``ValueError`` for an unknown mode."""
    if mode not in ChatSession.Mode.values:
        raise ValueError(f"unknown chat mode {mode!r}")
    session.mode = mode
    ChatSession.objects.filter(pk=session.pk).update(mode=mode)
    return session


def chat_session_delete(*, session: ChatSession) -> None:
    """Delete ``session`` with its messages and model-call records, and the memory app's state of
    it (summary and compression events), in one transaction. After the commit its sockets stop
    the session's turns and close with code 4404.

    The session row is locked first, so a memory write of a turn or compression still running
    (guarded by the memory source's ``alive``) either commits before and is deleted here, or
    waits and then sees the session gone: nothing of the chat survives (docs/memory.md F-41)."""
    session_id = session.pk
    with transaction.atomic():
        chat_session_lock(session_id)
        memory_engine().forget(memory_key_of(session_id))
        session.delete()
        session_sockets_close_on_commit(session_id)


def message_facts_store(*, message: Message, scope_key: str | None = None) -> list[KeyFact]:
    """Store the rule key facts of the just-stored ``message`` (docs/memory.md §11, "rule
    extraction at store time"): a user's text or an assistant's tool-call arguments; nothing for
    other messages nor for rows the app wrote (``origin`` ``app``, docs/memory.md F-37). Call it
    inside the transaction that stored the message, so the facts commit (or roll back) with it.

    Returns the facts created. Makes no query when the message holds no candidate (most
    messages). ``scope_key``: :func:`chat_session_scope_key` of the session; when not given it
    is read from the session row (one more query, only when there is a candidate).
    """
    if message.origin == Message.Origin.APP:
        return []
    if not (message.role == Message.Role.USER or (message.role == Message.Role.ASSISTANT and message.tool_calls)):
        return []
    stored = {
        "id": message.pk,
        "role": message.role,
        "content": message.content,
        "tool_calls": message.tool_calls,
        "created_at": message.created,
    }
    engine = memory_engine()
    if scope_key is None:
        if not engine.has_rule_facts(stored):
            return []
        owner = ChatSession.objects.filter(pk=message.session_id).values_list("owner_id", "owner_session_key").first()
        if owner is None:
            return []
        scope_key = chat_session_scope_key(owner_id=owner[0], owner_session_key=owner[1])
    return engine.facts_on_store(memory_key_of(message.session_id), scope_key=scope_key, messages=[stored])


def message_token_count(wire: dict[str, Any]) -> int:
    """Tokens ``wire`` costs in a chat-model request (the chat model's encoding; docs/memory.md §5)."""
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
) -> Message:
    """Store one assistant or tool message of the turn opened by user message ``reply_to_id``.

    ``tool_calls`` in OpenAI format for an assistant message that calls tools (``content`` may
    then be None); ``tool_call_id`` and ``name`` for a tool result. ``token_count`` is computed
    here, once. On commit the sockets get ``chat.message`` with ``step`` (the model call of the
    turn it came from, from 1) so a client can replace the streamed text with the stored row.
    ``origin`` is ``app`` for a note the app writes in place of a model reply, which is never sent
    to the model (docs/memory.md F-37). The key facts in an assistant message's ``tool_calls``
    are stored in the same transaction (:func:`message_facts_store`).
    The final reply (an assistant message without ``tool_calls``) ends the turn: the turn's lease
    (:class:`chatapp.models.TurnLease`) is deleted in the same transaction. ``usage``: what the
    provider reported for the model call this message came from, stored on its record in the same
    transaction (:func:`model_call_usage_save`; one write to the database fewer per model call).
    """
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
    """Record a request to the chat model before it is sent: ``context`` is the memory engine's
    ``MemoryContext.as_dict()`` (what the model sees) plus ``tools`` (the tool schemas sent),
    ``estimated_tokens`` its estimate."""
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
    """What the provider reported for the model call recorded as ``model_call_id``: tokens
    (None when not reported) and the finish reason (at most 32 characters are stored).
    ``context``: the record's context to store instead (None: unchanged)."""

    model_call_id: int
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str
    context: dict[str, Any] | None = None


def model_call_usage_save(usage: ModelCallUsage) -> None:
    """Store ``usage`` on its model call's record (one query)."""
    context = {} if usage.context is None else {"context": usage.context}
    ModelCall.objects.filter(pk=usage.model_call_id).update(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        finish_reason=usage.finish_reason[:32],
        **context,
    )
