"""The chat page: its state, and the live feed that keeps an open page up to date.

The page is server-rendered (``templates/chat/session.html`` and its named partials). Its socket
(``/ws/chat/<id>/?ui=html``, opened by htmx's WebSocket extension) receives HTML instead of JSON:
each server event becomes one frame of out-of-band fragments (``hx-swap-oob``) that the extension
swaps into the page. :class:`PageFeed` renders them and remembers what its page shows, so that a
message is appended once and only the transcript marks that changed are sent.

===================  ===========================================================================
event                fragments of the frame
===================  ===========================================================================
(connect, chat.sync) snapshot: the transcript, the live replies, the inspector, the turn status
                     and the title (the page's state as stored, whatever it showed before)
chat.message         the rendered message appended to ``#messages`` (once; the first one removes
                     the empty-state line); a user message also
                     refreshes the title and its sidebar entry; a turn's tool step resets its
                     live reply to "thinking", its final reply removes it
chat.turn            a live reply (``#stream-<turn id>``, "thinking") and the turn status
chat.delta           the text appended to the live reply
chat.retrieval       a line in the live reply naming the passages found
memory.compression   an announcement (and, within a turn, a line in the live reply)
memory.context       the inspector and the changed transcript marks
memory.summary       the same ("compress now" changed the summary)
chat.done            the live reply removed; the inspector, marks and turn status refreshed
error                the error text; a rejected message's pending bubble is marked
chat.ack             nothing: the stored message arrives as ``chat.message``
===================  ===========================================================================

Rendering touches the database (except for ``chat.delta``): async callers use
``database_sync_to_async``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.template.loader import render_to_string
from django.utils.html import format_html

from chatapp.chats import selectors
from chatapp.conversation import leases
from chatapp.models import ChatSession, Message
from chatapp.ui.inspector import (
    InspectorState,
    MarkBasis,
    inspector_state_get,
    message_marks_get,
)

PAGE_TEMPLATE = "chat/session.html"


@dataclass(frozen=True, kw_only=True)
class ChatPageState:
    """What the chat page of ``session`` shows: ``transcript`` as ``(message, mark)`` pairs in id
    order, ``running`` the ids of the turns still answering, and the inspector's state."""

    session: ChatSession
    transcript: list[tuple[Message, str]]
    running: list[int]
    inspector: InspectorState


def chat_page_state_get(*, session: ChatSession) -> ChatPageState:
    """The chat page's state for ``session`` (no access check: callers authorize)."""
    inspector = inspector_state_get(session_id=session.pk)
    basis = inspector.basis
    return ChatPageState(
        session=session,
        transcript=[(message, basis.mark(message.pk)) for message in selectors.message_list(session_id=session.pk)],
        running=turns_running(session.pk),
        inspector=inspector,
    )


def turns_running(session_id: int) -> list[int]:
    """Ids of the session's turns still answering (see ``leases.turn_in_flight_list``)."""
    return leases.turn_in_flight_list(session_id=session_id)


def partial_render(name: str, context: dict[str, Any]) -> str:
    """The named partial ``name`` of the chat page rendered for a socket (no request, so no
    CSRF field: htmx sends the token in the ``X-CSRFToken`` header set on ``<body>``)."""
    return render_to_string(f"{PAGE_TEMPLATE}#{name}", context)


class PageFeed:
    """The live feed of one open chat page: turns server events into out-of-band HTML frames
    (see the module docstring) and remembers what the page shows -- the marks of the messages
    it has (``marks``), the basis of new marks, and the turns it shows a live reply for."""

    def __init__(self, *, session_id: int) -> None:
        self.session_id = session_id
        self.marks: dict[int, str] = {}
        self.basis = MarkBasis()
        self.streams: set[int] = set()

    def snapshot(self) -> str:
        """The page's whole state as stored; resets what the feed remembers. Returns ``""``
        when the session no longer exists."""
        session = ChatSession.objects.filter(pk=self.session_id).first()
        if session is None:
            return ""
        state = chat_page_state_get(session=session)
        self.marks = {message.pk: mark for message, mark in state.transcript}
        self.basis = state.inspector.basis
        self.streams = set(state.running)
        context = {"chat_session": session, "page": state, "inspector": state.inspector, "oob": True}
        return "".join(
            [
                f'<div hx-swap-oob="innerHTML:#messages">{partial_render("transcript", context)}</div>',
                f'<div hx-swap-oob="innerHTML:#live">{partial_render("live", context)}</div>',
                partial_render("inspector", context),
                partial_render("turn-status", {"running": state.running, "oob": True}),
                partial_render("chat-title", context),
            ]
        )

    def render(self, event: dict[str, Any]) -> str:
        """The frame for server event ``event`` (``""`` when the page needs nothing)."""
        kind = event.get("type")
        turn_id: int | None = event.get("turn_id")
        if kind == "chat.delta":
            return self.render_delta(event)
        if kind == "chat.message":
            return self._message(event["message"]["id"])
        if kind == "chat.turn" and turn_id is not None:
            return self._stream_ensure(turn_id) + self._turn_status()
        if kind == "chat.retrieval" and turn_id is not None:
            titles = ", ".join(dict.fromkeys(p["title"] for p in event.get("passages", []))) or "nothing matched"
            return self._step(turn_id, f"Searched the knowledge base: {titles}")
        if kind == "memory.compression":
            text = compression_sentence(event["event"])
            step = self._step(turn_id, text) if turn_id is not None else ""
            return step + announce(text)
        if kind in ("memory.context", "memory.summary"):
            return self._inspector()
        if kind == "chat.done" and turn_id is not None:
            return self._stream_remove(turn_id) + self._inspector() + self._turn_status()
        if kind == "error":
            return self._error(event)
        return ""

    def render_delta(self, event: dict[str, Any]) -> str:
        """The frame of a ``chat.delta``: the text appended to the turn's live reply (created
        first if the page has none). Needs no database, so async callers may call it directly."""
        turn_id = int(event["turn_id"])
        return self._stream_ensure(turn_id) + format_html(
            '<div hx-swap-oob="beforeend:#stream-{} .stream-text">{}</div>', turn_id, event.get("text", "")
        )

    def _message(self, message_id: int) -> str:
        message = Message.objects.filter(pk=message_id, session_id=self.session_id).first()
        if message is None:
            return ""
        parts: list[str] = []
        if message.pk not in self.marks:
            if not self.marks:
                # The page's first message: the empty-state line goes (it shows only while the
                # transcript it was rendered with is empty, so the target exists).
                parts.append('<div hx-swap-oob="delete:#messages .empty-chat"></div>')
            mark = self.basis.mark(message.pk)
            self.marks[message.pk] = mark
            rendered = partial_render("message", {"message": message, "mark": mark})
            parts.append(f'<div hx-swap-oob="beforeend:#messages">{rendered}</div>')
        if message.role == Message.Role.USER:
            session = ChatSession.objects.get(pk=self.session_id)
            context = {"chat_session": session, "s": session, "oob": True}
            parts += [partial_render("chat-title", context), render_to_string("base.html#session-item", context)]
        elif message.reply_to_id in self.streams:
            turn_id = message.reply_to_id
            if message.is_final_reply:
                parts.append(self._stream_remove(turn_id))
            else:
                parts.append(partial_render("stream", {"turn_id": turn_id, "oob": True}))
        return "".join(parts)

    def _stream_ensure(self, turn_id: int) -> str:
        if turn_id in self.streams:
            return ""
        self.streams.add(turn_id)
        return f'<div hx-swap-oob="beforeend:#live">{partial_render("stream", {"turn_id": turn_id})}</div>'

    def _stream_remove(self, turn_id: int) -> str:
        if turn_id not in self.streams:
            return ""
        self.streams.discard(turn_id)
        return format_html('<div hx-swap-oob="delete:#stream-{}"></div>', turn_id)

    def _step(self, turn_id: int, text: str) -> str:
        return self._stream_ensure(turn_id) + format_html(
            '<div hx-swap-oob="beforeend:#stream-{} .stream-steps"><p>{}</p></div>', turn_id, text
        )

    def _inspector(self) -> str:
        state = inspector_state_get(session_id=self.session_id)
        self.basis = state.basis
        marks = message_marks_get(session_id=self.session_id, basis=self.basis)
        changed = [(message_id, mark) for message_id, mark in marks.items() if self.marks.get(message_id, mark) != mark]
        self.marks.update({message_id: mark for message_id, mark in changed})
        fragments = [partial_render("inspector", {"inspector": state, "oob": True})]
        fragments += [
            partial_render("mark", {"message_id": message_id, "mark": mark, "oob": True})
            for message_id, mark in changed
        ]
        return "".join(fragments)

    def _turn_status(self) -> str:
        return partial_render("turn-status", {"running": turns_running(self.session_id), "oob": True})

    def _error(self, event: dict[str, Any]) -> str:
        text = str(event.get("message", "Something went wrong."))
        parts = [format_html('<div id="errors" class="errors" role="alert" hx-swap-oob="true"><p>{}</p></div>', text)]
        client_message_id = event.get("client_message_id")
        if client_message_id:
            # The id passed the protocol's pattern ([A-Za-z0-9_.:-]), so it cannot leave the quotes.
            parts.append(
                format_html(
                    '<div hx-swap-oob="beforeend:#outbox [data-client-id=&quot;{}&quot;]">'
                    '<p class="status rejected">Not sent: {}</p></div>',
                    client_message_id,
                    text,
                )
            )
        return "".join(parts)


def compression_sentence(event: dict[str, Any]) -> str:
    """One sentence about a compression event (``CompressionEvent.as_dict()``) for people."""
    kind = event.get("kind")
    before, after = event.get("tokens_before", 0), event.get("tokens_after", 0)
    if kind == "compression":
        how = "raw archive: the summarizer failed" if event.get("degraded") else "LLM summary"
        return (
            f"Memory compressed: {event.get('messages_summarized', 0)} messages folded into the summary "
            f"({how}); request {before:,} → {after:,} tokens."
        )
    if kind == "no_progress":
        return f"Memory: nothing could be summarized (request {before:,} tokens)."
    if kind == "overflow":
        return f"Memory: the current turn was cut to fit the context window ({after:,} tokens)."
    return f"Memory: a concurrent request updated the summary first ({kind})."


def announce(text: str) -> str:
    """An out-of-band fragment that puts ``text`` in the page's polite status region."""
    return format_html('<p id="announce" class="announce" role="status" hx-swap-oob="true">{}</p>', text)
