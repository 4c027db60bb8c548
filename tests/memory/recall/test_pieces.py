"""What recall indexes of a stored message: credentials never enter an item's text, search text or
embedding input, while identifiers stay searchable (docs/memory.md §12 "The index", F-51)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from memory.recall.pieces import message_pieces
from tests.memory.builders import COUNTER, asst, tool

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


def test_a_result_that_found_nothing_and_the_answer_given_on_it_are_not_indexed():
    """The user's question stays recallable; the empty result and the answer grounded on nothing do not (they
    would be recalled for the question ahead of the message that holds its answer)."""
    messages = [
        {"id": 1, "role": "user", "content": "Who sold me the Bianchi bicycle?"},
        asst(tc=["s1"], tool="order_lookup"),
        tool("s1", "No results for 'Bianchi'.", name="order_lookup"),
        asst("I found nothing about the Bianchi bicycle."),
        {"id": 5, "role": "user", "content": "Look up order W77 then."},
        asst(tc=["s2", "s3"], tool="order_lookup"),
        tool("s2", "", name="order_lookup"),
        tool("s3", "W77: Bianchi Via Nirone 7, sold by Rossi Cicli", name="order_lookup"),
        asst("Rossi Cicli sold it."),
    ]
    stored = [{**message, "id": number, "created_at": AT} for number, message in enumerate(messages, 1)]
    pieces = message_pieces(stored, counter=COUNTER, calls={}, empty_results=("no results",))
    indexed = [piece.last_message_id for piece in pieces]
    assert indexed == [1, 5, 8, 9]
    # Without the rule, the empty result and its answer are indexed like any other.
    assert [piece.last_message_id for piece in message_pieces(stored, counter=COUNTER, calls={})] == [1, 3, 4, 5, 8, 9]
