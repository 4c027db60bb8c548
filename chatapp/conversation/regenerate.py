"""Regenerate the reply of a chat's last turn (docs/memory.md §8, "Regenerate"): the reply's rows are kept as a
:class:`ReplyVersion` and leave the transcript, memory forgets what it derived from them, and the turn runs again."""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from chatapp.chats import turns
from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.models import ChatSession, Message, ReplyVersion, TurnLease


class RegenerateRefused(Exception):
    """Why a reply cannot be regenerated; nothing was changed."""


def reply_regenerate_prepare(*, session: ChatSession, turn_id: int) -> tuple[Message, int, list[int]]:
    """Keep the reply of turn ``turn_id`` as an earlier version and remove it, in one transaction: ``(the turn's user
    message, the version its new reply gets, the removed message ids)``; the turn is left in flight (a fresh lease) for
    :func:`chatapp.conversation.runner.chat_turn_start`. Raises :class:`RegenerateRefused` when it is not the chat's
    last turn, has no final reply, a turn is in flight, or the summary already holds its reply."""
    with transaction.atomic():
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
        removed = [reply.pk for reply in replies]
        try:
            memory_engine().forget_after(memory_key_of(session.pk), turn_id)
        except ValueError:
            raise RegenerateRefused(
                "This reply is already folded into the memory summary, so the model would still see it: "
                "it can no longer be regenerated."
            ) from None
        current = max(reply.version for reply in replies)
        ReplyVersion.objects.create(turn=turn, number=current, messages=[reply.as_dict() for reply in replies])
        Message.objects.filter(pk__in=removed).delete()
        TurnLease.objects.update_or_create(user_message=turn, defaults={"heartbeat": timezone.now()})
    return turn, current + 1, removed
