"""Pages: the session list with a form for a new session, and the chat page of one session.

Views only translate: they authorize through :mod:`chatapp.access` (404 for anything not the
caller's), call a selector or service, and render. The chat itself runs over the WebSocket.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from chatapp.access import Owner, owner_ensure, owner_from, session_get_for_owner
from chatapp.forms import SessionCreateForm
from chatapp.llm.clients import chat_endpoint
from chatapp.selectors import message_list, session_list_for_owner
from chatapp.services import chat_session_create


def _page_context(owner: Owner, form: SessionCreateForm | None = None) -> dict[str, Any]:
    endpoint = chat_endpoint()
    return {
        "sessions": session_list_for_owner(owner=owner),
        "form": form or SessionCreateForm(),
        "offline": endpoint.offline,
        "model": endpoint.model,
        "context_window": endpoint.context_window,
    }


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """The caller's chat sessions and a form to start one (creates an anonymous visitor's session)."""
    return render(request, "chat/index.html", _page_context(owner_ensure(request)))


@require_POST
def session_create(request: HttpRequest) -> HttpResponse:
    """Start a chat session in the posted mode and go to it; 400 with the form for a bad mode."""
    owner = owner_ensure(request)
    form = SessionCreateForm(request.POST)
    if not form.is_valid():
        return render(request, "chat/index.html", _page_context(owner, form), status=400)
    session = chat_session_create(owner=owner, mode=form.cleaned_data["mode"])
    return redirect("session-detail", session_id=session.pk)


@require_GET
def session_detail(request: HttpRequest, session_id: int) -> HttpResponse:
    """The chat page of one of the caller's sessions (404 for anyone else's)."""
    session = session_get_for_owner(request, session_id)
    messages = message_list(session_id=session.pk)
    return render(
        request,
        "chat/session.html",
        {
            **_page_context(owner_from(request)),
            "chat_session": session,
            "messages": messages,
            "last_message_id": messages[-1].pk if messages else 0,
            "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        },
    )
