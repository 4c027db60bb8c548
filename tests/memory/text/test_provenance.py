"""Provenance of the parts of a user message (docs/memory.md F-49, F-50): the user's own words versus
what they quote, forward or paste, and bursts of similar values."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.text.provenance import (
    DOCUMENT_CHARS,
    ProvenanceSpan,
    ValueBurst,
    own_text,
    repetitive_values,
    text_spans,
    value_shape,
)


def kinds_of(text: str) -> list[tuple[str, str]]:
    return [(span.kind, text[span.start : span.end]) for span in text_spans(text)]


def test_plain_message_is_all_own():
    text = "My name is Ana and I live at 12 Rue Verte.\nMy order is #W2378156."
    assert text_spans(text) == [ProvenanceSpan(0, len(text), "own")]


def test_empty_text_has_no_spans():
    assert text_spans("") == []


def test_forwarded_email_on_one_line_leaves_only_the_users_sentence():
    text = "My name is Ana. My boss forwarded this: ---- From: Tom\nSubject: hi\n\nHello, my name is Tom, I live at 4 Elm St."
    assert own_text(text) == "My name is Ana. My boss forwarded this:"
    assert kinds_of(text)[1][0] == "forwarded"
    assert "my name is Tom" in kinds_of(text)[1][1]


def test_forwarded_message_marker_with_an_end_marker():
    text = (
        "My name is Ana.\n\n---------- Forwarded message ---------\nFrom: Tom <tom@example.com>\n"
        "Date: Mon, 2 Nov 2026\nSubject: Flat\n\nmy name is Tom and I moved to Oslo\n"
        "---------- End forwarded message ----------\nCan you summarise it?"
    )
    assert [kind for kind, _ in kinds_of(text)] == ["own", "forwarded", "own"]
    assert own_text(text) == "My name is Ana.\n\n\nCan you summarise it?"


@pytest.mark.parametrize(
    "text",
    [
        "Begin forwarded message:\n\nFrom: Tom\nmy name is Tom",
        "-----Original Message-----\nFrom: Tom\nmy name is Tom",
        "Fwd: my name is Tom",
        "---------- Weitergeleitete Nachricht ---------\nVon: Tom\nmein Name ist Tom",
        "---------- 转发的邮件 ----------\n发件人: Tom\n我叫汤姆",
        "我老板转发给我：我叫汤姆，住在北京",
    ],
)
def test_forward_markers_in_several_languages(text):
    assert "Tom" not in own_text(text) and "汤姆" not in own_text(text)
    assert any(kind == "forwarded" for kind, _ in kinds_of(text))


def test_email_header_block_without_a_marker():
    text = "Look at this\nFrom: Tom Baker\nTo: Ana\nSubject: keys\n\nMy name is Tom, my phone is 555-0101."
    assert own_text(text) == "Look at this\n"


def test_a_single_header_like_line_is_own():
    text = "To: whom it may concern, I am Ana and I need a refund."
    assert own_text(text) == text


def test_reply_quote_on_date_wrote():
    text = "Sounds good to me.\n\nOn Mon, 2 Nov 2026 at 10:00, Tom <tom@example.com> wrote:\n> my name is Tom"
    assert own_text(text) == "Sounds good to me.\n\n"


def test_chat_log_excerpt_is_forwarded_and_the_question_after_it_is_own():
    text = "[12:03] Alice: my name is Alice\n[12:04] Bob: hi Alice\n[12:05] Alice: I live in Rome\nWho is Bob?"
    assert kinds_of(text) == [
        ("forwarded", "[12:03] Alice: my name is Alice\n[12:04] Bob: hi Alice\n[12:05] Alice: I live in Rome\n"),
        ("own", "Who is Bob?"),
    ]


def test_whatsapp_style_chat_export():
    text = "02/11/26, 12:03 - Alice: I'm vegan\n02/11/26, 12:04 - Bob: me too\nwhat did they say?"
    assert own_text(text) == "what did they say?"


def test_quoted_lines():
    text = "> my name is Tom\n> I like jazz\nI don't, though."
    assert kinds_of(text) == [("quoted", "> my name is Tom\n> I like jazz\n"), ("own", "I don't, though.")]


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ('He said "my name is Tom, call me at 555-0101" and left.', '"my name is Tom, call me at 555-0101"'),
        ("The sign says “no parking after 6pm”.", "“no parking after 6pm”"),
        ("My landlord wrote: “the rent is now 900 euros”", "“the rent is now 900 euros”"),
        ('"I am allergic to nuts," she said.', '"I am allergic to nuts,"'),
        ("He said: my address is 4 Elm St", "my address is 4 Elm St"),
        ("他说：“我叫汤姆，住在北京。”", "“我叫汤姆，住在北京。”"),
        ("Sie sagte: „ich wohne in Berlin“", "„ich wohne in Berlin“"),
    ],
)
def test_quotations_after_or_before_a_speech_cue(text, quoted):
    assert ("quoted", quoted) in kinds_of(text)
    assert quoted not in own_text(text)


def test_quotation_marks_without_a_cue_stay_own():
    text = 'I call my dog "Biscuit" and my cat "Pepper".'
    assert own_text(text) == text


def test_log_lines_and_the_users_words_around_them():
    text = (
        "Here are the logs:\n2026-11-02 12:00:01 ERROR worker 3 failed id=A-48213\n"
        "2026-11-02 12:00:02 INFO retry id=A-48214\n    at worker.run(worker.py:12)\n"
        "2026-11-02 12:00:03 INFO ok\nMy order is #W2378156."
    )
    assert [kind for kind, _ in kinds_of(text)] == ["own", "log", "own"]
    assert own_text(text) == "Here are the logs:\nMy order is #W2378156."


def test_levelled_lines_without_timestamps():
    text = "[ERROR] disk full on /dev/sda1\n[WARN] retrying in 5s\nis that bad?"
    assert own_text(text) == "is that bad?"


def test_python_and_java_stack_traces():
    python = 'Traceback (most recent call last):\n  File "app.py", line 3, in <module>\n    main()\nValueError: bad id\nwhat does it mean?'
    java = "java.lang.IllegalStateException: closed\n    at com.acme.Db.query(Db.java:42)\n    at com.acme.App.main(App.java:7)\nhelp"
    assert own_text(python) == "what does it mean?"
    assert own_text(java) == "help"


def test_a_call_list_with_a_time_on_each_line_is_a_log():
    text = "I keep getting these:\nMon 09:12 missed call from +44 7700 900311\nTue 08:03 missed call from +44 7700 900313\nspam?"
    assert own_text(text) == "I keep getting these:\nspam?"


def test_a_single_timestamp_in_a_sentence_is_own():
    text = "2026-11-02 12:00 is when my flight lands."
    assert own_text(text) == text


def test_fenced_code_including_an_unclosed_fence():
    text = "see this:\n```python\nname = 'Tom'\naddress = '4 Elm St'\n```\nthanks"
    assert kinds_of(text) == [
        ("own", "see this:\n"),
        ("code", "```python\nname = 'Tom'\naddress = '4 Elm St'\n```\n"),
        ("own", "thanks"),
    ]
    assert own_text("look:\n```\nx = 1\ny = 2") == "look:\n"


def test_indented_code_block_after_a_blank_line():
    text = "My script:\n\n    user = 'tom_99'\n    order = 'A-48213'\n\nWhy does it fail?"
    assert own_text(text) == "My script:\n\n\nWhy does it fail?"


def test_markdown_tab_and_comma_tables():
    markdown = "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\nthat's my table"
    tabs = "name\tphone\nTom\t555-0101\nAna\t555-0102\nwhich one?"
    csv = "name,phone,city\nTom,555-0101,Lyon\nAna,555-0102,Rome\nBob,555-0103,Oslo"
    assert own_text(markdown) == "that's my table"
    assert own_text(tabs) == "which one?"
    assert own_text(csv) == ""


def test_two_rows_are_not_a_table_and_prose_with_commas_is_own():
    assert own_text("a\tb\nc\td\n") == "a\tb\nc\td\n"
    prose = "I like apples, pears, and plums. Also, tea, coffee, and water.\nI'm Ana, from Lyon, France."
    assert own_text(prose) == prose


def test_document_after_a_cue_and_a_very_long_paragraph():
    text = "Here is the document:\nThe tenant, Mr. Smith, lives at 4 Elm St.\n\nHe shall pay monthly."
    assert own_text(text) == "Here is the document:\n"
    assert own_text("以下是合同内容如下：\n甲方：张三，住址北京。") == "以下是合同内容如下：\n"
    long = "Intro line.\n\n" + ("This clause says the lessee keeps the premises clean. " * 30) + "\n\nIs that normal?"
    assert len(long) > DOCUMENT_CHARS
    assert own_text(long) == "Intro line.\n\n\nIs that normal?"


def test_mixed_message_with_every_kind():
    text = (
        "I'm Ana, order #W2378156.\n"
        "> I'm Tom\n"
        "```\ncode = 1\n```\n"
        "2026-11-02 12:00:01 ERROR a\n2026-11-02 12:00:02 ERROR b\n"
        "| x | y |\n|---|---|\n| 1 | 2 |\n"
        "Thanks!\n"
        "-----Original Message-----\nFrom: Tom\nI'm Tom."
    )
    assert [kind for kind, _ in kinds_of(text)] == ["own", "quoted", "code", "log", "table", "own", "forwarded"]
    assert own_text(text) == "I'm Ana, order #W2378156.\nThanks!\n"


_LINES = st.sampled_from(
    [
        "My name is Ana.",
        "> quoted",
        "```",
        "    indented",
        "2026-11-02 12:00:01 ERROR x",
        "| a | b |",
        "a,b,c",
        "From: Tom",
        "Subject: x",
        "[12:03] Alice: hi",
        "---------- Forwarded message ---------",
        'He said "hello there"',
        "Here is the document:",
        "",
        "x" * 50,
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_LINES, max_size=12).map("\n".join))
def test_spans_cover_the_text_without_gaps_or_repeated_kinds(text):
    spans = text_spans(text)
    assert "".join(text[s.start : s.end] for s in spans) == text
    assert all(a.end == b.start and a.kind != b.kind for a, b in itertools.pairwise(spans))


def test_value_shapes():
    assert value_shape("#W2378156") == "#x"
    assert value_shape("09:30") == "9:9"
    assert value_shape("KX-55190") == "a-9"
    assert value_shape("2026-11-02 12:00:01") == "9-9-9 9:9:9"
    assert value_shape("mia_li_3668") == "a_a_9"


def test_repetitive_values_finds_a_burst_and_keeps_the_users_few_values():
    values = ["A-48213", "#W2378156", "A-48214", "09:00", "A-48215", "A-48216", "09:30", "A-48213"]
    assert repetitive_values(values) == [
        ValueBurst(shape="a-9", values=("A-48213", "A-48214", "A-48215", "A-48216"), indexes=(0, 2, 4, 5))
    ]


def test_a_checklist_of_times_is_a_burst_and_three_ids_are_not():
    times = ["07:00", "07:30", "08:15", "09:00", "12:00"]
    assert [burst.values for burst in repetitive_values(times)] == [tuple(times)]
    assert repetitive_values(["#W2378156", "#W2378157", "#W2378158"]) == []
    assert repetitive_values(["#W2378156", "#W2378157", "#W2378158"], min_count=3) != []


def test_repeated_values_count_once():
    assert repetitive_values(["A-1", "A-1", "A-1", "A-1"]) == []
