"""Builders and fixtures for the chat app's tests: owners (user / anonymous browser), sessions,
messages, the demo knowledge base, and WebSocket clients against the real ASGI application."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.db import connections
from django.test import Client
from django.utils import timezone

from chatapp.asgi import application
from chatapp.chats.access import Owner
from chatapp.chats.services import message_token_count
from chatapp.conversation.runner import chat_turns_wait
from chatapp.kb.documents import DEMO_KB_DIR, document_load_directory
from chatapp.llm.offline.transport import OFFLINE_MODEL
from chatapp.models import ChatSession, Message, TurnLease
from chatapp.orm_threads import orm_connections_close
from chatapp.realtime.protocol import ErrorEvent
from memory.api import MemoryEngine

ORIGIN = "http://127.0.0.1:8000"
TIMEOUT = 5.0
_numbers = itertools.count(1)


@dataclass(frozen=True)
class Visitor:
    """Someone with a browser: a logged-in user or an anonymous session. ``cookie`` is the
    ``Cookie`` header value their browser sends; ``client`` a Django test client with it."""

    owner: Owner
    cookie: str
    client: Client


def visitor_make(*, anonymous: bool = False) -> Visitor:
    """A new visitor with a stored Django session (the user is created too)."""
    client = Client()
    if anonymous:
        store = SessionStore()
        store.create()
        assert store.session_key is not None  # create() saved the session under a new key
        client.cookies[django_settings.SESSION_COOKIE_NAME] = store.session_key
        owner = Owner(user_id=None, session_key=store.session_key)
    else:
        user = get_user_model().objects.create_user(username=f"user{next(_numbers)}", password="pw-not-used")
        client.force_login(user)
        owner = Owner(user_id=user.pk, session_key=None)
    key = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    return Visitor(owner=owner, cookie=f"{django_settings.SESSION_COOKIE_NAME}={key}", client=client)


def chat_session_make(owner: Owner, *, mode: str = ChatSession.Mode.AGENT, title: str = "") -> ChatSession:
    return ChatSession.objects.create(
        owner_id=owner.user_id, owner_session_key=owner.session_key or "", mode=mode, title=title
    )


def message_make(session: ChatSession, role: str, content: str | None, **fields: Any) -> Message:
    wire = {
        "role": role,
        "content": content,
        **{k: v for k, v in fields.items() if k in ("tool_calls", "tool_call_id", "name")},
    }
    return Message.objects.create(
        session=session, role=role, content=content, token_count=message_token_count(wire), **fields
    )


def lease_make(user_message: Message, *, age_seconds: float = 0.0) -> TurnLease:
    """The lease of ``user_message``'s turn, renewed ``age_seconds`` ago: fresh by default (a
    turn running on some worker), expired when older than ``CHAT_TURN_LEASE_SECONDS``."""
    heartbeat = timezone.now() - timedelta(seconds=age_seconds)
    lease, _ = TurnLease.objects.update_or_create(user_message=user_message, defaults={"heartbeat": heartbeat})
    return lease


@pytest.fixture
def offline_engine(settings: Any) -> None:
    """Every endpoint is the offline engine, whatever the environment says; no demo switch on."""
    settings.LLM_CHAT_BASE_URL = ""
    settings.LLM_CHAT_MODEL = OFFLINE_MODEL
    settings.LLM_SUMMARY_BASE_URL = ""
    settings.LLM_SUMMARY_MODEL = OFFLINE_MODEL
    settings.LLM_FAILOVER_BASE_URL = ""
    settings.LLM_FAILOVER_MODEL = ""
    settings.OFFLINE_DELAY_SECONDS = 0.0
    settings.OFFLINE_FAIL_SUMMARY = False
    settings.OFFLINE_FAIL_CHAT = False


@pytest.fixture
def demo_kb(db: None) -> None:
    document_load_directory(DEMO_KB_DIR, slug_prefix="demo-")


@pytest.fixture
def alice(db: None) -> Visitor:
    return visitor_make()


@pytest.fixture
def bob(db: None) -> Visitor:
    return visitor_make()


@pytest.fixture
def anon(db: None) -> Visitor:
    return visitor_make(anonymous=True)


@pytest.fixture
def anon2(db: None) -> Visitor:
    return visitor_make(anonymous=True)


Socket = Callable[..., Any]


@pytest.fixture
async def ws(transactional_db: None, db_connections_closed: None) -> AsyncIterator[Socket]:
    """``async with ws(path, cookie=..., origin=...) as communicator``: a connected-or-refused
    WebSocket client of the real application (origin check, session, auth, router). Every client
    is disconnected on exit; at teardown every background turn must have ended (10 s)."""

    @asynccontextmanager
    async def connect(
        path: str, *, cookie: str | None = None, origin: str | None = ORIGIN
    ) -> AsyncIterator[WebsocketCommunicator]:
        headers = [(b"host", b"127.0.0.1:8000")]
        if origin is not None:
            headers.append((b"origin", origin.encode()))
        if cookie is not None:
            headers.append((b"cookie", cookie.encode()))
        communicator = WebsocketCommunicator(application, path, headers=headers)
        try:
            yield communicator
        finally:
            await communicator.disconnect(timeout=TIMEOUT)

    yield connect
    async with asyncio.timeout(10):
        await chat_turns_wait()
    await get_channel_layer().flush()


@pytest.fixture
async def db_connections_closed() -> AsyncIterator[None]:
    """At teardown, end this test's memory jobs (one still writing beside the flush of the test
    database deadlocked it on PostgreSQL), then close the connections that async code opened in
    asgiref's worker thread and in the ORM threads (:mod:`chatapp.orm_threads`), so that the test
    database can be dropped (PostgreSQL refuses while a session is open)."""
    yield
    async with asyncio.timeout(30):
        await MemoryEngine.close_jobs()
    await sync_to_async(connections.close_all)()
    await sync_to_async(orm_connections_close)()


async def receive_until(
    communicator: WebsocketCommunicator,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = TIMEOUT,  # noqa: ASYNC109  (per event, for receive_json_from; not a deadline of the call)
) -> list[dict[str, Any]]:
    """Every event received up to and including the first that satisfies ``predicate``;
    ``timeout`` is how long to wait for each event (a deadline for the whole wait is the
    caller's ``asyncio.timeout``)."""
    events: list[dict[str, Any]] = []
    while True:
        event = await communicator.receive_json_from(timeout=timeout)
        events.append(event)
        if predicate(event):
            return events


def of_type(events: list[dict[str, Any]], event_type: str) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == event_type]


def is_done(event: dict[str, Any]) -> bool:
    return event["type"] == "chat.done"


@pytest.fixture
def errors_sent(monkeypatch: pytest.MonkeyPatch) -> list[ErrorEvent]:
    """The ``error`` events turns broadcast, recorded instead of sent."""
    sent: list[ErrorEvent] = []

    async def record(session_id: int, event: Any) -> None:
        if isinstance(event, ErrorEvent):
            sent.append(event)

    monkeypatch.setattr("chatapp.conversation.turn.event_broadcast", record)
    return sent
