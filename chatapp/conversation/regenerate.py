"""Regenerate the reply of a chat's last turn, or bring an earlier version of it back (docs/memory.md §8,
"Regenerate"): the current reply's rows are kept as a :class:`ReplyVersion` and leave the transcript, and memory
forgets what it derived from them; then the turn runs again, or the chosen version's messages are stored anew."""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from chatapp.chats import turns
from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.models import ChatSession, Message, ReplyVersion, TurnLease
from chatapp.realtime.broadcast import event_broadcast_on_commit
from chatapp.realtime.protocol import ChatMessageEvent, ChatRegeneratedEvent

# A restored message keeps these of its stored form (``Message.as_dict()``); its id, turn and version are new.
RESTORED = ("role", "content", "tool_calls", "tool_call_id", "name", "status", "origin", "token_count")


class RegenerateRefused(Exception):
    """Why a reply cannot be regenerated or replaced by an earlier version; nothing was changed."""


def reply_regenerate_prepare(*, session: ChatSession, turn_id: int) -> tuple[Message, int, list[int]]:
    """Keep the reply of turn ``turn_id`` as an earlier version and remove it, in one transaction: ``(the turn's user
    message, the version its new reply gets, the removed message ids)``; the turn is left in flight (a fresh lease) for
    :func:`chatapp.conversation.runner.chat_turn_start`. Raises :class:`RegenerateRefused` when it is not the chat's
    last turn, has no final reply, a turn is in flight, or the summary already holds its reply."""
    with transaction.atomic():
        turn, version, removed = _current_reply_retire(session=session, turn_id=turn_id)
        TurnLease.objects.update_or_create(user_message=turn, defaults={"heartbeat": timezone.now()})
    return turn, version, removed


def reply_version_restore(*, session: ChatSession, turn_id: int, number: int) -> Message:
    """Make earlier version ``number`` the reply of turn ``turn_id`` again: the current reply is kept as a version and
    removed, the chosen version's messages are stored anew as the newest version (memory sees only them), and every
    socket of the session is told (``chat.regenerated``, then ``chat.message`` each); the memory job indexes them when
    next scheduled. Returns the restored final reply. Raises :class:`RegenerateRefused` as
    :func:`reply_regenerate_prepare` does, or for an unknown version."""
    with transaction.atomic():
        chosen = ReplyVersion.objects.filter(turn__session_id=session.pk, turn_id=turn_id, number=number).first()
        if chosen is None:
            raise RegenerateRefused(f"The reply to message #{turn_id} has no version {number}.")
        turn, version, removed = _current_reply_retire(session=session, turn_id=turn_id)
        event_broadcast_on_commit(session.pk, ChatRegeneratedEvent(turn_id=turn.pk, version=version, removed=removed))
        restored = []
        for stored in chosen.messages:
            message = Message.objects.create(
                session_id=session.pk, reply_to=turn, version=version, **{key: stored[key] for key in RESTORED}
            )
            restored.append(message)
            event_broadcast_on_commit(session.pk, ChatMessageEvent(message=message.as_dict()))
        ChatSession.objects.filter(pk=session.pk).update(updated=timezone.now())
    return next(message for message in reversed(restored) if message.is_final_reply)


def _current_reply_retire(*, session: ChatSession, turn_id: int) -> tuple[Message, int, list[int]]:
    """Inside a transaction: check turn ``turn_id`` may have its reply replaced, keep that reply as a version, delete
    its rows and make memory forget them. Returns the turn, the next version's number and the removed ids."""
    rows = ChatSession.objects.filter(pk=session.pk)
    if connection.features.has_select_for_update:
        rows = rows.select_for_update()
    if not rows.exists():
        raise RegenerateRefused("This chat no longer exists.")
    turn = Message.objects.filter(session_id=session.pk, pk=turn_id, role=Message.Role.USER).first()
    if turn is None:
        raise RegenerateRefused(f"Message #{turn_id} is not a question of this chat.")
    if Message.objects.filter(session_id=session.pk, role=Message.Role.USER, pk__gt=turn_id).exists():
        raise RegenerateRefused("Only the reply to the chat's last message can be regenerated.")
    if turns.turn_in_flight_list(session_id=session.pk):
        raise RegenerateRefused("A reply is still being written: wait for it, or stop it first.")
    replies = list(Message.objects.filter(reply_to=turn).order_by("id"))
    if not any(reply.is_final_reply for reply in replies):
        raise RegenerateRefused(f"Message #{turn_id} has no reply to regenerate yet.")
    try:
        memory_engine().forget_after(memory_key_of(session.pk), turn_id)
    except ValueError:
        raise RegenerateRefused(
            "This reply is already folded into the memory summary, so the model would still see it: "
            "it can no longer be regenerated."
        ) from None
    current = max(reply.version for reply in replies)
    ReplyVersion.objects.create(turn=turn, number=current, messages=[reply.as_dict() for reply in replies])
    removed = [reply.pk for reply in replies]
    Message.objects.filter(pk__in=removed).delete()
    newest = max(ReplyVersion.objects.filter(turn=turn).values_list("number", flat=True))
    return turn, newest + 1, removed
