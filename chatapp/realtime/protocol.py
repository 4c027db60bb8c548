"""The browser-to-server half of the chat WebSocket protocol: decoding and validating frames.

Client events (JSON objects with a ``type``)::

    chat.send  {client_message_id: 1-64 chars of [A-Za-z0-9_.:-], text: 1..CHAT_MAX_MESSAGE_CHARS chars}
    chat.sync  {after_message_id: integer 0..2**63-1}
    chat.stop  {}

Anything else is answered with one ``error`` event ``{type: "error", code, message}`` (plus the
``client_message_id`` when one could be read) and changes nothing. Codes: ``bad_frame`` (binary or
oversized frame), ``bad_json`` (anything JSON decoding rejects, including numbers too long to
convert), ``bad_event`` (not an object, no or unknown ``type``), ``bad_field`` (a missing or
invalid field, a number out of range, or a string that is not valid Unicode: JSON can escape a
lone surrogate such as ``\ud800``, which has no UTF-8 form), ``too_long`` (text over the limit).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings

CLIENT_MESSAGE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
# JSON escapes can make a frame several times longer than its text: a character outside the
# Basic Multilingual Plane (an emoji) is one character of text but a 12-character surrogate pair
# "\ud83d\ude00" in a frame encoded with ASCII escapes (Python's json.dumps default).
FRAME_CHARS_PER_TEXT_CHAR = 12
FRAME_OVERHEAD_CHARS = 1024
# Message ids are 64-bit database keys; a larger number can name no message.
MESSAGE_ID_MAX = 2**63 - 1


class ProtocolError(Exception):
    """A client frame that is not a valid client event; ``code`` is one of the module's codes."""

    def __init__(self, code: str, message: str, *, client_message_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.client_message_id = client_message_id

    def as_event(self) -> dict[str, Any]:
        """The ``error`` event sent back to the client."""
        event: dict[str, Any] = {"type": "error", "code": self.code, "message": self.message}
        if self.client_message_id is not None:
            event["client_message_id"] = self.client_message_id
        return event


@dataclass(frozen=True)
class ChatSend:
    client_message_id: str
    text: str


@dataclass(frozen=True)
class ChatSync:
    after_message_id: int


@dataclass(frozen=True)
class ChatStop:
    pass


ClientEvent = ChatSend | ChatSync | ChatStop


def frame_decode(text_data: str | None, bytes_data: bytes | None) -> Any:
    """The JSON value of a text frame. Raises :class:`ProtocolError` for a binary frame, a frame
    longer than the message limit allows (``bad_frame``), or text that JSON decoding rejects for
    any reason (``bad_json``: syntax, nesting too deep, an integer over Python's digit limit)."""
    if text_data is None:
        raise ProtocolError("bad_frame", "Binary frames are not supported; send JSON text.")
    limit = settings.CHAT_MAX_MESSAGE_CHARS * FRAME_CHARS_PER_TEXT_CHAR + FRAME_OVERHEAD_CHARS
    if len(text_data) > limit:
        raise ProtocolError("bad_frame", f"The frame is {len(text_data)} characters long; the limit is {limit}.")
    try:
        return json.loads(text_data)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError, and so is a too-long integer
        raise ProtocolError("bad_json", "The frame is not valid JSON.") from None


def client_event_parse(content: Any) -> ClientEvent:
    """The client event ``content`` (decoded JSON) describes. Raises :class:`ProtocolError` for
    anything that is not exactly one of the events in the module docstring."""
    if not isinstance(content, dict):
        raise ProtocolError("bad_event", "An event must be a JSON object with a 'type'.")
    _unicode_check(content)
    kind = content.get("type")
    if kind == "chat.send":
        return _chat_send(content)
    if kind == "chat.sync":
        after = content.get("after_message_id")
        if type(after) is not int or not 0 <= after <= MESSAGE_ID_MAX:
            raise ProtocolError(
                "bad_field", f"'after_message_id' must be an integer from 0 (everything) to {MESSAGE_ID_MAX}."
            )
        return ChatSync(after_message_id=after)
    if kind == "chat.stop":
        return ChatStop()
    if not isinstance(kind, str):
        raise ProtocolError("bad_event", "An event must have a string 'type'.")
    raise ProtocolError("bad_event", f"Unknown event type {kind[:40]!r}; expected chat.send, chat.sync or chat.stop.")


def _chat_send(content: dict[str, Any]) -> ChatSend:
    client_message_id = content.get("client_message_id")
    if not isinstance(client_message_id, str) or not CLIENT_MESSAGE_ID.fullmatch(client_message_id):
        raise ProtocolError("bad_field", "'client_message_id' must be 1-64 characters of letters, digits and _ . : -")
    text = content.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ProtocolError("bad_field", "'text' must be a non-empty string.", client_message_id=client_message_id)
    limit = settings.CHAT_MAX_MESSAGE_CHARS
    if len(text) > limit:
        raise ProtocolError(
            "too_long",
            f"The message is {len(text)} characters long; the limit is {limit}.",
            client_message_id=client_message_id,
        )
    if "\x00" in text:
        raise ProtocolError("bad_field", "'text' must not contain NUL characters.", client_message_id=client_message_id)
    return ChatSend(client_message_id=client_message_id, text=text)


def _unicode_check(content: dict[str, Any]) -> None:
    """Raise ``bad_field`` when any key or string in ``content``, at any depth, has no UTF-8 form
    (a lone surrogate from a ``\\udXXX`` escape): it could be neither stored nor sent back."""
    pending: list[tuple[str, Any]] = [(key, item) for key, value in content.items() for item in (key, value)]
    while pending:
        field_name, value = pending.pop()
        if isinstance(value, str):
            if not _encodes(value):
                raise _not_unicode(field_name, content)
        elif isinstance(value, dict):
            pending.extend((field_name, item) for pair in value.items() for item in pair)
        elif isinstance(value, list):
            pending.extend((field_name, item) for item in value)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_unicode(field_name: str, content: dict[str, Any]) -> ProtocolError:
    client_message_id = content.get("client_message_id")
    readable = isinstance(client_message_id, str) and CLIENT_MESSAGE_ID.fullmatch(client_message_id)
    return ProtocolError(
        "bad_field",
        f"{field_name[:40]!r} must be valid Unicode text (it contains a lone surrogate escape such as \\ud800).",
        client_message_id=client_message_id if readable else None,
    )
