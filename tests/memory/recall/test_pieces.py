"""What recall indexes of a stored message: credentials never enter an item's text, search text or
embedding input, while identifiers stay searchable (docs/memory.md §12 "The index", F-51)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from memory.recall.pieces import message_pieces
from tests.memory.builders import COUNTER

AT = datetime(2026, 12, 1, tzinfo=UTC)


def test_f51_the_recall_index_withholds_credentials_and_keeps_identifiers():
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "login", "arguments": json.dumps({"user_id": "mia_li_3668", "password": "Tr0ub4dor&3"})},
    }
    messages = [
        {"id": 1, "role": "user", "content": "Order #W2378156; my password is Blue-Falcon-88.", "created_at": AT},
        {"id": 2, "role": "assistant", "content": None, "tool_calls": [call], "created_at": AT},
        {"id": 3, "role": "tool", "tool_call_id": "c1", "name": "login", "content": "ok", "created_at": AT},
    ]
    pieces = message_pieces(messages, counter=COUNTER, calls={})
    indexed = "\n".join(f"{piece.text}\n{piece.search_text}" for piece in pieces)
    assert "#W2378156" in indexed and "mia_li_3668" in indexed and "[password withheld]" in indexed
    assert "Blue-Falcon-88" not in indexed and "Tr0ub4dor" not in indexed
