"""The chat pages' number filters (chatapp/templatetags/chat.py): figures with thousands
separators, and a duration that never splits from its unit at a line break."""

from __future__ import annotations

from chatapp.templatetags.chat import ms, tokens


def test_token_counts_and_durations_share_their_thousands_separators():
    assert tokens(1509) == "1,509" and tokens(0) == "0" and tokens(None) == "—"
    assert ms(1509) == "1,509\u00a0ms" and ms(1001) == "1,001\u00a0ms" and ms(5) == "5\u00a0ms"
    assert ms(None) == "—"
