"""The demo walk-through's entry: ``POST /demo/`` creates a chat for the visitor, starts the
scripted conversation in it (:mod:`chatapp.conversation.demo`, docs/demo.md) and redirects to its
page; ``GET /demo/`` leads to the start page's "Run the demo" button.

A thin view: it finds the caller as an owner (:mod:`chatapp.chats.access`), creates the chat
(:func:`chatapp.chats.services.chat_session_create`) and starts the demo on this process's event
loop, which is why it is an async view (Daphne runs it on the loop the demo's turns run on). Its
database work goes through ``sync_to_async``, like the other async views: the request's
connection handling is Django's.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods

from chatapp.chats.access import owner_ensure
from chatapp.chats.selectors import session_newest_of_owner
from chatapp.chats.services import chat_session_create
from chatapp.conversation.demo import DEMO_MODE, DEMO_TITLE, demo_running_sessions, demo_start

# At most this many demos run in one process at a time; past it /demo/ answers 503.
DEMO_MAX_RUNNING = 8
TOO_MANY_DEMOS = "Too many demos are running right now. Please try again in a minute."
# Where a GET of /demo/ (the address ``make demo`` prints) goes: the start page, with the "Run
# the demo" button focused. A GET never starts a demo: links, prefetchers and scripts without
# cookies must not be able to start demos (a newcomer filled the process's limit with curl).
DEMO_BUTTON_URL = "/?demo=1#start-demo"


@require_http_methods(["GET", "POST"])
async def demo_start_view(request: HttpRequest) -> HttpResponse:
    """Start the demo walk-through and go to its chat (``302`` to ``/s/<id>/``).

    POST (the start page's "Run the demo" button, CSRF-checked): when the caller already has a
    demo running in this process, go to that chat (a second click starts nothing); otherwise
    create a new agent-mode chat titled :data:`DEMO_TITLE` owned by the caller (an anonymous
    visitor gets their browser session first) and start the demo in it. 503 when
    :data:`DEMO_MAX_RUNNING` demos already run here. GET (the address ``make demo`` prints)
    starts nothing: it redirects to the start page with the button focused
    (:data:`DEMO_BUTTON_URL`)."""
    if request.method == "GET":
        return redirect(DEMO_BUTTON_URL)
    owner = await sync_to_async(owner_ensure)(request)
    running = demo_running_sessions()
    mine = await sync_to_async(session_newest_of_owner)(owner=owner, session_ids=running)
    if mine is not None:
        return redirect("session-detail", session_id=mine)
    if len(running) >= DEMO_MAX_RUNNING:
        return HttpResponse(TOO_MANY_DEMOS, status=503, content_type="text/plain", headers={"Retry-After": "60"})
    session = await sync_to_async(chat_session_create)(owner=owner, mode=DEMO_MODE, title=DEMO_TITLE)
    demo_start(session_id=session.pk)
    return redirect("session-detail", session_id=session.pk)
