"""Pages and their htmx partials: sessions, the search across them, the chat page with its inspector, the knowledge base.

Views only parse, authorize (:mod:`chatapp.chats.access`: 404 for another's session), call and render: htmx
gets the partial it targets, a plain request the whole page. Form errors answer 422 to htmx, 400 otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from uuid import uuid4

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
from chatapp.chats.limits import RateLimited, owner_label, rate_limit_take
from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.chats.search import SEARCH_MAX_CHARS, message_search_for_owner
from chatapp.chats.selectors import reply_version_get, session_list_for_owner
from chatapp.chats.services import (
    chat_session_create,
    chat_session_delete,
    chat_session_mode_set,
    chat_session_rename,
)
from chatapp.conversation.compress import session_memory_compress
from chatapp.conversation.fork import ForkRefused, chat_session_fork
from chatapp.conversation.regenerate import RegenerateRefused, reply_version_restore
from chatapp.conversation.runner import chat_turn_start
from chatapp.kb.documents import document_delete, document_list, document_upload
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession
from chatapp.ui.composer import composer_count_get
from chatapp.ui.forms import (
    DocumentUploadForm,
    KeyFactEditForm,
    KeyFactHideForm,
    KeyFactPinForm,
    MessageEditForm,
    SessionCreateForm,
    SessionModeForm,
    SessionRenameForm,
)
from chatapp.ui.inspector.facts import key_facts_section_get
from chatapp.ui.inspector.history import request_history_get
from chatapp.ui.inspector.recall import recall_section_get
from chatapp.ui.inspector.state import inspector_state_get
from chatapp.ui.page_feed import chat_page_state_get, compression_sentence
from memory.api import KeyFact, KeyFactNotFound

SESSION_PAGE = "chat/session.html"
MANAGE_PAGE = "chat/session_manage.html"
KB_PAGE = "chat/kb.html"
SEARCH_PAGE = "chat/search.html"
REQUESTS_PAGE = "chat/requests.html"
KB_CHANGED_EVENT = "kb-changed"  # HX-Trigger: the document list changed
NOTHING_TO_COMPRESS = "Nothing to compress yet: this chat has no question."
ANNOUNCE_EVENT = "chat:announce"  # chat.js puts its ``text`` in #announce
# The mode of the chat the visitor last opened, created or switched: new chats start in it.
LAST_MODE_SESSION_KEY = "chat_last_mode"


class HtmxHttpRequest(HttpRequest):
    """A request with the ``htmx`` that ``HtmxMiddleware`` adds (django-htmx's typing recipe)."""

    htmx: HtmxDetails


def _layout_context(
    owner: Owner, *, chat_session: ChatSession | None = None, form: SessionCreateForm | None = None
) -> dict[str, Any]:
    """What ``base.html`` needs: the sidebar and the offline banner."""
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
    try:
        match = resolve(request.htmx.current_url_abs_path or "")
    except Resolver404:
        return None
    if match.url_name != "session-detail":
        return None
    return session_queryset_for_owner(owner).filter(pk=match.kwargs["session_id"]).first()


def _is_current_page(request: HtmxHttpRequest, session: ChatSession) -> bool:
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
    """The caller's chats and a form to start one; a HEAD (an uptime probe) creates no visitor session."""
    owner = owner_ensure(request) if request.method == "GET" else owner_from(request)
    return render(request, "chat/index.html", _index_context(request, owner))


@require_safe
def chat_search(request: HtmxHttpRequest) -> HttpResponse:
    """The caller's messages matching ``q`` (any text answered): htmx gets the results, a plain request their page."""
    owner = owner_from(request)
    context = {"search": message_search_for_owner(owner=owner, query=request.GET.get("q", "")), "max": SEARCH_MAX_CHARS}
    if request.htmx:
        return render(request, f"{SEARCH_PAGE}#search-results", context)
    return render(request, SEARCH_PAGE, {**_layout_context(owner), **context})


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for ``/favicon.ico`` whatever the page links: a temporary redirect to the SVG."""
    return redirect(static("favicon.svg"))


def _last_mode(request: HttpRequest) -> str:
    """The visitor's last used mode, else agent."""
    mode = request.session.get(LAST_MODE_SESSION_KEY)
    return mode if mode in ChatSession.Mode.values else ChatSession.Mode.AGENT


def _last_mode_remember(request: HttpRequest, mode: str) -> None:
    if request.session.get(LAST_MODE_SESSION_KEY) != mode:
        request.session[LAST_MODE_SESSION_KEY] = mode


def _index_context(request: HttpRequest, owner: Owner, form: SessionCreateForm | None = None) -> dict[str, Any]:
    return {**_layout_context(owner, form=form), "new_chat_mode": ChatSession.Mode(_last_mode(request)).label}


@require_POST
def session_create(request: HtmxHttpRequest) -> HttpResponse:
    """Start a chat in the posted ``mode``, else the last used one, and go to it; 400 for an unknown mode."""
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
    """The chat page; opening a chat makes its mode the visitor's last used one."""
    session = session_get_for_owner(request, session_id)
    _last_mode_remember(request, session.mode)
    return render(request, SESSION_PAGE, _session_page_context(request, session))


@require_safe
def session_inspector(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = session_get_for_owner(request, session_id)
    if request.htmx:
        return render(request, f"{SESSION_PAGE}#inspector", {"inspector": inspector_state_get(session_id=session.pk)})
    return render(request, SESSION_PAGE, _session_page_context(request, session))


@require_safe
def session_requests(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """The chat's requests one by one (``call``: a model call id, else the newest); 404 for a request not of it."""
    session = session_get_for_owner(request, session_id)
    call = request.GET.get("call") or None
    call_id = int(call) if call and call.isascii() and call.isdigit() and 0 < int(call) <= SESSION_ID_MAX else None
    if call is not None and call_id is None:
        raise Http404("No such request.")
    history = request_history_get(session_id=session.pk, model_call_id=call_id)
    if history is None and call_id is not None:
        raise Http404("No such request.")
    context = {**_layout_context(owner_from(request), chat_session=session), "history": history}
    return render(request, REQUESTS_PAGE, context)


@require_safe
def session_item(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = session_get_for_owner(request, session_id)
    if not request.htmx:
        return redirect("session-detail", session_id=session.pk)
    current = session if _is_current_page(request, session) else None
    return render(request, "base.html#session-item", {"s": session, "chat_session": current})


@require_http_methods(["GET", "POST"])
def session_rename(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """GET: the rename form. POST: rename; htmx gets the sidebar entry (and the title of the open chat)."""
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
    """GET: a confirmation page. POST: delete the session and its memory; htmx gets the session list, or a
    client redirect to the start page when the open chat went."""
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
    """Switch the mode of the session's next turns (and of the visitor's next chat)."""
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
    # The room for a message depends on the mode's prompt and tools: recount.
    response.write(render(request, f"{SESSION_PAGE}#composer-refresh", {"session_id": session.pk, "oob": True}).content)
    return response


@require_POST
async def session_compress(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """ "Compress now": fold the history before the newest question; htmx gets the inspector and an
    announcement, and every socket of the session the events."""
    # sync_to_async, not database_sync_to_async: Django closes this request's connections itself.
    session = await sync_to_async(session_get_for_owner)(request, session_id)
    events = await session_memory_compress(session_id=session.pk)
    if not request.htmx:
        return redirect("session-detail", session_id=session.pk)
    state = await sync_to_async(inspector_state_get)(session_id=session.pk)
    text = " ".join(compression_sentence(event) for event in events) or NOTHING_TO_COMPRESS
    response = await sync_to_async(render)(request, f"{SESSION_PAGE}#inspector", {"inspector": state})
    # An event, not an out-of-band #announce: the socket has usually replaced this form by now, and
    # htmx finds no out-of-band target from a detached element ("oobErrorNoTarget").
    return trigger_client_event(response, ANNOUNCE_EVENT, {"text": text}, after="swap")


@require_POST
def session_composer_count(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    """The token count of the ``text`` being typed against the room for one message (any text answered)."""
    session = session_get_for_owner(request, session_id)
    count = composer_count_get(session=session, text=request.POST.get("text", ""))
    return render(request, f"{SESSION_PAGE}#composer-count", {"composer": count})


@require_safe
def session_key_facts(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = session_get_for_owner(request, session_id)
    if request.htmx:
        return render(request, f"{SESSION_PAGE}#key-facts", {"key_facts": key_facts_section_get(session_id=session.pk)})
    return render(request, SESSION_PAGE, _session_page_context(request, session))


@require_safe
def session_recall(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = session_get_for_owner(request, session_id)
    if request.htmx:
        return render(request, f"{SESSION_PAGE}#recall", {"recall": recall_section_get(session_id=session.pk)})
    return render(request, SESSION_PAGE, _session_page_context(request, session))


@require_POST
async def session_message_fork(request: HtmxHttpRequest, session_id: int, message_id: int) -> HttpResponse:
    """Edit user message ``message_id`` into a new chat (docs/memory.md §8, "Edit into a new chat") and go there, its
    turn running; 404 for a chat or message that is not the caller's, 422 with the reason for an unusable text."""
    session = await sync_to_async(session_get_for_owner)(request, session_id)
    form = MessageEditForm(request.POST)
    if not form.is_valid():
        return HttpResponse(
            " ".join(str(error) for error in form.errors["text"]), status=422, content_type="text/plain; charset=utf-8"
        )
    try:
        message = await sync_to_async(chat_session_fork)(
            session=session, message_id=message_id, text=form.cleaned_data["text"], client_message_id=f"edit-{uuid4()}"
        )
    except ForkRefused as exc:
        raise Http404(str(exc)) from None
    chat_turn_start(
        session_id=message.session_id, user_message_id=message.pk, lease_fresh=True, question=message.content or ""
    )
    url = reverse("session-detail", args=[message.session_id])
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@require_POST
async def session_reply_version_use(
    request: HtmxHttpRequest, session_id: int, turn_id: int, number: int
) -> HttpResponse:
    """Make earlier version ``number`` the reply to turn ``turn_id`` again, and schedule the memory job that indexes
    it; every open page of the chat learns it over its socket. 404 for a chat that is not the caller's, 422 with the
    reason when it cannot be done."""
    session = await sync_to_async(session_get_for_owner)(request, session_id)
    try:
        await sync_to_async(reply_version_restore)(session=session, turn_id=turn_id, number=number)
    except RegenerateRefused as exc:
        return HttpResponse(str(exc), status=422, content_type="text/plain; charset=utf-8")
    memory_engine().schedule(memory_key_of(session.pk))
    url = reverse("session-detail", args=[session.pk])
    return HttpResponse(status=204) if request.htmx else redirect(url)


@require_safe
def session_reply_version(request: HtmxHttpRequest, session_id: int, turn_id: int, number: int) -> HttpResponse:
    """Earlier version ``number`` of the reply to turn ``turn_id`` (docs/memory.md §8, "Regenerate"); 404 for a version,
    turn or chat that is not the caller's."""
    session = session_get_for_owner(request, session_id)
    version, total = reply_version_get(session_id=session.pk, turn_id=turn_id, number=number)
    context = {"version": version, "total": total, "final": version.final_reply, "sid": session.pk}
    return render(request, f"{SESSION_PAGE}#reply-version", context)


@require_GET
async def session_export(request: HtmxHttpRequest, session_id: int, fmt: str) -> StreamingHttpResponse:
    """The session with its memory (docs/export.md) as a streamed ``export.md`` or ``export.json``; 404
    for any other format."""
    export_format = EXPORT_FORMATS.get(fmt)
    if export_format is None:
        raise Http404("No such export format.")
    # sync_to_async, as for "compress now".
    session = await sync_to_async(session_get_for_owner)(request, session_id)
    response = StreamingHttpResponse(
        chat_export_stream(session=session, export_format=export_format), content_type=export_format.content_type
    )
    filename = chat_export_filename(session=session, export_format=export_format)
    # ASCII letters, digits, hyphens and a dot (chat_export_filename): no quoting needed.
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "private, no-store"
    return response


@require_POST
def session_fact_pin(request: HtmxHttpRequest, session_id: int, fact_id: int) -> HttpResponse:
    """Pin or unpin (``pinned``) a key fact (docs/memory.md §11)."""
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
    """Hide a key fact from every request, or restore it (``hidden``)."""
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
    """Correct a key fact's ``value``: a ``user`` fact of its slot supersedes it (docs/memory.md §11)."""
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
    """The caller's session and the fact id; ``Http404`` for another's session or an impossible id."""
    session = session_get_for_owner(request, session_id)
    if not 0 < fact_id <= SESSION_ID_MAX:
        raise Http404("No such key fact.")
    return session, fact_id


@contextmanager
def _fact_404() -> Iterator[None]:
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
    """The Key facts section with ``done`` announced, or with ``error`` next to fact ``fact_id`` (422 to
    htmx, 400 otherwise); ``Http404`` when the session has no such fact."""
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
    """The knowledge base and an upload form; htmx (``kb-changed``) gets the document list only."""
    if request.htmx:
        return render(request, f"{KB_PAGE}#document-list", _kb_list_context(request))
    return render(request, KB_PAGE, _kb_context(request))


def _kb_list_context(request: HtmxHttpRequest) -> dict[str, Any]:
    return {"documents": document_list(), "kb_can_edit": kb_editor_allowed(request)}


@require_POST
def kb_upload(request: HtmxHttpRequest) -> HttpResponse:
    """Store an uploaded text/Markdown document; htmx gets a fresh form and ``kb-changed``. 403 unless
    the caller may edit the knowledge base (``KB_EDITORS``)."""
    kb_editor_check(request)
    form = DocumentUploadForm(request.POST, request.FILES)
    status, retry_after = (422 if request.htmx else 400), 0
    try:
        rate_limit_take("upload", owner=_request_owner(request), address=request.META.get("REMOTE_ADDR"))
    except RateLimited as exc:
        form.is_valid()
        form.add_error(None, str(exc))
        status, retry_after = 429, exc.retry_after
    if not form.is_valid():
        if request.htmx:
            context = {"upload_form": form, "kb_can_edit": True, "max_upload_kib": settings.KB_MAX_UPLOAD_BYTES // 1024}
            response = render(request, f"{KB_PAGE}#upload-form", context, status=status)
        else:
            response = render(request, KB_PAGE, _kb_context(request, upload_form=form), status=status)
        if retry_after:
            response["Retry-After"] = str(retry_after)
        return response
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


def _request_owner(request: HtmxHttpRequest) -> str:
    user_id = request.user.pk if request.user.is_authenticated else None
    return owner_label(user_id=user_id, session_key=request.session.session_key)


@require_POST
def kb_delete(request: HtmxHttpRequest, document_id: int) -> HttpResponse:
    """Delete a document and its passages (404 if none); 403 unless the caller may edit the knowledge base."""
    kb_editor_check(request)
    if not document_delete(document_id=document_id):
        raise Http404("No such document.")
    if not request.htmx:
        return redirect("kb-index")
    return render(request, f"{KB_PAGE}#document-list", _kb_list_context(request))
