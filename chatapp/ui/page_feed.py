"""The chat page's state, and the live feed of its socket (``/ws/chat/<id>/page/``, docs/architecture.md
"The chat page"): :class:`PageFeed` renders each server event as out-of-band htmx fragments and remembers
what the page shows, so a message is appended once and only changed marks are sent. The few events that
query the database say so (:meth:`PageFeed.needs_database`): async callers render those through ``orm_async``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.template.loader import render_to_string
from django.utils.html import format_html

from chatapp.chats import selectors, turns
from chatapp.conversation.demo import CLIENT_ID_PREFIX as DEMO_CLIENT_ID_PREFIX
from chatapp.conversation.demo import DEMO_SCRIPT
from chatapp.llm.embeddings import embedder_choice
from chatapp.models import ChatSession, Message
from chatapp.realtime.protocol import (
    ChatDeltaEvent,
    ChatDoneEvent,
    ChatMessageEvent,
    ChatRegeneratedEvent,
    ChatRetrievalEvent,
    ChatTurnEvent,
    ErrorEvent,
    MemoryCompressionEvent,
    MemoryContextEvent,
    MemoryFactsEvent,
    MemorySummaryEvent,
    ServerEvent,
)
from chatapp.ui.inspector.facts import KeyFacts, key_fact_from_dict, key_facts_build
from chatapp.ui.inspector.gauge import EstimateCheck, Gauge, Section, estimate_check_build
from chatapp.ui.inspector.marks import MARK_NOT_SENT, MarkBasis, folded_boundary_of
from chatapp.ui.inspector.recall import RecallSection, recall_build
from chatapp.ui.inspector.request import MESSAGE_SECTIONS, PATH_LABELS
from chatapp.ui.inspector.state import InspectorState, inspector_state_get
from chatapp.ui.inspector.summary import SUMMARY_TYPE_LABELS
from memory.api import CompressionRecord

PAGE_TEMPLATE = "chat/session.html"
CHAT_DELETED_TEXT = "This chat was deleted in another tab or window: nothing more can be sent here."


@dataclass(frozen=True, kw_only=True)
class ChatPageState:
    """``transcript`` as ``(message, mark)`` pairs in id order, ``running`` the turns still answering, ``lineage``
    where the chat and its edited copies diverge."""

    session: ChatSession
    transcript: list[tuple[Message, str]]
    running: list[int]
    inspector: InspectorState
    lineage: selectors.Lineage


def chat_page_state_get(*, session: ChatSession) -> ChatPageState:
    """No access check: callers authorize."""
    inspector = inspector_state_get(session_id=session.pk)
    basis = inspector.basis
    return ChatPageState(
        session=session,
        transcript=[
            (message, basis.mark_of(message.pk, message.origin))
            for message in selectors.message_list(session_id=session.pk)
        ],
        running=turns_running(session.pk),
        inspector=inspector,
        lineage=selectors.chat_lineage_get(session=session),
    )


def turns_running(session_id: int) -> list[int]:
    return turns.turn_in_flight_list(session_id=session_id)


def partial_render(name: str, context: dict[str, Any]) -> str:
    """A partial of the chat page for a socket: no request, so no CSRF field (htmx sends the header)."""
    return render_to_string(f"{PAGE_TEMPLATE}#{name}", context)


@dataclass(frozen=True, kw_only=True)
class LiveRequest:
    """The "Last request" panel from a ``memory.context`` event, before the reply: what ``request-panel``
    reads of a ``RequestSnapshot``; provider counts and texts come at ``chat.done`` (``texts_pending``)."""

    model_call_id: int
    step: int
    mode: str
    gauge: Gauge
    sections: list[Section]
    elisions: list[dict[str, Any]] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    model: str = ""
    prompt_tokens: int | None = None
    texts_pending: bool = True
    memory_path: str = ""
    waited_ms: int = 0
    estimate_check: EstimateCheck | None = None
    summary_boundary: int | None = None

    @property
    def path_label(self) -> str:
        return PATH_LABELS.get(self.memory_path, "").format(waited_ms=self.waited_ms)


def live_request_build(event: MemoryContextEvent, *, model_call_id: int, mode: str = "") -> LiveRequest:
    """The panel of the request ``event`` describes (pure), its rows as ``request_snapshot_build`` makes them."""
    check = estimate_check_build(
        event.calibration, estimated_tokens=event.tokens, prompt_tokens=None, context_window=event.context_window
    )
    window = check.window_tokens
    counts = event.sections
    kinds = Counter(str(source.get("kind", "")) for source in event.sources)
    sections = [
        _section(key, label, int(counts.get(key, 0)), window, message_count=kinds[kind])
        for key, label, kind in MESSAGE_SECTIONS
    ]
    sections.append(_section("tools", "Tool schemas", int(counts.get("tools", 0)), window))
    sections.append(_section("overhead", "Reply priming", event.tokens - sum(s.tokens for s in sections), window))
    sections.append(_section("free", "Free", max(0, window - event.tokens), window))
    return LiveRequest(
        model_call_id=model_call_id,
        step=event.step,
        mode=mode,
        gauge=Gauge(
            used=event.tokens,
            context_window=window,
            trigger_tokens=event.trigger_tokens,
            target_tokens=event.target_tokens,
        ),
        sections=sections,
        elisions=list(event.elisions),
        repairs=[str(repair) for repair in event.repairs],
        memory_path=event.path,
        waited_ms=event.waited_ms,
        estimate_check=check,
        summary_boundary=event.summary.get("last_message_id"),
    )


def mark_basis_from_context(event: MemoryContextEvent) -> MarkBasis:
    return MarkBasis(
        boundary=event.summary.get("last_message_id"),
        history_ids=_source_ids(event.sources, "history"),
        current_ids=_source_ids(event.sources, "current"),
    )


class PageFeed:
    """The live feed of one open chat page: server events to out-of-band HTML frames; remembers the page's
    marks, live replies (``streams``), the last request's key-facts groups, the recall index status and the
    demo step of each demo turn."""

    def __init__(self, *, session_id: int) -> None:
        self.session_id = session_id
        self.marks: dict[int, str] = {}
        self.basis = MarkBasis()
        self.streams: set[int] = set()
        self.modes: dict[int, str] = {}
        self.fact_request: dict[str, Any] | None = None
        self.recall_index: dict[str, Any] | None = None
        self.demo_steps: dict[int, int] = {}

    def snapshot(self) -> str:
        """The page's whole state as stored, and the feed's memory reset; ``""`` for a deleted session."""
        session = ChatSession.objects.filter(pk=self.session_id).first()
        if session is None:
            return ""
        state = chat_page_state_get(session=session)
        self.marks = {message.pk: mark for message, mark in state.transcript}
        self.basis = state.inspector.basis
        self.streams = set(state.running)
        self.fact_request = state.inspector.key_facts.request
        self.recall_index = state.inspector.recall.index if state.inspector.recall else None
        self.demo_steps = {}
        for message, _ in state.transcript:
            self._demo_step_note(message.pk, message.client_message_id)
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

    def needs_database(self, event: ServerEvent) -> bool:
        """Whether rendering ``event`` queries the database; the others may render in async code."""
        if isinstance(event, ChatMessageEvent):
            return event.message.get("role") == Message.Role.USER
        return isinstance(event, ChatTurnEvent | ChatDoneEvent | MemorySummaryEvent)

    def render(self, event: ServerEvent) -> str:
        if isinstance(event, ChatDeltaEvent):
            return self._stream_ensure(event.turn_id) + format_html(
                '<div hx-swap-oob="beforeend:#stream-{} .stream-text">{}</div>', event.turn_id, event.text
            )
        if isinstance(event, ChatMessageEvent):
            return self._message(event.message)
        if isinstance(event, ChatTurnEvent):
            self.modes[event.turn_id] = event.mode
            # A new turn clears the last announcement: only what this turn does is announced.
            return self._stream_ensure(event.turn_id) + self._turn_status() + announce("")
        if isinstance(event, ChatRetrievalEvent):
            titles = ", ".join(dict.fromkeys(p["title"] for p in event.passages)) or "nothing matched"
            return self._step(event.turn_id, f"Searched the knowledge base: {titles}")
        if isinstance(event, MemoryCompressionEvent):
            text = compression_sentence(CompressionRecord.from_dict(event.event))
            step = self._step(event.turn_id, text) if event.turn_id is not None else ""
            return step + announce(text)
        if isinstance(event, MemoryContextEvent):
            return self._context(event)
        if isinstance(event, MemorySummaryEvent):
            return self._inspector() + self._composer_refresh()
        if isinstance(event, MemoryFactsEvent):
            facts = [key_fact_from_dict(fact) for fact in event.facts]
            return key_facts_render(key_facts_build(session_id=self.session_id, facts=facts, request=self.fact_request))
        if isinstance(event, ChatDoneEvent):
            self.modes.pop(event.turn_id, None)
            return (
                self._stream_remove(event.turn_id)
                + self._inspector()
                + self._turn_status()
                + self._composer_refresh()
                + self._demo_end(event)
            )
        if isinstance(event, ChatRegeneratedEvent):
            for message_id in event.removed:
                self.marks.pop(message_id, None)
            gone = "".join(format_html('<div id="message-{}" hx-swap-oob="delete"></div>', pk) for pk in event.removed)
            return gone + announce(
                f"The reply to message #{event.turn_id} is being replaced (version {event.version})."
            )
        if isinstance(event, ErrorEvent):
            return self._error(event)
        return ""

    def deleted(self) -> str:
        """The frame for a chat deleted elsewhere: composer disabled, an alert, its sidebar entry gone."""
        notice = format_html(
            '<div id="errors" class="errors" role="alert" hx-swap-oob="true"><p>{}</p></div>', CHAT_DELETED_TEXT
        )
        return (
            partial_render("composer", {"gone": True})
            + notice
            + format_html('<div hx-swap-oob="delete:#session-item-{}"></div>', self.session_id)
        )

    def _demo_step_note(self, message_id: int, client_id: str | None) -> None:
        step = (client_id or "").removeprefix(DEMO_CLIENT_ID_PREFIX)
        if client_id != step and step.isdigit():
            self.demo_steps[message_id] = int(step)

    def _demo_end(self, event: ChatDoneEvent) -> str:
        """The demo's end in ``#thread-note`` when ``event`` ends its last step or a stopped one."""
        step = self.demo_steps.get(event.turn_id)
        if step is None:
            return ""
        if event.status == Message.Status.STOPPED:
            text = f"The demo stopped at step {step} of {len(DEMO_SCRIPT)}. This chat is yours to go on with."
        elif step == len(DEMO_SCRIPT):
            text = f"The demo has ended: all {len(DEMO_SCRIPT)} steps ran. This chat is yours to go on with."
        else:
            return ""
        return format_html('<p id="thread-note" class="thread-note" role="status" hx-swap-oob="true">{}</p>', text)

    def _message(self, message: dict[str, Any]) -> str:
        message_id = int(message["id"])
        parts: list[str] = []
        if message_id not in self.marks:
            if not self.marks:
                # The first message: the empty-state line, sure to be there, goes.
                parts.append('<div hx-swap-oob="delete:#messages .empty-chat"></div>')
            mark = self.basis.mark_of(message_id, message.get("origin", Message.Origin.MODEL))
            self.marks[message_id] = mark
            rendered = partial_render("message", {"message": message, "mark": mark, "session_id": self.session_id})
            parts.append(f'<div hx-swap-oob="beforeend:#messages">{rendered}</div>')
        role, turn_id = message.get("role"), message.get("reply_to")
        if role == Message.Role.USER:
            self._demo_step_note(message_id, message.get("client_message_id"))
        if role == Message.Role.USER:
            session = ChatSession.objects.filter(pk=self.session_id).first()
            if session is not None:
                context = {"chat_session": session, "s": session, "oob": True}
                parts += [partial_render("chat-title", context), render_to_string("base.html#session-item", context)]
        elif turn_id in self.streams:
            if role == Message.Role.ASSISTANT and not message.get("tool_calls"):  # the final reply
                parts.append(self._stream_remove(turn_id))
            else:
                parts.append(partial_render("stream", {"turn_id": turn_id, "oob": True}))
        return "".join(parts)

    def _context(self, event: MemoryContextEvent) -> str:
        """The panel and marks from the event alone; an overflow sent nothing, so the last request's
        marks stay and only what its compression folded moves (to "next request: in summary")."""
        if event.model_call_id is None:
            return self._marks_update(
                MarkBasis(
                    boundary=self.basis.boundary,
                    history_ids=self.basis.history_ids,
                    current_ids=self.basis.current_ids,
                    folded_boundary=folded_boundary_of(
                        sent=self.basis.boundary, stored=event.summary.get("last_message_id")
                    ),
                )
            )
        live = live_request_build(event, model_call_id=event.model_call_id, mode=self.modes.get(event.turn_id, ""))
        panel = partial_render("request-panel", {"last": live, "request_oob": True})
        recall = recall_build(
            session_id=self.session_id,
            request=event.recall or None,
            embedder=embedder_choice().as_dict(),
            index=self.recall_index,
        )
        return panel + recall_render(recall) + self._marks_update(mark_basis_from_context(event))

    def _inspector(self) -> str:
        state = inspector_state_get(session_id=self.session_id)
        self.fact_request = state.key_facts.request
        self.recall_index = state.recall.index if state.recall else None
        return partial_render("inspector", {"inspector": state, "oob": True}) + self._marks_update(state.basis)

    def _marks_update(self, basis: MarkBasis) -> str:
        self.basis = basis
        # An app-written row keeps its "not sent" mark whatever the request (docs/memory.md F-37).
        changed = {message_id: basis.mark(message_id) for message_id, was in self.marks.items() if was != MARK_NOT_SENT}
        changed = {message_id: mark for message_id, mark in changed.items() if self.marks[message_id] != mark}
        self.marks.update(changed)
        return "".join(
            partial_render("mark", {"message_id": message_id, "mark": mark, "oob": True})
            for message_id, mark in changed.items()
        )

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

    def _composer_refresh(self) -> str:
        """The composer recounts (the room for a message may have changed); it posts what is typed."""
        return partial_render("composer-refresh", {"session_id": self.session_id, "oob": True})

    def _turn_status(self) -> str:
        return partial_render("turn-status", {"running": turns_running(self.session_id), "oob": True})

    def _error(self, event: ErrorEvent) -> str:
        text = event.message or "Something went wrong."
        parts = [format_html('<div id="errors" class="errors" role="alert" hx-swap-oob="true"><p>{}</p></div>', text)]
        if event.client_message_id:
            # The protocol's pattern ([A-Za-z0-9_.:-]) keeps the id inside the quotes.
            parts.append(
                format_html(
                    '<div hx-swap-oob="beforeend:#outbox [data-client-id=&quot;{}&quot;]">'
                    '<p class="status rejected">Not sent: {}</p></div>',
                    event.client_message_id,
                    text,
                )
            )
        return "".join(parts)


def compression_sentence(event: CompressionRecord) -> str:
    before, after = event.tokens_before, event.tokens_after
    if event.kind == "compression":
        count = event.messages_summarized
        if event.degraded:
            what = f"{count} messages archived verbatim (raw archive: the summarizer failed)"
        else:
            written = event.summary_kind
            what = f"{count} messages folded into the summary ({SUMMARY_TYPE_LABELS.get(written, written)})"
        return f"Memory compressed: {what}; request {before:,} → {after:,} tokens."
    if event.kind == "no_progress":
        return f"Memory: nothing could be summarized (request {before:,} tokens)."
    if event.kind == "overflow":
        return f"Memory: the current turn was cut to fit the context window ({after:,} tokens)."
    return f"Memory: a concurrent request updated the summary first ({event.kind})."


def key_facts_render(key_facts: KeyFacts) -> str:
    """An out-of-band fragment that replaces the inspector's Key facts section."""
    return partial_render("key-facts", {"key_facts": key_facts, "facts_oob": True})


def recall_render(recall: RecallSection) -> str:
    """An out-of-band fragment that replaces the inspector's Recall section."""
    return partial_render("recall", {"recall": recall, "recall_oob": True})


def announce(text: str) -> str:
    """An out-of-band fragment that puts ``text`` in the page's polite status region."""
    return format_html('<p id="announce" class="announce" role="status" hx-swap-oob="true">{}</p>', text)


def _section(key: str, label: str, tokens: int, window: int, *, message_count: int = 0) -> Section:
    percent = round(100.0 * tokens / window, 1) if window > 0 else 0.0
    return Section(key=key, label=label, tokens=tokens, percent=percent, message_count=message_count)


def _source_ids(sources: list[dict[str, Any]], kind: str) -> frozenset[int]:
    # A merged message stands for its "merged" parts too (docs/memory.md F-38).
    parts = (part for source in sources for part in (source, *source.get("merged", ())))
    return frozenset(int(part["id"]) for part in parts if part.get("kind") == kind and part.get("id") is not None)
