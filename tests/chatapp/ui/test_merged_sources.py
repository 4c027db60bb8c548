"""The inspector marks the parts of a merged message (strict alternation, docs/memory.md F-38)
as sent: a message merged into its neighbour is still retained or current, not "not sent"."""

from __future__ import annotations

from chatapp.ui import page_feed
from chatapp.ui.inspector import request as inspector_request

SOURCES = [
    {"id": None, "kind": "system"},
    {"id": None, "kind": "summary", "merged": [{"id": 7, "kind": "history"}]},
    {"id": 8, "kind": "history", "merged": [{"id": 9, "kind": "history"}]},
    {"id": 10, "kind": "current", "merged": [{"id": 11, "kind": "current"}]},
]


def test_merged_parts_count_as_sent_in_both_views():
    for module in (inspector_request, page_feed):
        assert module._source_ids(SOURCES, "history") == {7, 8, 9}
        assert module._source_ids(SOURCES, "current") == {10, 11}
