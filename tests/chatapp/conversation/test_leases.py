"""A turn's lease lives as long as the turn: deleted with the final reply, whether the turn
finished or was closed as interrupted, and never brought back by a late heartbeat."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from chatapp.chats import turns
from chatapp.chats.turns import turn_in_flight_list
from chatapp.conversation.leases import (
    INTERRUPTED_TEXT,
    turn_lease_renew,
    turns_interrupted_close,
)
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, TurnLease
from tests.chatapp.conftest import chat_session_make, lease_make, message_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]


async def test_a_finished_turn_leaves_no_lease(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    user = await sync_to_async(message_make)(session, "user", "How large can a file be?")
    await sync_to_async(lease_make)(user)

    final = await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    assert final.status == Message.Status.COMPLETE
    assert not await TurnLease.objects.filter(user_message=user).aexists()


def test_a_turn_closed_as_interrupted_leaves_no_lease(alice, settings):
    session = chat_session_make(alice.owner)
    dead = message_make(session, "user", "a question whose worker died")
    lease_make(dead, age_seconds=settings.CHAT_TURN_LEASE_SECONDS + 1)
    alive = message_make(session, "user", "a question still being answered elsewhere")
    lease_make(alive)

    [reply] = turns_interrupted_close(session_id=session.pk)

    assert (reply.reply_to_id, reply.content) == (dead.pk, INTERRUPTED_TEXT)
    assert list(TurnLease.objects.values_list("user_message_id", flat=True)) == [alive.pk]
    assert turn_in_flight_list(session_id=session.pk) == [alive.pk]


def test_a_late_heartbeat_does_not_bring_an_ended_turns_lease_back(alice):
    session = chat_session_make(alice.owner)
    ended = message_make(session, "user", "answered")
    message_make(session, "assistant", "the answer", reply_to=ended)
    unleased = message_make(session, "user", "stored without a lease by an older version")

    turn_lease_renew(user_message_id=ended.pk)
    turn_lease_renew(user_message_id=unleased.pk)

    assert list(TurnLease.objects.values_list("user_message_id", flat=True)) == [unleased.pk]


def test_on_one_process_a_lease_older_than_the_process_is_interrupted_at_once(alice, settings, monkeypatch):
    """The embedded default after a restart: turns left by the previous process are closed by the
    next request at once instead of counting as in flight (and "busy") for the lease time."""
    settings.CHAT_TURN_LEASES_ONE_PROCESS = True
    monkeypatch.setattr(turns, "PROCESS_STARTED", timezone.now() - timedelta(hours=1))
    session = chat_session_make(alice.owner)
    before_restart = message_make(session, "user", "asked just before the restart")
    lease_make(before_restart, age_seconds=2)
    assert turn_in_flight_list(session_id=session.pk) == [before_restart.pk]  # the same process

    monkeypatch.setattr(turns, "PROCESS_STARTED", timezone.now())  # a new process
    after_restart = message_make(session, "user", "asked after the restart")
    lease_make(after_restart)

    assert turn_in_flight_list(session_id=session.pk) == [after_restart.pk]
    [reply] = turns_interrupted_close(session_id=session.pk)
    assert (reply.reply_to_id, reply.content) == (before_restart.pk, INTERRUPTED_TEXT)
