"""``/demo/`` (chatapp/ui/demo.py, docs/demo.md): the start page's "Run the demo" button and the
address ``make demo`` prints create a chat owned by the visitor, start the walk-through in it and
go there; a second click goes to the same chat; nobody else can open it; a cross-site GET starts
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.test import AsyncClient

from chatapp.conversation.demo import DEMO_MODE, DEMO_TITLE, demo_running_sessions, demos_cancel
from chatapp.conversation.runner import chat_turns_wait
from chatapp.models import ChatSession
from chatapp.ui.demo import DEMO_BUTTON_URL, DEMO_MAX_RUNNING
from tests.chatapp.conftest import Visitor

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]

DEMO_URL = "/demo/"


@pytest.fixture
async def demos_stopped(settings, db_connections_closed: None) -> AsyncIterator[None]:
    """Long thinking time, so the demo started by a request is still in its first step when
    the test looks; every demo is cancelled at the end. Torn down before ``db_connections_closed``
    (it depends on it), whose teardown then waits for a write the cancelled demo's turn still has
    in a database thread and closes its connection: torn down after it, as the order of the marks
    made it, a demo turn's ``INSERT`` met the flush's ``TRUNCATE`` and deadlocked on PostgreSQL."""
    settings.DEMO_SECONDS = 400.0
    # The view is under test, not the channel layer: with Redis (REDIS_URL), the stop listener of
    # a demo turn cancelled mid-flight could hang the event loop's close in channels_redis'
    # blocking receive (seen once in three runs); the Redis layer is tested in tests/production.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "chatapp.realtime.layers.SweepingInMemoryChannelLayer"}}
    yield
    await demos_cancel()
    # The cancelled demo's turn may still be writing in a database thread; the test database is
    # flushed next (on PostgreSQL a TRUNCATE beside that write deadlocked once).
    async with asyncio.timeout(10):
        await chat_turns_wait()


def chat_id(location: str) -> int:
    """The session id of a ``/s/<id>/`` redirect."""
    prefix = "/s/"
    assert location.startswith(prefix) and location.endswith("/"), location
    return int(location.removeprefix(prefix).removesuffix("/"))


@pytest.mark.usefixtures("demos_stopped")
async def test_run_the_demo_creates_the_visitors_chat_starts_the_demo_and_goes_there(bob: Visitor):
    visitor = AsyncClient()

    response = await visitor.post(DEMO_URL)

    assert response.status_code == 302
    session_id = chat_id(response["Location"])
    session = await ChatSession.objects.aget(pk=session_id)
    key = visitor.cookies[django_settings.SESSION_COOKIE_NAME].value
    assert (session.owner_id, session.owner_session_key) == (None, key)
    assert (session.title, session.mode) == (DEMO_TITLE, DEMO_MODE)
    assert session_id in demo_running_sessions()
    assert (await visitor.get(f"/s/{session_id}/")).status_code == 200
    # Another user and another anonymous browser get 404 for the demo chat.
    assert (await sync_to_async(bob.client.get)(f"/s/{session_id}/")).status_code == 404
    assert (await AsyncClient().get(f"/s/{session_id}/")).status_code == 404

    # A second click goes to the running demo: no second chat, no second demo.
    again = await visitor.post(DEMO_URL)
    assert again.status_code == 302 and chat_id(again["Location"]) == session_id
    assert await ChatSession.objects.acount() == 1


@pytest.mark.usefixtures("demos_stopped")
@pytest.mark.parametrize("fetch_site", ["none", "same-origin", "cross-site"])
async def test_a_get_of_the_printed_address_starts_nothing_and_shows_the_button(fetch_site):
    # A newcomer filled the process's demo limit with plain GETs (curl sends no Sec-Fetch-Site).
    visitor = AsyncClient()
    response = await visitor.get(DEMO_URL, headers={"Sec-Fetch-Site": fetch_site})

    assert response.status_code == 302 and response["Location"] == DEMO_BUTTON_URL
    assert not await ChatSession.objects.aexists()
    assert not demo_running_sessions()
    page = (await visitor.get(DEMO_BUTTON_URL)).content.decode()
    assert 'id="start-demo"' in page and "autofocus" in page


@pytest.mark.usefixtures("demos_stopped")
async def test_the_post_needs_the_csrf_token():
    response = await AsyncClient(enforce_csrf_checks=True).post(DEMO_URL)

    assert response.status_code == 403
    assert not await ChatSession.objects.aexists()


@pytest.mark.usefixtures("demos_stopped")
async def test_too_many_demos_answer_503(monkeypatch):
    monkeypatch.setattr("chatapp.ui.demo.DEMO_MAX_RUNNING", 1)
    assert DEMO_MAX_RUNNING > 1
    first = await AsyncClient().post(DEMO_URL)

    refused = await AsyncClient().post(DEMO_URL)

    assert first.status_code == 302
    assert refused.status_code == 503 and refused["Retry-After"] == "60"
    assert await ChatSession.objects.acount() == 1


async def test_the_start_page_offers_the_demo_beside_new_chat():
    response = await AsyncClient().get("/")

    page = response.content.decode()
    actions = page[page.index('data-testid="start-actions"') :]
    actions = actions[: actions.index("</div>")]
    assert 'data-testid="start-new-chat"' in actions
    assert f'action="{DEMO_URL}"' in actions and "Run the demo" in actions
