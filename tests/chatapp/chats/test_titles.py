"""A chat's title made from its first message: identifiers, contact data, card
numbers, URLs and secrets are left out (the key-fact rules find them, ``memory.api.value_spans``),
amounts and dates stay, a long text is cut at a word, and a message with nothing else left gives
the neutral "Chat <id>". Pure: no database."""

from __future__ import annotations

import itertools

import pytest

from chatapp.chats.services import TITLE_MAX_CHARS, chat_session_title_from_text, title_plain
from memory.api import value_spans


def title(text: str) -> str:
    return chat_session_title_from_text(text=text, session_id=42)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What does the Team plan cost?", "What does the Team plan cost?"),
        ("Hi! My name is Ada, account ACC-7731.", "Hi! My name is Ada, account …"),
        ("Where is order #W2378156? It never came.", "Where is order …? It never came."),
        ("My card 4111 1111 1111 1111 was charged twice", "My card … was charged twice"),
        ("The card ending in 4421 was declined", "The card ending in … was declined"),
        ("Email ada@example.com or call +1 415-555-0134", "Email … or call …"),
        ("Mail me at ada@example.com, bob@example.com about it", "Mail me at … about it"),
        ("See https://example.com/orders/77 please", "See … please"),
        ("My password is swordfish, can you reset it?", "My password …, can you reset it?"),
        ("我的订单号是A-48213，请帮我查一下", "我的订单号是…，请帮我查一下"),
        ("  search the knowledge base\n\nfor  refunds ", "search the knowledge base for refunds"),
        # Amounts and dates are what a chat is about, not who the user is: they stay.
        ("A refund of $40 on May 3?", "A refund of $40 on May 3?"),
    ],
)
def test_a_title_keeps_the_words_and_leaves_out_identifiers_and_contact_data(text: str, expected: str):
    assert title(text) == expected


@pytest.mark.parametrize("text", ["ACC-7731", "ada@example.com", "+1 415-555-0134 / 4111 1111 1111 1111", "?!", ""])
def test_a_message_of_nothing_but_values_gives_the_neutral_title(text: str):
    assert title(text) == "Chat 42"


def test_a_long_message_is_cut_at_a_word_after_its_values_are_left_out():
    # The email sits across the cut: removed whole first, so no half of it can remain.
    text = "Please look into my refund request because " + "x" * 9 + " ada.lovelace@example.com and more words here"
    made = title(text)
    assert len(made) <= TITLE_MAX_CHARS and made.endswith("…")
    assert "ada" not in made and "@" not in made and "example" not in made
    assert made.startswith("Please look into my refund request because")
    words = "word " * 30
    cut = title(words)
    assert len(cut) <= TITLE_MAX_CHARS and cut.endswith("word…")  # at a word, not inside one


def test_a_cut_right_after_a_left_out_value_shows_one_ellipsis():
    # A newcomer's title: "... and my invoice ……" (the value's mark, then the cut's).
    made = title("Hi, I'm Ada Lovelace. My account id is ACC-7731 and my invoice INV-20931 is wrong, please check")
    assert made == "Hi, I'm Ada Lovelace. My account id is … and my invoice …"
    assert "……" not in made and len(made) <= TITLE_MAX_CHARS


def test_value_spans_uses_the_key_fact_rules_and_marks_secrets():
    text = "Order KX-55190, PIN 1234, card 4111 1111 1111 1111, mail a@b.io, cost $12 on 2026-03-01"
    spans = {text[start:end]: kind for start, end, kind in value_spans(text)}
    assert spans == {
        "KX-55190": "id",
        "1234": "secret",
        "4111 1111 1111 1111": "secret",
        "a@b.io": "email",
        "$12": "money",
        "2026-03-01": "date",
    }
    ordered = value_spans(text)
    assert ordered == sorted(ordered)
    assert all(a_end <= b_start for (_, a_end, _), (b_start, _, _) in itertools.pairwise(ordered))


def test_value_spans_covers_a_secret_without_digits_to_the_end_of_its_clause():
    text = "my password is swordfish, and the rest stays"
    assert [(text[start:end], kind) for start, end, kind in value_spans(text)] == [("is swordfish", "secret")]


def test_bidirectional_controls_never_reach_a_title():
    """An override in a message or a rename would reorder the chat list's text around the title (found by a
    newcomer): the controls are dropped, the letters kept."""
    assert title("Invoice \u202egnp.exe\u202c for \u2067March\u2069") == "Invoice gnp.exe for March"
    assert title_plain(" Re\u200fnamed \u202d chat \n") == "Renamed chat"
