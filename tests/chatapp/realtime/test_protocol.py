"""The protocol module alone (no database, no socket): every server event gives exactly the JSON
object the clients have always received (same keys, same order, same values), parses back to
itself, and the error codes and client-event validation are as documented in docs/protocol.md."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any, get_args

import pytest

from chatapp.llm.clients import LLMErrorKind
from chatapp.realtime import protocol
from chatapp.realtime.client_frames import client_event_parse
from chatapp.realtime.protocol import (
    ChatAckEvent,
    ChatDeltaEvent,
    ChatDoneEvent,
    ChatHistoryEvent,
    ChatMessageEvent,
    ChatRegenerate,
    ChatRegeneratedEvent,
    ChatRetrievalEvent,
    ChatSend,
    ChatStop,
    ChatSync,
    ChatTurnEvent,
    ErrorEvent,
    MemoryCompressionEvent,
    MemoryContextEvent,
    MemoryFactsEvent,
    MemorySummaryEvent,
    ProtocolError,
    ServerEvent,
    server_event_parse,
)

MESSAGE = {
    "id": 12,
    "role": "assistant",
    "content": "It costs 12 euros.",
    "tool_calls": None,
    "tool_call_id": "",
    "name": "",
    "status": "complete",
    "reply_to": 11,
    "client_message_id": None,
    "token_count": 9,
    "created": "2026-01-01T10:00:00+00:00",
}
SUMMARY = {"type": "llm", "content": "Facts.", "last_message_id": 8, "compressed_count": 6, "version": 2}
FACT = {"id": 4, "kind": "preference", "key": "allergy", "value": "penicillin", "superseded_by": None}
COMPRESSION = {"id": 3, "kind": "compression", "tokens_before": 1200, "tokens_after": 400, "attempts": []}
RECALL_ITEM = {
    "item_id": 17,
    "memory_key": "2",
    "chat_title": "Lockers",
    "message_ids": [5],
    "role": "user",
    "created_at": "2026-11-30T10:00:00+00:00",
    "text": "the blue umbrella is in locker 12",
    "lexical_rank": 1,
    "cosine": None,
    "dense_rank": None,
    "rrf": 0.01639,
    "decay": 0.9992,
    "score": 0.01638,
    "reason": "lexical: 2/2 query terms",
}
RECALL = {
    "query": "Where is the blue umbrella?",
    "model": None,
    "latency_ms": 3,
    "notes": [],
    "tokens": 30,
    "items": [RECALL_ITEM],
    "rejected": [],
    "over_budget": [],
}

# (event, the JSON object sent before the protocol was typed: keys in wire order)
CALIBRATION = {"factor": 1.2, "window_tokens": 1706, "enabled": True, "offline": False}

WIRE: list[tuple[ServerEvent, dict[str, Any]]] = [
    (
        ChatAckEvent(client_message_id="c-1", message_id=11, duplicate=False, pending=True),
        {"type": "chat.ack", "client_message_id": "c-1", "message_id": 11, "duplicate": False, "pending": True},
    ),
    (
        ChatHistoryEvent(messages=[MESSAGE], more=False, pending=[11]),
        {"type": "chat.history", "messages": [MESSAGE], "more": False, "pending": [11]},
    ),
    (
        ChatMessageEvent(message=MESSAGE, step=2),  # a reply of a running turn (services)
        {"type": "chat.message", "message": MESSAGE, "step": 2},
    ),
    (
        ChatMessageEvent(message=MESSAGE),  # a user message, a resend's replay, an interrupted turn's
        {"type": "chat.message", "message": MESSAGE},
    ),
    (
        ChatTurnEvent(turn_id=11, status="started", mode="agent"),
        {"type": "chat.turn", "turn_id": 11, "status": "started", "mode": "agent"},
    ),
    (
        ChatRetrievalEvent(turn_id=11, passages=[{"chunk_id": 1, "document_id": 2, "title": "Plans", "score": 0.5}]),
        {
            "type": "chat.retrieval",
            "turn_id": 11,
            "passages": [{"chunk_id": 1, "document_id": 2, "title": "Plans", "score": 0.5}],
        },
    ),
    (
        ChatDeltaEvent(turn_id=11, step=1, text="It costs"),
        {"type": "chat.delta", "turn_id": 11, "step": 1, "text": "It costs"},
    ),
    (
        ChatDoneEvent(turn_id=11, status="complete", message_id=12),
        {"type": "chat.done", "turn_id": 11, "status": "complete", "message_id": 12},
    ),
    (
        ErrorEvent(turn_id=11, code="llm_server", message="The offline engine failed."),  # a turn's
        {"type": "error", "turn_id": 11, "code": "llm_server", "message": "The offline engine failed."},
    ),
    (
        ErrorEvent(code="busy", message="Wait.", client_message_id="c-9"),  # a refused send
        {"type": "error", "code": "busy", "message": "Wait.", "client_message_id": "c-9"},
    ),
    (
        ErrorEvent(code="bad_json", message="The frame is not valid JSON."),  # an unreadable frame
        {"type": "error", "code": "bad_json", "message": "The frame is not valid JSON."},
    ),
    (
        MemoryCompressionEvent(turn_id=11, step=1, event=COMPRESSION),
        {"type": "memory.compression", "turn_id": 11, "step": 1, "event": COMPRESSION},
    ),
    (
        MemoryCompressionEvent(turn_id=None, step=0, event=COMPRESSION),  # "compress now": turn_id null
        {"type": "memory.compression", "turn_id": None, "step": 0, "event": COMPRESSION},
    ),
    (
        MemoryContextEvent(
            turn_id=11,
            step=1,
            model_call_id=5,
            sources=[{"id": None, "kind": "system"}, {"id": 11, "kind": "current"}],
            tokens=700,
            sections={"system": 80, "summary": 0, "retained": 0, "current": 20, "tools": 590},
            context_window=2048,
            trigger_tokens=1024,
            target_tokens=614,
            summary=SUMMARY,
            elisions=[],
            repairs=[],
            overflow=False,
            path="waited",
            waited_ms=120,
            facts={"pinned": [4], "in_window": [], "over_budget": [], "tokens": 21},
            recall=RECALL,
            calibration=CALIBRATION,
        ),
        {
            "type": "memory.context",
            "turn_id": 11,
            "step": 1,
            "model_call_id": 5,
            "sources": [{"id": None, "kind": "system"}, {"id": 11, "kind": "current"}],
            "tokens": 700,
            "sections": {"system": 80, "summary": 0, "retained": 0, "current": 20, "tools": 590},
            "context_window": 2048,
            "trigger_tokens": 1024,
            "target_tokens": 614,
            "summary": SUMMARY,
            "elisions": [],
            "repairs": [],
            "overflow": False,
            "path": "waited",
            "waited_ms": 120,
            "facts": {"pinned": [4], "in_window": [], "over_budget": [], "tokens": 21},
            "recall": RECALL,
            "calibration": CALIBRATION,
        },
    ),
    (
        MemorySummaryEvent(turn_id=None, step=0, summary=SUMMARY),
        {"type": "memory.summary", "turn_id": None, "step": 0, "summary": SUMMARY},
    ),
    (
        MemoryFactsEvent(turn_id=None, step=0, facts=[FACT]),
        {"type": "memory.facts", "turn_id": None, "step": 0, "facts": [FACT]},
    ),
    (
        ChatRegeneratedEvent(turn_id=11, version=2, removed=[12, 13, 14]),
        {"type": "chat.regenerated", "turn_id": 11, "version": 2, "removed": [12, 13, 14]},
    ),
]


@pytest.mark.parametrize(("event", "wire"), WIRE, ids=[f"{e.type}-{i}" for i, (e, _) in enumerate(WIRE)])
def test_every_server_event_gives_the_json_clients_have_always_received(event: ServerEvent, wire: dict[str, Any]):
    payload = event.as_payload()
    assert payload == wire
    assert list(payload) == list(wire)  # the same keys, in the same order
    assert json.loads(json.dumps(payload)) == wire  # JSON-safe as it is
    assert server_event_parse(payload) == event  # and back


def test_every_server_event_type_is_covered_and_defined_once():
    types = [cls.type for cls in protocol.SERVER_EVENTS]
    assert len(types) == len(set(types))
    assert {event.type for event, _ in WIRE} == set(types)
    assert {cls.type for cls in protocol.CLIENT_EVENTS} == {"chat.send", "chat.sync", "chat.stop", "chat.regenerate"}


def test_events_are_frozen():
    event = ChatDoneEvent(turn_id=1, status="complete", message_id=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.status = "error"  # type: ignore[misc]


def test_a_payload_with_keys_this_version_does_not_know_still_parses():
    payload = {"type": "chat.done", "turn_id": 1, "status": "complete", "message_id": 2, "added_later": True}
    assert server_event_parse(payload) == ChatDoneEvent(turn_id=1, status="complete", message_id=2)
    with pytest.raises(KeyError):
        server_event_parse({"type": "chat.unknown"})
    with pytest.raises(TypeError):
        server_event_parse({"type": "chat.done", "turn_id": 1})


def test_error_codes_are_the_strings_clients_know():
    assert (
        protocol.BAD_FRAME,
        protocol.BAD_JSON,
        protocol.BAD_EVENT,
        protocol.BAD_FIELD,
        protocol.TOO_LONG,
        protocol.BUSY,
        protocol.ID_REUSED,
        protocol.CANNOT_REGENERATE,
        protocol.CONTEXT_OVERFLOW,
        protocol.AGENT_STEP_LIMIT,
        protocol.INTERNAL_ERROR,
    ) == (
        "bad_frame",
        "bad_json",
        "bad_event",
        "bad_field",
        "too_long",
        "busy",
        "id_reused",
        "cannot_regenerate",
        "context_overflow",
        "agent_step_limit",
        "internal_error",
    )
    assert protocol.llm_error_code("rate_limit") == "llm_rate_limit"
    # Every kind of chat-model failure has its documented code, and nothing else does.
    assert set(protocol.LLM_ERROR_KINDS) == set(get_args(LLMErrorKind))
    assert {code for code in protocol.ERROR_CODES if code.startswith("llm_")} == {
        protocol.llm_error_code(kind) for kind in get_args(LLMErrorKind)
    }
    assert protocol.CLOSE_NOT_FOUND == 4404 and set(protocol.CLOSE_CODES) == {4404, 1009}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"type": "chat.send", "client_message_id": "c-1", "text": "hi"}, ChatSend(client_message_id="c-1", text="hi")),
        ({"type": "chat.sync", "after_message_id": 0}, ChatSync(after_message_id=0)),
        ({"type": "chat.stop", "HEADERS": {"HX-Request": "true"}}, ChatStop()),
        ({"type": "chat.regenerate", "turn_id": 7}, ChatRegenerate(turn_id=7)),
    ],
)
def test_client_events_parse_and_give_their_json_back(content: dict[str, Any], expected: Any):
    event = client_event_parse(content)
    assert event == expected
    assert event.as_payload() == {key: value for key, value in content.items() if key != "HEADERS"}


@pytest.mark.parametrize(
    ("content", "code", "client_message_id"),
    [
        ([1], "bad_event", None),
        ({"type": "chat.delete"}, "bad_event", None),
        ({"type": "chat.send", "client_message_id": "c 1", "text": "hi"}, "bad_field", None),
        ({"type": "chat.send", "client_message_id": "c-1", "text": " "}, "bad_field", "c-1"),
        ({"type": "chat.sync", "after_message_id": True}, "bad_field", None),
        ({"type": "chat.regenerate", "turn_id": 0}, "bad_field", None),
        ({"type": "chat.regenerate", "turn_id": "7"}, "bad_field", None),
    ],
)
def test_invalid_client_events_become_one_error_event(content: Any, code: str, client_message_id: str | None):
    with pytest.raises(ProtocolError) as raised:
        client_event_parse(content)
    error = raised.value.as_event()
    assert error == ErrorEvent(code=code, message=raised.value.message, client_message_id=client_message_id)
    assert set(error.as_payload()) == {"type", "code", "message"} | (
        {"client_message_id"} if client_message_id else set()
    )


def test_too_long_keeps_the_client_message_id(settings):
    settings.CHAT_MAX_MESSAGE_CHARS = 5
    with pytest.raises(ProtocolError) as raised:
        client_event_parse({"type": "chat.send", "client_message_id": "c-1", "text": "x" * 6})
    assert raised.value.as_event().as_payload() == {
        "type": "error",
        "code": "too_long",
        "message": "The message is 6 characters long; the limit is 5.",
        "client_message_id": "c-1",
    }


def test_the_protocol_module_imports_no_model():
    """At run time: names for type checking only (``if TYPE_CHECKING:``) are never imported."""
    tree = ast.parse(Path(protocol.__file__).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= {"__future__", "json", "re", "collections.abc", "dataclasses", "typing", "django.conf"}
