"""The chat WebSocket protocol, both directions, defined once.

Every event is a JSON object with a ``type``. Here each event is a frozen dataclass: its ``type``
class attribute is that string, its fields are the other keys in wire order, and
:meth:`ServerEvent.as_payload` is the JSON object sent. Every layer that tells a socket something
builds one of these classes, never a dict, so this module is the whole protocol:
``docs/protocol.md`` is generated from it (``python manage.py protocol_docs``), and a test fails
when the two differ.

Routes (:mod:`chatapp.routing`): ``/ws/chat/<session id>/`` speaks the JSON events below.
``/ws/chat/<session id>/page/`` is the chat page's socket: the same client events, but every
server event arrives as server-rendered HTML fragments for htmx (:mod:`chatapp.ui.page_feed`),
with a snapshot of the page on connect and on ``chat.sync``; ``/ws/chat/<session id>/?ui=html``
is an alias of it. A socket on a session that is not the caller's or does not exist (or is
deleted while the socket is open), and any other path, is accepted and then closed with code
4404 (:data:`CLOSE_NOT_FOUND`); a page socket whose session is deleted first gets one frame
that disables its composer, says so and removes the chat from its list. A session is opened
over HTTP as the chat page does it: a ``POST`` to ``/s/new/`` (form field ``mode``, ``agent`` or ``quick-answer``, optional), with the
CSRF token of a page fetched with the same cookies (e.g. ``/``), redirects to
``/s/<session id>/``; its owner is the signed-in user, else the browser session of those cookies.

Client events are validated exactly: anything that is not one of them is answered with one
``error`` event (see the error codes) and changes nothing; keys a client event does not define
(such as the ``HEADERS`` htmx adds) are ignored. A *message id* is the database id of a stored
message (a positive 64-bit integer); a *turn id* is the id of the user message that opened the
turn. Token figures are tokens of the chat model's encoding (docs/memory.md §5); what the memory
events report is described in docs/memory.md §8. Events may gain keys and new event
types may appear; none is renamed or removed (CONTRIBUTING.md, public interfaces), so clients
ignore what they do not know.

This module imports no ORM model and reads no settings, so every layer may use it; decoding and checking client
frames against the configured limits is ``chatapp/realtime/client_frames.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Final, Self

if TYPE_CHECKING:
    from memory.api import CompressionRecord, MemoryContext

# --- close codes ----------------------------------------------------------------------------

CLOSE_NOT_FOUND: Final = 4404
# RFC 6455 §7.4.1 "message too big", sent by the server (chatapp.serve) before the app sees the frame.
CLOSE_TOO_BIG: Final = 1009

CLOSE_CODES: Final[dict[int, str]] = {
    CLOSE_NOT_FOUND: (
        "no such session for this visitor (not theirs, unknown, or deleted while the socket was open), "
        "or no such path; the socket is accepted first so that a browser sees the code (a refused "
        "handshake only shows as 1006)"
    ),
    CLOSE_TOO_BIG: (
        "a frame or message over 1 MiB (Daphne's `websocket_max_message_size`), closed with a reason "
        "naming the limit before the application reads it; nothing was stored. A frame up to 1 MiB "
        "but longer than a `chat.send` can be gets the `bad_frame` error instead and the socket stays open"
    ),
}
"""The WebSocket close codes the server uses, with their meaning. A handshake from a foreign
``Origin``, or with no ``Origin`` header at all, is refused (HTTP 403) before any route is chosen:
a client that is not a browser must send the site's own origin (e.g. ``http://127.0.0.1:8000``)."""

# --- error codes ----------------------------------------------------------------------------

BAD_FRAME: Final = "bad_frame"
BAD_JSON: Final = "bad_json"
BAD_EVENT: Final = "bad_event"
BAD_FIELD: Final = "bad_field"
TOO_LONG: Final = "too_long"
BUSY: Final = "busy"
ID_REUSED: Final = "id_reused"
RATE_LIMITED: Final = "rate_limited"
CANNOT_REGENERATE: Final = "cannot_regenerate"
CONTEXT_OVERFLOW: Final = "context_overflow"
AGENT_STEP_LIMIT: Final = "agent_step_limit"
INTERNAL_ERROR: Final = "internal_error"
LLM_ERROR_PREFIX: Final = "llm_"
# chatapp.llm.clients.LLMErrorKind, each sent as llm_<kind>.
LLM_ERROR_KINDS: Final[dict[str, str]] = {
    "connection": "the chat model's endpoint refused the connection or is unreachable",
    "timeout": "the chat model's endpoint did not answer in time",
    "rate_limit": "the endpoint answered HTTP 429 (rate limited)",
    "server": "the endpoint answered HTTP 5xx, or sent an error event inside the stream",
    "status": "the endpoint answered another HTTP error",
    "malformed": "the endpoint's body was not the expected JSON",
    "empty": "the model replied with neither text nor tool calls",
}


def llm_error_code(kind: str) -> str:
    return f"{LLM_ERROR_PREFIX}{kind}"


ERROR_CODES: Final[dict[str, str]] = {
    BAD_FRAME: "a binary frame, or a frame longer than the message limit allows; nothing was read",
    BAD_JSON: "the frame is not JSON (syntax, nesting too deep, an integer too long to convert)",
    BAD_EVENT: "not a JSON object, or no, a non-string or an unknown `type`",
    BAD_FIELD: (
        "a missing or invalid field, a number out of range, or a string that is not valid Unicode "
        "(JSON can escape a lone surrogate such as `\\ud800`, which has no UTF-8 form)"
    ),
    TOO_LONG: "the text of a `chat.send` is over `CHAT_MAX_MESSAGE_CHARS` characters; nothing was stored",
    BUSY: (
        "a `chat.send` refused, nothing stored: the session already has `CHAT_MAX_PENDING_TURNS` "
        "turns in flight; send it again once one has ended"
    ),
    ID_REUSED: (
        "a `chat.send` whose `client_message_id` names a stored message with another text: nothing stored, nothing "
        "replayed; send the new message with a new id"
    ),
    RATE_LIMITED: (
        "a `chat.send` refused, nothing stored: this chat's owner or this address sent more than the rate limits "
        "allow (`RATE_LIMIT_SEND_OWNER`, `RATE_LIMIT_SEND_ADDRESS`); send it again after `retry_after` seconds"
    ),
    CANNOT_REGENERATE: (
        "a `chat.regenerate` refused, nothing changed: the turn is not this chat's last, has no final reply yet, "
        "a turn is in flight, or its reply is already folded into the summary (the message says which)"
    ),
    CONTEXT_OVERFLOW: (
        "the turn ended without calling the model: even its elided current turn is over the context "
        "window (docs/memory.md I5); an `error` reply is stored"
    ),
    AGENT_STEP_LIMIT: "the agent still called tools at its last allowed model call (`AGENT_MAX_STEPS`)",
    INTERNAL_ERROR: "the turn failed with a bug (logged on the server); an `error` reply is stored",
    **{llm_error_code(kind): f"the chat model failed: {meaning}" for kind, meaning in LLM_ERROR_KINDS.items()},
}
"""Every error code an :class:`ErrorEvent` may carry, with its meaning. The first five answer an
invalid client event; the others end a turn (with ``turn_id``) or refuse a client event (``busy``, ``id_reused``,
``rate_limited``, ``cannot_regenerate``)."""


class ProtocolError(Exception):
    """A client frame that is not a valid client event; ``code`` is one of :data:`ERROR_CODES`."""

    def __init__(self, code: str, message: str, *, client_message_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.client_message_id = client_message_id

    def as_event(self) -> ErrorEvent:
        return ErrorEvent(code=self.code, message=self.message, client_message_id=self.client_message_id)


# --- client events --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ClientEventBase:
    """A client event, parsed by :func:`chatapp.realtime.client_frames.client_event_parse`."""

    type: ClassVar[str]

    def as_payload(self) -> dict[str, Any]:
        return {"type": self.type, **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True, kw_only=True)
class ChatSend(ClientEventBase):
    """Send a user message. It is stored once per ``client_message_id``: a resend (after a
    reconnect, docs/memory.md F-27) stores nothing and replays what is stored; the same id with
    another text is refused (``id_reused``). Answered with ``chat.ack``, then the session's events
    of the new turn; ``error`` with ``busy``, ``id_reused``, ``too_long`` or ``bad_field`` when
    refused (nothing stored)."""

    type: ClassVar[str] = "chat.send"

    client_message_id: str
    """The client's id of this message, 1-64 characters of ``[A-Za-z0-9_.:-]``; the same id on a
    resend."""
    text: str
    """The message, 1 to ``CHAT_MAX_MESSAGE_CHARS`` characters, not only spaces, no NUL character."""


@dataclass(frozen=True, kw_only=True)
class ChatSync(ClientEventBase):
    """Catch up after a reconnect: answered with ``chat.history`` (the chat page's socket gets a
    fresh snapshot of the page instead)."""

    type: ClassVar[str] = "chat.sync"

    after_message_id: int
    """The last message id the client has, from 0 (everything) to 2**63-1."""


@dataclass(frozen=True, kw_only=True)
class ChatStop(ClientEventBase):
    """Stop the session's turns in flight, on whichever worker runs them: the running ones and
    those queued behind them (a burst of sends), each ending with a ``stopped`` reply and
    ``chat.done`` (a queued one without calling the model). A turn no worker runs any more (its
    lease ran out) is closed with an ``error`` reply instead."""

    type: ClassVar[str] = "chat.stop"


@dataclass(frozen=True, kw_only=True)
class ChatRegenerate(ClientEventBase):
    """Regenerate the reply of the chat's last turn: the current reply is kept as an earlier version (shown, never
    sent to the model), memory forgets it, and the turn runs again. Answered with ``chat.regenerated`` to every
    socket of the session, then the turn's events as for a new message; ``error`` with ``cannot_regenerate`` when
    refused (nothing changed)."""

    type: ClassVar[str] = "chat.regenerate"

    turn_id: int
    """The turn whose reply is regenerated: the id of its user message, the chat's last."""


ClientEvent = ChatSend | ChatSync | ChatStop | ChatRegenerate
CLIENT_EVENTS: Final[tuple[type[ClientEventBase], ...]] = (ChatSend, ChatSync, ChatStop, ChatRegenerate)


# --- server events --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ServerEvent:
    """A server event: its fields are the JSON keys after ``type``, in wire order. A field marked
    "absent when null" (``omit_when_none``) is left out of the JSON when it has no value; any
    other field without a value is sent as ``null``."""

    type: ClassVar[str]
    omit_when_none: ClassVar[frozenset[str]] = frozenset()

    def as_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"type": self.type}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name in self.omit_when_none:
                continue
            payload[item.name] = value
        return payload

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Self:
        """The event of an :meth:`as_payload` result, unknown keys ignored. Raises ``TypeError`` for a missing field."""
        names = {item.name for item in fields(cls)}
        return cls(**{key: value for key, value in payload.items() if key in names})


@dataclass(frozen=True, kw_only=True)
class ChatAckEvent(ServerEvent):
    """To the sending socket only: its ``chat.send`` was stored, or had been (a resend)."""

    type: ClassVar[str] = "chat.ack"

    client_message_id: str
    """The ``client_message_id`` of the ``chat.send``."""
    message_id: int
    """The id of the stored user message, which is also the turn id of its turn."""
    duplicate: bool
    """True for a resend: nothing new was stored; the stored message and replies follow
    (``chat.message`` each, then ``chat.done`` when the turn has ended)."""
    pending: bool
    """True while the message's turn has no final reply yet (it is running or queued)."""


@dataclass(frozen=True, kw_only=True)
class ChatHistoryEvent(ServerEvent):
    """To the socket that sent ``chat.sync`` (JSON route only): the messages it missed and the
    turns still in flight. Turns interrupted by a restart are closed first, so their error replies
    are among the messages and they are not pending."""

    type: ClassVar[str] = "chat.history"

    messages: list[dict[str, Any]]
    """The stored messages with an id above ``after_message_id``, ascending, at most 500 (one
    page), each as in ``chat.message``."""
    more: bool
    """True when further messages follow: send ``chat.sync`` again after the last id."""
    pending: list[int]
    """The turn ids (user message ids) of the turns in flight, ascending: no final reply yet and a
    fresh lease, so running or queued on some worker now."""


@dataclass(frozen=True, kw_only=True)
class ChatRegeneratedEvent(ServerEvent):
    """To every socket of the session: the reply of turn ``turn_id`` was kept as an earlier version and removed from
    the transcript (its messages' ids are gone); then either the turn runs again (``chat.regenerate``), or an earlier
    version chosen on the chat page is stored anew (its messages follow as ``chat.message``). Either way the new
    messages carry ``version``."""

    type: ClassVar[str] = "chat.regenerated"

    turn_id: int
    """The regenerated turn (its user message id)."""
    version: int
    """The version number of the reply that replaces it (2 after the first regeneration)."""
    removed: list[int]
    """The ids of the messages that left the transcript (the earlier version's tool calls, results and reply)."""


@dataclass(frozen=True, kw_only=True)
class ChatMessageEvent(ServerEvent):
    """To every socket of the session, after the commit: a message was stored (the user's, an
    assistant reply, a tool call or a tool result). Also replayed to one socket on a resend."""

    type: ClassVar[str] = "chat.message"
    omit_when_none: ClassVar[frozenset[str]] = frozenset({"step"})

    message: dict[str, Any]
    """The stored message: ``id`` (message id), ``role`` (user/assistant/tool), ``content`` (text
    or null), ``tool_calls`` (OpenAI format, or null), ``tool_call_id``, ``name``, ``status``
    (complete/stopped/error), ``origin`` (``model``, or ``app`` for a note the app wrote in place
    of a reply, which is never sent to the model: docs/memory.md F-37), ``reply_to`` (the turn id
    of a reply, null for a user message),
    ``client_message_id`` (a user message's; null otherwise), ``token_count`` (tokens) and
    ``created`` (ISO 8601)."""
    step: int | None = None
    """For a reply of a running turn: the model call it came from, from 1; null for a user
    message and in a resend's replay."""


@dataclass(frozen=True, kw_only=True)
class ChatTurnEvent(ServerEvent):
    """To every socket of the session: a turn started (after waiting for the session's earlier
    turns in this worker)."""

    type: ClassVar[str] = "chat.turn"

    turn_id: int
    """The turn id (the id of the user message that opened it)."""
    status: str
    """Always ``started``."""
    mode: str
    """The session's mode for this turn: ``agent`` or ``quick-answer``."""


@dataclass(frozen=True, kw_only=True)
class ChatRetrievalEvent(ServerEvent):
    """To every socket of the session, quick-answer turns only: the knowledge-base passages put
    into the system prompt."""

    type: ClassVar[str] = "chat.retrieval"

    turn_id: int
    """The turn id."""
    passages: list[dict[str, Any]]
    """The passages, best first: ``{chunk_id, document_id, title, score}`` each (no text); empty
    when nothing matched."""


@dataclass(frozen=True, kw_only=True)
class ChatDeltaEvent(ServerEvent):
    """To every socket of the session: streamed reply text, not stored yet (batched: about one
    event per 100 ms per turn). The stored reply follows as ``chat.message`` and replaces it."""

    type: ClassVar[str] = "chat.delta"

    turn_id: int
    """The turn id."""
    step: int
    """The model call of the turn, from 1."""
    text: str
    """The next piece of the reply's text."""


@dataclass(frozen=True, kw_only=True)
class ChatDoneEvent(ServerEvent):
    """To every socket of the session (and to one socket in a resend's replay): a turn ended and
    its final reply is stored. Also sent when a turn interrupted by a restart is closed."""

    type: ClassVar[str] = "chat.done"

    turn_id: int
    """The turn id."""
    status: str
    """How it ended: ``complete``, ``cut_off`` (the model's reply ended at its token limit; the text
    is stored as far as it came), ``stopped`` (``chat.stop``) or ``error`` (see the ``error`` event
    before it; an interrupted turn has none)."""
    message_id: int
    """The id of the final assistant message."""


@dataclass(frozen=True, kw_only=True)
class ErrorEvent(ServerEvent):
    """An error. To one socket: its client event was invalid or refused (nothing changed). To
    every socket of the session, with ``turn_id``: the turn failed; an ``error`` reply is stored
    and ``chat.done`` follows."""

    type: ClassVar[str] = "error"
    omit_when_none: ClassVar[frozenset[str]] = frozenset({"turn_id", "client_message_id", "retry_after"})

    turn_id: int | None = None
    """The turn that failed; null for an invalid or refused client event."""
    code: str
    """One of the error codes (see the table of error codes)."""
    message: str
    """What happened, a sentence for people."""
    client_message_id: str | None = None
    """The ``client_message_id`` of the refused ``chat.send``, when it could be read."""
    retry_after: int | None = None
    """With ``rate_limited``: seconds until the limit lets a message through again."""


@dataclass(frozen=True, kw_only=True)
class MemoryCompressionEvent(ServerEvent):
    """To every socket of the session: the memory engine recorded a compression event while it
    built a request (one event each, before ``memory.context``), or during "compress now"."""

    type: ClassVar[str] = "memory.compression"

    turn_id: int | None
    """The turn id; null after "compress now" (outside turns)."""
    step: int
    """The model call of the turn it was built for, from 1; 0 after "compress now"."""
    event: dict[str, Any]
    """The compression event (``CompressionEvent.as_dict()``, docs/memory.md §3 and §4): ``id``,
    ``created_at`` (ISO 8601), ``kind`` (compression/superseded/no_progress/overflow), ``mode``,
    ``context_window``, ``trigger_tokens``, ``target_tokens``, ``tokens_before``,
    ``tokens_after`` (tokens), ``messages_summarized``, ``boundary_before``, ``boundary_after``
    (message ids or null), ``result_type`` (none/llm/raw), ``degraded``, ``attempts`` (every
    summarizer try: ``{model, phase, number, latency_ms, ok, error, wait_ms, method}``; ``wait_ms``
    the backoff slept before it, ``method`` ``llm`` or ``extractive``), ``duration_ms``,
    ``summary_content``, ``summary_version``, ``notes``, ``elisions``."""

    @classmethod
    def from_record(cls, record: CompressionRecord, *, turn_id: int | None, step: int) -> MemoryCompressionEvent:
        return cls(turn_id=turn_id, step=step, event=record.as_dict())


@dataclass(frozen=True, kw_only=True)
class MemoryContextEvent(ServerEvent):
    """To every socket of the session, before each model call of a turn: what the request
    contains and why (the message texts stay on the server's ``ModelCall`` record). Also sent
    for a request that overflowed the context window and was not sent (``overflow`` true,
    ``model_call_id`` null)."""

    type: ClassVar[str] = "memory.context"

    turn_id: int
    """The turn id."""
    step: int
    """The model call of the turn, from 1."""
    model_call_id: int | None
    """The id of the recorded model call; null when the request was not sent (overflow)."""
    sources: list[dict[str, Any]]
    """Per message of the request, in order: ``{id, kind}``, kind ``system``, ``facts``,
    ``summary``, ``recall``, ``history`` or ``current``; ``id`` a message id, or null for the
    system prompt, the key-facts block, the summary and the recall block. The key-facts block's
    entry also carries ``fact_ids`` and ``message_ids`` (its facts and their source messages,
    docs/memory.md §11); the recall block's ``item_ids`` and ``message_ids`` (docs/memory.md §12)."""
    tokens: int
    """The request's estimated size (tokens)."""
    sections: dict[str, int]
    """Tokens per section: ``system``, ``facts``, ``summary``, ``recall``, ``retained``,
    ``current``, ``tools``."""
    context_window: int
    """The chat model's context window (tokens)."""
    trigger_tokens: int
    """Compression starts above this size (tokens)."""
    target_tokens: int
    """Compression shrinks the request to about this size (tokens)."""
    summary: dict[str, Any]
    """The summary the request was built with: ``type`` (none/llm/raw), ``content``,
    ``last_message_id`` (the boundary: the last message id it covers, or null),
    ``compressed_count``, ``version``."""
    elisions: list[dict[str, Any]]
    """Messages of the current turn shortened in the model-facing copy: ``{id, role,
    tokens_before, tokens_after}`` each."""
    repairs: list[str]
    """What was dropped to keep tool calls paired, and why a degraded context was used."""
    overflow: bool
    """True when even the elided request is over the context window: it was not sent, and the turn
    ends with ``error`` ``context_overflow``."""
    path: str = "under_trigger"
    """How memory met the request (docs/memory.md §10): ``under_trigger`` (no memory work),
    ``no_progress`` (over the trigger with nothing before the current turn to summarize),
    ``compressed`` (compressed inside the request, ``MEMORY_COMPRESSION=sync``), ``waited``
    (waited ``waited_ms`` for the memory job, then under the trigger), ``deferred`` (over the
    trigger: degraded context, compression left to the memory job) or ``degraded``."""
    waited_ms: int = 0
    """Milliseconds the request waited for the session's memory job."""
    facts: dict[str, Any] | None = None
    """The key-facts block (docs/memory.md §11): fact ids ``pinned`` (in the block), ``in_window``
    (verbatim in the request, not repeated), ``over_budget`` (the block was full), its ``tokens``, and
    ``entries`` (each current fact's ``{id, kind, key, value, polarity, provenance, status, note}``)."""
    recall: dict[str, Any] | None = None
    """What recall brought into the request and why (docs/memory.md §12), null when the request
    had no recall: ``query``, ``model`` (the embedding model, null: lexical only),
    ``latency_ms`` (what the request waited for the search), ``embedding_ms`` (the query's embedding
    from its start, which may be earlier), ``notes`` (e.g. why it fell back to lexical only), ``tokens`` of the block,
    and ``items`` (recalled, in block order), ``rejected`` (the best candidates the gate
    refused) and ``over_budget`` (admitted, left out for the budget), each ``{item_id,
    memory_key, chat_title, message_ids, role, created_at, text, lexical_rank, cosine,
    dense_rank, rrf, decay, score, reason, context_of}`` (``context_of``: for an item brought
    as the context of a recalled one, that item's id, else null). The recall block's entry in ``sources`` has kind
    ``recall`` with ``item_ids`` and ``message_ids``."""
    calibration: dict[str, Any] | None = None
    """The token-estimate calibration the request was budgeted with (docs/memory.md §5,
    "Calibration"): ``factor`` (provider tokens per estimated token, 1.0 when none applies),
    ``window_tokens`` (the context window in estimated tokens, ``context_window / factor``: what
    ``tokens``, ``trigger_tokens`` and ``target_tokens`` compare with), ``enabled``
    (``LLM_TOKEN_CALIBRATION``) and ``offline`` (the offline engine, which counts with the same
    tokenizer: nothing to compare)."""

    @classmethod
    def from_context(
        cls,
        ctx: MemoryContext,
        *,
        turn_id: int,
        step: int,
        model_call_id: int | None,
        calibration: dict[str, Any] | None,
    ) -> MemoryContextEvent:
        """The event of one request's context: its report without the message texts."""
        report = ctx.as_dict()
        names = {f.name for f in fields(cls)} - {"turn_id", "step", "model_call_id", "calibration"}
        values = {name: report[name] for name in names if name in report}
        values["facts"] = report["facts"] or None
        values["recall"] = report["recall"] or None
        return cls(turn_id=turn_id, step=step, model_call_id=model_call_id, calibration=calibration, **values)


@dataclass(frozen=True, kw_only=True)
class MemorySummaryEvent(ServerEvent):
    """To every socket of the session after "compress now" (the inspector's action) and after
    each run of its memory job (docs/memory.md §10), after their ``memory.compression`` events:
    the summary as it is now."""

    type: ClassVar[str] = "memory.summary"

    turn_id: int | None
    """Always null (outside turns)."""
    step: int
    """Always 0."""
    summary: dict[str, Any]
    """The summary, as in ``memory.context``."""


@dataclass(frozen=True, kw_only=True)
class MemoryFactsEvent(ServerEvent):
    """To every socket of the session after a run of its memory job that extracted new key facts
    (docs/memory.md §11): every key fact of the chat as it is now, so the inspector's Key facts
    section updates live."""

    type: ClassVar[str] = "memory.facts"

    turn_id: int | None
    """Always null (outside turns)."""
    step: int
    """Always 0."""
    facts: list[dict[str, Any]]
    """Every key fact of the chat, oldest first, superseded and hidden ones included: objects with
    ``id``, ``kind``, ``key`` (the slot), ``value`` (verbatim), ``text``, ``source_message_id``,
    ``excerpt``, ``extractor`` (``rule``, ``llm:<model>`` or ``user``), ``valid_from`` and
    ``invalidated_at`` (ISO 8601 or null), ``superseded_by`` (a fact id or null),
    ``pinned_by_user``, ``hidden_by_user``, ``last_seen_message_id`` and ``replaces`` (the value
    it superseded, ``""`` when none)."""


SERVER_EVENTS: Final[tuple[type[ServerEvent], ...]] = (
    ChatAckEvent,
    ChatHistoryEvent,
    ChatRegeneratedEvent,
    ChatMessageEvent,
    ChatTurnEvent,
    ChatRetrievalEvent,
    ChatDeltaEvent,
    ChatDoneEvent,
    ErrorEvent,
    MemoryCompressionEvent,
    MemoryContextEvent,
    MemorySummaryEvent,
    MemoryFactsEvent,
)
_SERVER_EVENT_BY_TYPE: Final[dict[str, type[ServerEvent]]] = {cls.type: cls for cls in SERVER_EVENTS}


def server_event_class(event_type: str) -> type[ServerEvent]:
    """The server event class of ``event_type`` (e.g. ``chat.done``). Raises ``KeyError``."""
    return _SERVER_EVENT_BY_TYPE[event_type]


def server_event_parse(payload: dict[str, Any]) -> ServerEvent:
    """The typed event of a sent JSON object. Raises ``KeyError`` (unknown ``type``) or ``TypeError`` (missing field)."""
    return server_event_class(payload["type"]).from_payload(payload)
