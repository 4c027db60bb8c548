"""Edit a sent user message into a new chat (docs/memory.md §8, "Edit into a new chat"): the history before it is
copied, the edited text is stored as the new chat's next message, and the new chat's memory is derived from its own
messages. The original chat is not touched."""

from __future__ import annotations

import re

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from chatapp.chats.memory import memory_engine, memory_key_of, session_scope_key
from chatapp.chats.services import chat_session_title_from_text, message_facts_store
from chatapp.conversation.leases import user_message_submit
from chatapp.models import ChatSession, Message, ReplyVersion

FORK_TITLE_SUFFIX = " (edited at #{message_id})"
# A copied message keeps these columns; its session, id and reply_to are the fork's.
COPIED = ("role", "content", "tool_calls", "tool_call_id", "name", "token_count", "status", "origin", "version")


class ForkRefused(Exception):
    """Why a message cannot be edited into a new chat; nothing was stored."""


def chat_session_fork(*, session: ChatSession, message_id: int, text: str, client_message_id: str) -> Message:
    """Copy ``session``'s messages before user message ``message_id`` (times kept) into a new chat of the same owner and
    mode, with their rule key facts, and store ``text`` as its next user message (in flight, for
    :func:`chatapp.conversation.runner.chat_turn_start`); returns that message. The source's summary is reused when
    everything it folded precedes the fork point. Raises :class:`ForkRefused` for a message that is not one of the
    chat's user messages."""
    edited = Message.objects.filter(session=session, pk=message_id, role=Message.Role.USER).first()
    if edited is None:
        raise ForkRefused(f"Message #{message_id} is not one of your messages in this chat.")
    with transaction.atomic():
        fork = ChatSession.objects.create(
            owner_id=session.owner_id,
            owner_session_key=session.owner_session_key,
            mode=session.mode,
            title=_title(session, message_id, text),
            forked_from=session,
            forked_at_message_id=message_id,
        )
        scope_key = session_scope_key(fork)  # a scope of its own: no other chat's facts or recall
        id_map: dict[int, int] = {}
        # The turns before the edited one, whole: a reply of such a turn may have been stored after the edited message.
        before = Q(pk__lt=message_id, reply_to__isnull=True) | Q(reply_to_id__lt=message_id)
        for old in Message.objects.filter(before, session=session).order_by("id"):
            copy = Message.objects.create(
                session=fork,
                reply_to_id=id_map.get(old.reply_to_id) if old.reply_to_id is not None else None,
                **{column: getattr(old, column) for column in COPIED},
            )
            # auto_now_add set the copy's time: the message's own time matters (day markers, a fact's valid-from).
            Message.objects.filter(pk=copy.pk).update(created=old.created)
            copy.created = old.created
            id_map[old.pk] = copy.pk
            message_facts_store(message=copy, scope_key=scope_key)
        for version in ReplyVersion.objects.filter(turn_id__in=id_map).order_by("id"):
            ReplyVersion.objects.create(
                turn_id=id_map[version.turn_id], number=version.number, messages=version.messages
            )
        memory_engine().summary_adopt(
            memory_key_of(fork.pk), source_key=memory_key_of(session.pk), id_map=id_map, fork_point=message_id
        )
        ChatSession.objects.filter(pk=fork.pk).update(updated=timezone.now())
    message, _ = user_message_submit(session=fork, client_message_id=client_message_id, text=text)
    return message


def _title(session: ChatSession, message_id: int, text: str) -> str:
    """The copy's title within the 200-character column, saying which message was edited: the original's without
    the suffixes of earlier edits, or, when the first message is the edited one, made from the edited text."""
    first = not Message.objects.filter(session=session, role=Message.Role.USER, pk__lt=message_id).exists()
    if first:
        title = chat_session_title_from_text(text=text, session_id=session.pk)
    else:
        title = _EDITED_SUFFIXES.sub("", session.title) or f"Chat {session.pk}"
    suffix = FORK_TITLE_SUFFIX.format(message_id=message_id)
    return title[: 200 - len(suffix)] + suffix


_EDITED_SUFFIXES = re.compile(r"(?: \(edited at #\d+\))+$")
