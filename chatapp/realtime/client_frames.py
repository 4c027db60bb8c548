"""Client frames decoded and validated into the client events of :mod:`chatapp.realtime.protocol`; anything else
raises :class:`~chatapp.realtime.protocol.ProtocolError` with one of its error codes (docs/protocol.md)."""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings

from chatapp.realtime.protocol import (
    BAD_EVENT,
    BAD_FIELD,
    BAD_FRAME,
    BAD_JSON,
    TOO_LONG,
    ChatRegenerate,
    ChatSend,
    ChatStop,
    ChatSync,
    ClientEvent,
    ProtocolError,
)

CLIENT_MESSAGE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
# An emoji is one character of text but a 12-character escape ("\ud83d\ude00") in an ASCII JSON frame.
FRAME_CHARS_PER_TEXT_CHAR = 12
FRAME_OVERHEAD_CHARS = 1024
MESSAGE_ID_MAX = 2**63 - 1  # message ids are 64-bit database keys


def frame_decode(text_data: str | None, bytes_data: bytes | None) -> Any:
    """The JSON value of a text frame. Raises :class:`ProtocolError`: ``bad_frame`` for a binary or
    too long frame, ``bad_json`` for anything ``json.loads`` rejects (syntax, depth, huge integers)."""
    if text_data is None:
        raise ProtocolError(BAD_FRAME, "Binary frames are not supported; send JSON text.")
    limit = settings.CHAT_MAX_MESSAGE_CHARS * FRAME_CHARS_PER_TEXT_CHAR + FRAME_OVERHEAD_CHARS
    if len(text_data) > limit:
        raise ProtocolError(BAD_FRAME, f"The frame is {len(text_data)} characters long; the limit is {limit}.")
    try:
        return json.loads(text_data)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError, and so is a too-long integer
        raise ProtocolError(BAD_JSON, "The frame is not valid JSON.") from None


def client_event_parse(content: Any) -> ClientEvent:
    """The client event ``content`` (decoded JSON) describes. Raises :class:`ProtocolError` for
    anything that is not exactly one of the client events."""
    if not isinstance(content, dict):
        raise ProtocolError(BAD_EVENT, "An event must be a JSON object with a 'type'.")
    _unicode_check(content)
    kind = content.get("type")
    if kind == ChatSend.type:
        return _chat_send(content)
    if kind == ChatSync.type:
        after = content.get("after_message_id")
        if type(after) is not int or not 0 <= after <= MESSAGE_ID_MAX:
            raise ProtocolError(
                BAD_FIELD, f"'after_message_id' must be an integer from 0 (everything) to {MESSAGE_ID_MAX}."
            )
        return ChatSync(after_message_id=after)
    if kind == ChatStop.type:
        return ChatStop()
    if kind == ChatRegenerate.type:
        turn_id = content.get("turn_id")
        if type(turn_id) is not int or not 1 <= turn_id <= MESSAGE_ID_MAX:
            raise ProtocolError(BAD_FIELD, f"'turn_id' must be a message id, an integer from 1 to {MESSAGE_ID_MAX}.")
        return ChatRegenerate(turn_id=turn_id)
    if not isinstance(kind, str):
        raise ProtocolError(BAD_EVENT, "An event must have a string 'type'.")
    raise ProtocolError(
        BAD_EVENT, f"Unknown event type {kind[:40]!r}; expected chat.send, chat.sync, chat.stop or chat.regenerate."
    )


def _chat_send(content: dict[str, Any]) -> ChatSend:
    client_message_id = content.get("client_message_id")
    if not isinstance(client_message_id, str) or not CLIENT_MESSAGE_ID.fullmatch(client_message_id):
        raise ProtocolError(BAD_FIELD, "'client_message_id' must be 1-64 characters of letters, digits and _ . : -")
    text = content.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ProtocolError(BAD_FIELD, "'text' must be a non-empty string.", client_message_id=client_message_id)
    limit = settings.CHAT_MAX_MESSAGE_CHARS
    if len(text) > limit:
        raise ProtocolError(
            TOO_LONG,
            f"The message is {len(text)} characters long; the limit is {limit}.",
            client_message_id=client_message_id,
        )
    if "\x00" in text:
        raise ProtocolError(BAD_FIELD, "'text' must not contain NUL characters.", client_message_id=client_message_id)
    return ChatSend(client_message_id=client_message_id, text=text)


def _unicode_check(content: dict[str, Any]) -> None:
    """Raise ``bad_field`` when any key or string at any depth has no UTF-8 form (a lone surrogate):
    it could be neither stored nor sent back."""
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
        BAD_FIELD,
        f"{field_name[:40]!r} must be valid Unicode text (it contains a lone surrogate escape such as \\ud800).",
        client_message_id=client_message_id if readable else None,
    )
