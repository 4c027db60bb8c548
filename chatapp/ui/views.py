"""Pages and their htmx partials: the session list, the chat page with its memory inspector, and
the knowledge base.

Views only translate: they parse input (forms), authorize through :mod:`chatapp.chats.access` (404 for
any session that is not the caller's), call a selector or service, and render. Each page is one
template with named partials; an htmx request (``request.htmx``) gets only the partial it
targets, and a plain request the whole page, so everything also works without JavaScript.
Forms with errors answer 422 to htmx (swapped, see ``htmx-config`` in ``base.html``) and 400 to
plain requests. The chat itself runs over the WebSocket (:mod:`chatapp.realtime.consumers`,
:mod:`chatapp.ui.page_feed`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.urls import Resolver404, resolve, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseClientRedirect, trigger_client_event
from django_htmx.middleware import HtmxDetails

from chatapp.chats.access import (
    SESSION_ID_MAX,
    Owner,
    kb_editor_allowed,
    kb_editor_check,
    owner_ensure,
    owner_from,
    session_get_for_owner,
    session_queryset_for_owner,
)
from chatapp.chats.export import EXPORT_FORMATS, chat_export_filename, chat_export_stream
from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.chats.selectors import session_list_for_owner
from chatapp.chats.services import (
    chat_session_create,
    chat_session_delete,
    chat_session_mode_set,
    chat_session_rename,
)
from chatapp.conversation.compress import session_memory_compress
from chatapp.kb.documents import document_delete, document_list, document_upload
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession
from chatapp.ui.composer import composer_count_get
from chatapp.ui.forms import (
    DocumentUploadForm,
    KeyFactEditForm,
    KeyFactHideForm,
    KeyFactPinForm,
    SessionCreateForm,
    SessionModeForm,
    SessionRenameForm,
)
from chatapp.ui.inspector.facts import key_facts_section_get
from chatapp.ui.inspector.recall import recall_section_get
from chatapp.ui.inspector.state import inspector_state_get
from chatapp.ui.page_feed import chat_page_state_get, compression_sentence
from memory.api import KeyFact, KeyFactNotFound

SESSION_PAGE = "chat/session.html"
MANAGE_PAGE = "chat/session_manage.html"
KB_PAGE = "chat/kb.html"
# The client event that tells the knowledge-base page its document list changed (HX-Trigger).
KB_CHANGED_EVENT = "kb-changed"
NOTHING_TO_COMPRESS = "Nothing to compress yet: this chat has no question."
# The client event whose ``text`` chat.js puts in the page's #announce status region.
ANNOUNCE_EVENT = "chat:announce"
# The visitor's (Django session's) key for the mode of the chat they last used: opened, created or
# switched. A new chat starts in it; the page's one mode control shows the open chat's mode.
LAST_MODE_SESSION_KEY = "chat_last_mode"


class HtmxHttpRequest(HttpRequest):
    """The request as these views receive it: ``HtmxMiddleware`` adds ``htmx`` (django-htmx's
    typing recipe; the type only, nothing is created)."""

    htmx: HtmxDetails


def _layout_context(
    owner: Owner, *, chat_session: ChatSession | None = None, form: SessionCreateForm | None = None
) -> dict[str, Any]:
    """What ``base.html`` needs: the sidebar (the owner's sessions, the new-chat form) and the
    offline banner."""
    endpoint = chat_endpoint()
    return {
        "sessions": session_list_for_owner(owner=owner),
        "form": form or SessionCreateForm(),
        "offline": endpoint.offline,
        "model": endpoint.model,
        "context_window": endpoint.context_window,
        "chat_session": chat_session,
    }


def _page_session(request: HtmxHttpRequest, owner: Owner) -> ChatSession | None:
    """The owner's chat session whose page sent the htmx request, if it came from a chat page."""
    try:
        match = resolve(request.htmx.current_url_abs_path or "")
    except Resolver404:
        return None
    if match.url_name != "session-detail":
        return None
    return session_queryset_for_owner(owner).filter(pk=match.kwargs["session_id"]).first()


def _is_current_page(request: HtmxHttpRequest, session: ChatSession) -> bool:
    """Whether the htmx request came from the chat page of ``session``."""
    return request.htmx.current_url_abs_path == reverse("session-detail", kwargs={"session_id": session.pk})


def _session_page_context(request: HtmxHttpRequest, session: ChatSession) -> dict[str, Any]:
    page = chat_page_state_get(session=session)
    return {
        **_layout_context(owner_from(request), chat_session=session),
        "page": page,
        "running": page.running,
        "modes": ChatSession.Mode.choices,
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        "composer": composer_count_get(session=session, text=""),
    }


@require_safe
def index(request: HtmxHttpRequest) -> HttpResponse:
    """The caller's chat sessions and a form to start one (a GET creates an anonymous visitor's
    session; a HEAD, e.g. an uptime probe, answers the same status and creates nothing)."""
    owner = owner_ensure(request) if request.method == "GET" else owner_from(request)
    return render(request, "chat/index.html", _index_context(request, owner))


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers and tools ask for whatever the page links: a temporary
    redirect to the SVG icon in the static files (``static/favicon.svg``)."""
    return redirect(static("favicon.svg"))


def _last_mode(request: HttpRequest) -> str:
    """The mode of the chat the visitor last used (:data:`LAST_MODE_SESSION_KEY`), agent before
    any (or for a stored value that is no mode)."""
    mode = request.session.get(LAST_MODE_SESSION_KEY)
    return mode if mode in ChatSession.Mode.values else ChatSession.Mode.AGENT


def _last_mode_remember(request: HttpRequest, mode: str) -> None:
    """Remember ``mode`` as the visitor's last used one (the session is saved only on a change)."""
    if request.session.get(LAST_MODE_SESSION_KEY) != mode:
        request.session[LAST_MODE_SESSION_KEY] = mode


def _index_context(request: HttpRequest, owner: Owner, form: SessionCreateForm | None = None) -> dict[str, Any]:
    """The start page's context: the layout's, and the label of the mode a new chat starts in."""
    return {**_layout_context(owner, form=form), "new_chat_mode": ChatSession.Mode(_last_mode(request)).label}


@require_POST
def session_create(request: HtmxHttpRequest) -> HttpResponse:
    """Start a chat session and go to it: in the posted ``mode`` if any, else in the visitor's last
    used mode (remembered in their session); 400 with the form for an unknown mode."""
    owner = owner_ensure(request)
    form = SessionCreateForm(request.POST)
    if not form.is_valid():
        return render(request, "chat/index.html", _index_context(request, owner, form), status=400)
    mode = form.cleaned_data["mode"] or _last_mode(request)
    session = chat_session_create(owner=owner, mode=mode)
    _last_mode_remember(request, mode)
    return redirect("session-detail", session_id=session.pk)


@require_safe
def session_detail(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """The chat page of one of the caller's sessions (404 for anyone else's): the transcript
    with its memory marks, the composer and the memory inspector. Opening a chat makes its mode
    the visitor's last used one."""
    session = session_get_for_owner(request, session_id)
    _last_mode_remember(request, session.mode)
    return render(request, SESSION_PAGE, _session_page_context(request, session))


@require_safe
def session_inspector(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """The memory inspector: its partial for htmx, else the chat page (which contains it)."""
    session = session_get_for_owner(request, session_id)
    if request.htmx:
        return render(request, f"{SESSION_PAGE}#inspector", {"inspector": inspector_state_get(session_id=session.pk)})
    return render(request, SESSION_PAGE, _session_page_context(request, session))


@require_safe
def session_item(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """The session's sidebar entry (htmx: e.g. to cancel a rename), else the chat page."""
    session = session_get_for_owner(request, session_id)
    if not request.htmx:
        return redirect("session-detail", session_id=session.pk)
    current = session if _is_current_page(request, session) else None
    return render(request, "base.html#session-item", {"s": session, "chat_session": current})


@require_http_methods(["GET", "POST"])
def session_rename(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """GET: the rename form (htmx: the sidebar entry as a form; else a page). POST: rename, then
    the sidebar entry (htmx; plus the page title when renaming the open chat) or the chat page."""
    session = session_get_for_owner(request, session_id)
    form = SessionRenameForm(request.POST if request.method == "POST" else None, initial={"title": session.title})
    if request.method == "POST" and form.is_valid():
        chat_session_rename(session=session, title=form.cleaned_data["title"])
        if not request.htmx:
            return redirect("session-detail", session_id=session.pk)
        current = _is_current_page(request, session)
        item = {"s": session, "chat_session": session if current else None}
        response = render(request, "base.html#session-item", item)
        if current:
            response.write(
                render(request, f"{SESSION_PAGE}#chat-title", {"chat_session": session, "oob": True}).content
            )
        return response
    status = 200 if request.method == "GET" else (422 if request.htmx else 400)
    if request.htmx:
        return render(request, "base.html#session-rename-form", {"s": session, "rename_form": form}, status=status)
    context = {
        **_layout_context(owner_from(request), chat_session=session),
        "action": "rename",
        "s": session,
        "rename_form": form,
    }
    return render(request, MANAGE_PAGE, context, status=status)


@require_http_methods(["GET", "POST"])
def session_delete(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """GET: a confirmation page (htmx asks with ``hx-confirm`` instead). POST: delete the session
    and its memory; htmx gets the updated session list, or a client redirect to the start page
    when the open chat was deleted; a plain request is redirected there."""
    session = session_get_for_owner(request, session_id)
    if request.method == "GET":
        context = {**_layout_context(owner_from(request), chat_session=session), "action": "delete"}
        return render(request, MANAGE_PAGE, context)
    current = request.htmx and _is_current_page(request, session)
    chat_session_delete(session=session)
    if not request.htmx:
        return redirect("index")
    if current:
        return HttpResponseClientRedirect(reverse("index"))
    owner = owner_from(request)
    return render(request, "base.html#session-list", _layout_context(owner, chat_session=_page_session(request, owner)))


@require_POST
def session_mode(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """Switch the session's mode for its next turns (the page's one mode control; the visitor's next
    new chat starts in it too): htmx gets the mode switch and the sidebar entry (out of band) and
    an announcement; a plain request goes back to the chat page."""
    session = session_get_for_owner(request, session_id)
    form = SessionModeForm(request.POST)
    switch = {"chat_session": session, "modes": ChatSession.Mode.choices}
    if not form.is_valid():
        if request.htmx:
            return render(request, f"{SESSION_PAGE}#mode-form", switch, status=422)
        return HttpResponse("Unknown mode.", status=400, content_type="text/plain")
    chat_session_mode_set(session=session, mode=form.cleaned_data["mode"])
    _last_mode_remember(request, session.mode)
    if not request.htmx:
        return redirect("session-detail", session_id=session.pk)
    response = render(request, f"{SESSION_PAGE}#mode-form", switch)
    item = {"s": session, "chat_session": session, "oob": True}
    response.write(render(request, "base.html#session-item", item).content)
    mode = session.get_mode_display()
    response.write(_announcement(f"Mode: {mode}, from the next message on; new chats start in it."))
    # The room for a message depends on the mode (its system prompt, tool schemas): recount.
    response.write(render(request, f"{SESSION_PAGE}#composer-refresh", {"session_id": session.pk, "oob": True}).content)
    return response


@require_POST
async def session_compress(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """ "Compress now": fold the session's history before its newest question into the summary
    (:func:`chatapp.conversation.compress.session_memory_compress`). htmx gets the refreshed inspector and an
    announcement of the outcome; a plain request goes back to the chat page. Every socket of the
    session is told too (``memory.compression``, ``memory.summary``)."""
    # sync_to_async, not channels' database_sync_to_async: the request's connection handling is
    # Django's here (it closes connections when the response ends).
    session = await sync_to_async(session_get_for_owner)(request, session_id)
    events = await session_memory_compress(session_id=session.pk)
    if not request.htmx:
        return redirect("session-detail", session_id=session.pk)
    state = await sync_to_async(inspector_state_get)(session_id=session.pk)
    text = " ".join(compression_sentence(event) for event in events) or NOTHING_TO_COMPRESS
    response = await sync_to_async(render)(request, f"{SESSION_PAGE}#inspector", {"inspector": state})
    # An event, not an out-of-band #announce: the page's socket usually replaces the inspector
    # (and this form in it) before this response arrives, and htmx looks for out-of-band targets
    # from the requesting element, which is then detached ("oobErrorNoTarget"). The event goes
    # to <body> then; chat.js puts the text in #announce.
    return trigger_client_event(response, ANNOUNCE_EVENT, {"text": text}, after="swap")


@require_POST
def session_composer_count(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """The composer's token count of the posted ``text`` (the message being typed, not sent)
    against the room this chat's context window leaves for one message
    (:func:`chatapp.ui.composer.composer_count_get`): the ``composer-count`` partial. Any text is
    answered (an empty one, or one over ``CHAT_MAX_MESSAGE_CHARS``, says so); 404 for anyone but
    the session's owner."""
    session = session_get_for_owner(request, session_id)
    count = composer_count_get(session=session, text=request.POST.get("text", ""))
    return render(request, f"{SESSION_PAGE}#composer-count", {"composer": count})


@require_safe
def session_key_facts(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """The inspector's Key facts section: its partial for htmx, else the chat page."""
    session = session_get_for_owner(request, session_id)
    if request.htmx:
        return render(request, f"{SESSION_PAGE}#key-facts", {"key_facts": key_facts_section_get(session_id=session.pk)})
    return render(request, SESSION_PAGE, _session_page_context(request, session))


@require_safe
def session_recall(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """The inspector's Recall section (docs/memory.md §12): its partial for htmx, else the chat
    page. 404 for anyone but the session's owner."""
    session = session_get_for_owner(request, session_id)
    if request.htmx:
        return render(request, f"{SESSION_PAGE}#recall", {"recall": recall_section_get(session_id=session.pk)})
    return render(request, SESSION_PAGE, _session_page_context(request, session))


@require_GET
async def session_export(request: HtmxHttpRequest, session_id: int, fmt: str) -> StreamingHttpResponse:
    """Download the session with its memory (messages, summary versions, key facts, compression
    events, memory job; docs/export.md) as ``export.md`` (Markdown) or ``export.json``, an
    attachment with a safe file name, streamed page by page (:mod:`chatapp.chats.export`). 404
    for a session that is not the caller's and for any other format."""
    export_format = EXPORT_FORMATS.get(fmt)
    if export_format is None:
        raise Http404("No such export format.")
    # sync_to_async, as for "compress now": the request's connection handling is Django's here.
    session = await sync_to_async(session_get_for_owner)(request, session_id)
    response = StreamingHttpResponse(
        chat_export_stream(session=session, export_format=export_format), content_type=export_format.content_type
    )
    filename = chat_export_filename(session=session, export_format=export_format)
    # The name is ASCII letters, digits, hyphens and a dot (chat_export_filename): no quoting needed.
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "private, no-store"
    return response


@require_POST
def session_fact_pin(request: HtmxHttpRequest, session_id: int, fact_id: int) -> HttpResponse:
    """Pin (``pinned=true``) or unpin (``pinned=false``) one of the session's key facts
    (docs/memory.md §11): a pinned fact is in every request's key-facts block, first, and no
    extraction supersedes it. Answers as :func:`_key_fact_answer`."""
    session, fact_id = _key_fact_target(request, session_id, fact_id)
    form = KeyFactPinForm(request.POST)
    if not form.is_valid():
        return _key_fact_answer(request, session, fact_id=fact_id, error=_form_error(form))
    with _fact_404():
        fact = memory_engine().fact_pin(memory_key_of(session.pk), fact_id, pinned=form.cleaned_data["pinned"])
    done = f"{'Always pinned' if fact.pinned_by_user else 'No longer always pinned'}: {_fact_name(fact)}."
    return _key_fact_answer(request, session, fact_id=fact_id, done=done)


@require_POST
def session_fact_hide(request: HtmxHttpRequest, session_id: int, fact_id: int) -> HttpResponse:
    """Hide (``hidden=true``) one of the session's key facts from every request, or restore it
    (``hidden=false``). Answers as :func:`_key_fact_answer`."""
    session, fact_id = _key_fact_target(request, session_id, fact_id)
    form = KeyFactHideForm(request.POST)
    if not form.is_valid():
        return _key_fact_answer(request, session, fact_id=fact_id, error=_form_error(form))
    with _fact_404():
        fact = memory_engine().fact_hide(memory_key_of(session.pk), fact_id, hidden=form.cleaned_data["hidden"])
    done = f"{'Hid' if fact.hidden_by_user else 'Restored'} {_fact_name(fact)}."
    return _key_fact_answer(request, session, fact_id=fact_id, done=done)


@require_POST
def session_fact_edit(request: HtmxHttpRequest, session_id: int, fact_id: int) -> HttpResponse:
    """Correct the value of one of the session's key facts (``value``, 1 to 200 characters): a
    new fact of the same slot with ``extractor`` ``user`` supersedes it, which is kept
    (docs/memory.md §11). Answers as :func:`_key_fact_answer`."""
    session, fact_id = _key_fact_target(request, session_id, fact_id)
    form = KeyFactEditForm(request.POST)
    if not form.is_valid():
        return _key_fact_answer(request, session, fact_id=fact_id, error=_form_error(form))
    try:
        with _fact_404():
            fact = memory_engine().fact_edit(memory_key_of(session.pk), fact_id, value=form.cleaned_data["value"])
    except ValueError as exc:
        return _key_fact_answer(request, session, fact_id=fact_id, error=str(exc))
    return _key_fact_answer(request, session, fact_id=fact.id, done=f"Changed {_fact_name(fact)}.")


def _key_fact_target(request: HtmxHttpRequest, session_id: int, fact_id: int) -> tuple[ChatSession, int]:
    """The caller's session and the fact id of a key-fact action; ``Http404`` for a session that
    is not the caller's and for an id no database key can have."""
    session = session_get_for_owner(request, session_id)
    if not 0 < fact_id <= SESSION_ID_MAX:
        raise Http404("No such key fact.")
    return session, fact_id


@contextmanager
def _fact_404() -> Iterator[None]:
    """``KeyFactNotFound`` (a fact that is not this chat's, or none) as ``Http404``."""
    try:
        yield
    except KeyFactNotFound:
        raise Http404("No such key fact.") from None


def _fact_name(fact: KeyFact) -> str:
    return f"{fact.key} {fact.value}"


def _form_error(form: KeyFactPinForm | KeyFactHideForm | KeyFactEditForm) -> str:
    return " ".join(str(message) for messages in form.errors.values() for message in messages)


def _key_fact_answer(
    request: HtmxHttpRequest, session: ChatSession, *, fact_id: int, done: str = "", error: str = ""
) -> HttpResponse:
    """The answer to a key-fact action. Done: htmx gets the re-rendered Key facts section and
    ``done`` announced; a plain request goes back to the chat page. ``error`` (nothing was
    changed): the section with the error next to fact ``fact_id``, 422 to htmx (swapped, see
    ``htmx-config`` in ``base.html``) and the chat page with it, 400, to a plain request; but
    ``Http404`` when the session has no fact ``fact_id``."""
    if not error and not request.htmx:
        return redirect(reverse("session-detail", kwargs={"session_id": session.pk}) + "#key-facts")
    section = key_facts_section_get(session_id=session.pk)
    if not error:
        response = render(request, f"{SESSION_PAGE}#key-facts", {"key_facts": section})
        return trigger_client_event(response, ANNOUNCE_EVENT, {"text": done}, after="swap")
    if fact_id not in section.fact_ids:
        raise Http404("No such key fact.")
    if request.htmx:
        section = replace(section, error=error, error_fact_id=fact_id)
        return render(request, f"{SESSION_PAGE}#key-facts", {"key_facts": section}, status=422)
    context = _session_page_context(request, session)
    page = context["page"]
    context["page"] = replace(
        page, inspector=replace(page.inspector, key_facts=replace(section, error=error, error_fact_id=fact_id))
    )
    return render(request, SESSION_PAGE, context, status=400)


def _announcement(text: str) -> str:
    return format_html('<p id="announce" class="announce" role="status" hx-swap-oob="true">{}</p>', text)


def _kb_context(request: HtmxHttpRequest, **extra: Any) -> dict[str, Any]:
    return {
        **_layout_context(owner_from(request)),
        "kb_page": True,
        "documents": document_list(),
        "kb_can_edit": kb_editor_allowed(request),
        "upload_form": DocumentUploadForm(),
        "max_upload_kib": settings.KB_MAX_UPLOAD_BYTES // 1024,
        **extra,
    }


@require_safe
def kb_index(request: HtmxHttpRequest) -> HttpResponse:
    """The knowledge base: its documents and an upload form (htmx: the document list only,
    e.g. after the ``kb-changed`` trigger)."""
    if request.htmx:
        return render(request, f"{KB_PAGE}#document-list", _kb_list_context(request))
    return render(request, KB_PAGE, _kb_context(request))


def _kb_list_context(request: HtmxHttpRequest) -> dict[str, Any]:
    return {"documents": document_list(), "kb_can_edit": kb_editor_allowed(request)}


@require_POST
def kb_upload(request: HtmxHttpRequest) -> HttpResponse:
    """Store an uploaded text/Markdown document (validated by :class:`DocumentUploadForm`).
    htmx gets a fresh form with a notice and the ``kb-changed`` trigger (the list refreshes
    itself); errors answer 422 (htmx) or 400 with the form; a plain success redirects.
    403 unless the caller may edit the knowledge base (``KB_EDITORS``)."""
    kb_editor_check(request)
    form = DocumentUploadForm(request.POST, request.FILES)
    if not form.is_valid():
        if request.htmx:
            context = {"upload_form": form, "kb_can_edit": True, "max_upload_kib": settings.KB_MAX_UPLOAD_BYTES // 1024}
            return render(request, f"{KB_PAGE}#upload-form", context, status=422)
        return render(request, KB_PAGE, _kb_context(request, upload_form=form), status=400)
    document, changed = document_upload(
        filename=form.cleaned_data["file"].name, body=form.cleaned_data["text"], title=form.cleaned_data["title"]
    )
    if not request.htmx:
        return redirect("kb-index")
    context = {
        "upload_form": DocumentUploadForm(),
        "kb_can_edit": True,
        "max_upload_kib": settings.KB_MAX_UPLOAD_BYTES // 1024,
        "uploaded": document,
        "uploaded_changed": changed,
        "uploaded_passages": document.chunks.count(),
    }
    return trigger_client_event(render(request, f"{KB_PAGE}#upload-form", context), KB_CHANGED_EVENT)


@require_POST
def kb_delete(request: HtmxHttpRequest, document_id: int) -> HttpResponse:
    """Delete a document and its passages (404 if there is none): htmx gets the document list,
    a plain request the knowledge-base page. 403 unless the caller may edit the knowledge base."""
    kb_editor_check(request)
    if not document_delete(document_id=document_id):
        raise Http404("No such document.")
    if not request.htmx:
        return redirect("kb-index")
    return render(request, f"{KB_PAGE}#document-list", _kb_list_context(request))
