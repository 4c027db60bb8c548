"""The demo's entry (docs/demo.md): an async view, so the demo starts on the event loop its turns run on."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods

from chatapp.chats.access import owner_ensure
from chatapp.chats.selectors import session_newest_of_owner
from chatapp.chats.services import chat_session_create
from chatapp.conversation.demo import DEMO_MODE, DEMO_TITLE, demo_running_sessions, demo_start

DEMO_MAX_RUNNING = 8
TOO_MANY_DEMOS = "Too many demos are running right now. Please try again in a minute."
# A GET only leads to the button: links, prefetchers and cookie-less scripts must not start demos.
DEMO_BUTTON_URL = "/?demo=1#start-demo"


@require_http_methods(["GET", "POST"])
async def demo_start_view(request: HttpRequest) -> HttpResponse:
    """POST: start the demo in a new chat (or go to the caller's running one); 503 past ``DEMO_MAX_RUNNING``."""
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
