"""The offline (extractive) summarizer on CJK text and long lines, markers never committed as a
summary, and the LLM prompt asking for the conversation's language (docs/memory.md F-36, F-39).
No database."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from memory.ports import SummaryReply, SummaryRequest
from memory.summary.chain import SummarizerChain, TruncatedSummaryError, check_reply, is_marker_line
from memory.summary.extractive import ExtractiveSummarizer, extractive_summary
from memory.summary.prompts import TRIM_MARKER, build_summary_prompt
from memory.summary.store import InMemorySummaryStore, Summary
from memory.text.sentences import split_sentences
from tests.memory.builders import COUNTER, ScriptedSummarizer, asst, user
from tests.memory.conftest import make_engine

# 21 sentences of 19 characters (399), then the one that matters: over 400 characters in all.
CHINESE_FILLER = "我们下个季度要在上海举办客户答谢活动。" * 21
CHINESE_ID = "请记住我的订单号是ZX-88213。"


def summarize(transcript: str, *, previous: str = "", max_tokens: int = 600) -> str:
    return extractive_summary(previous, transcript, max_tokens=max_tokens, counter=COUNTER)


def test_f39_cjk_sentences_end_at_full_width_stops():
    assert split_sentences("你好。我叫小明！你呢？好的；谢谢") == ["你好。", "我叫小明！", "你呢？", "好的；", "谢谢"]
    assert split_sentences("「走吧。」他说。") == ["「走吧。」", "他说。"]
    # ASCII full stops still need whitespace after them: numbers and domains stay whole.
    assert split_sentences("Version 1.5 is on example.com. Next!") == ["Version 1.5 is on example.com.", "Next!"]


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        # Titles, months, weekdays, company and address words, initials and Latin abbreviations.
        (
            "Dr. Smith and Mrs. Jones met me at 9 a.m. on Mon. Jan. 12. They said the fee is approx. $300, i.e. more.",
            [
                "Dr. Smith and Mrs. Jones met me at 9 a.m. on Mon. Jan. 12.",
                "They said the fee is approx. $300, i.e. more.",
            ],
        ),
        (
            "My colleague, Ms. Brown Jr., works at Acme Inc. in the U.S. and her ext. is 4412. She prefers email.",
            ["My colleague, Ms. Brown Jr., works at Acme Inc. in the U.S. and her ext. is 4412.", "She prefers email."],
        ),
        ("I live at 12 Elm Ave. Apt. 4B in York. Call me!", ["I live at 12 Elm Ave. Apt. 4B in York.", "Call me!"]),
        # A lowercase word or a digit after a period continues the sentence.
        (
            "My follow-up is on Jan. 5, 2027 at 10 a.m. with Prof. Lee.",
            ["My follow-up is on Jan. 5, 2027 at 10 a.m. with Prof. Lee."],
        ),
        # Ordinary sentence ends still end sentences, also after "etc." and "No.".
        (
            "Bring the docs, etc. The badge too. No. I did not.",
            ["Bring the docs, etc.", "The badge too.", "No.", "I did not."],
        ),
    ],
)
def test_f39_a_period_after_an_abbreviation_or_initial_does_not_end_a_sentence(text: str, sentences: list[str]):
    assert split_sentences(text) == sentences


def test_f39_dropping_sentences_never_splices_pieces_of_one_into_a_statement_nobody_made():
    # A newcomer's input: cut at "Inc." and "ext.", the summary kept "works at Acme Inc." and "is 4412."
    # side by side, which read as "Acme Inc. is 4412".
    summary = summarize(
        "- User: My colleague, Ms. Brown Jr., works at Acme Inc. in the U.S. and her ext. is 4412. She prefers email.\n"
        "- User: Dr. Smith and Mrs. Jones met me at 9 a.m. on Mon. Jan. 12. They said the fee is approx. $300."
    )

    assert "Acme Inc. is 4412" not in summary
    assert "works at Acme Inc. in the U.S. and her ext. is 4412." in summary
    assert "Dr. Smith and Mrs. Jones met me at 9 a.m. on Mon. Jan. 12." in summary


def test_f39_the_identifier_at_the_end_of_a_long_chinese_message_survives():
    message = CHINESE_FILLER + CHINESE_ID
    assert len(message) > 400

    summary = summarize(f"- User: {message}")

    assert "ZX-88213" in summary
    assert COUNTER.count_text(summary) <= 600


def test_f39_a_long_chinese_sentence_without_stops_keeps_its_end():
    """One 400-character "sentence" (no 。 at all): it is cut into pieces at clause breaks, and
    the piece with the identifier is kept whole, marked where the sentence was cut."""
    message = "我们下个季度要在上海举办客户答谢活动，" * 21 + "我的会员编号是HK20391"
    assert len(message) > 400 and "。" not in message

    summary = summarize(f"- Assistant: {message}", max_tokens=120)

    assert "我的会员编号是HK20391" in summary and "…" in summary
    assert COUNTER.count_text(summary) <= 120


def test_f39_the_penicillin_sentence_is_kept_not_the_greeting():
    summary = summarize("- User: Hi. I'm allergic to penicillin and my dog is called Biscuit.")

    assert summary == "- User: I'm allergic to penicillin and my dog is called Biscuit."


def test_f39_without_a_salient_sentence_the_most_informative_one_is_kept_not_the_shortest():
    summary = summarize("- User: Ok. That plan sounds fine to everybody involved in the move.")

    assert summary == "- User: That plan sounds fine to everybody involved in the move."


def test_f39_a_line_too_long_for_the_room_left_keeps_its_best_sentences():
    """Before: a line over the remaining budget was dropped whole, identifier and all."""
    filler = " ".join(f"The weather was nice on the {n}th walk along the river." for n in range(1, 30))
    transcript = f"- User: {filler} My booking code is QX7781, please keep it."
    assert COUNTER.count_text(transcript) > 200

    summary = summarize(transcript, max_tokens=40)

    assert summary.startswith("- User: ") and "QX7781" in summary
    assert COUNTER.count_text(summary) <= 40


def test_f39_a_trimming_marker_is_never_a_summary():
    assert summarize(TRIM_MARKER) == ""
    assert summarize(TRIM_MARKER, previous=TRIM_MARKER) == ""
    # With real text next to it, the text is kept and the marker is not.
    summary = summarize(f"- Assistant: {'lorem ipsum dolor sit amet ' * 30}\n{TRIM_MARKER}")
    assert summary and "lorem" in summary and "trimmed" not in summary


def test_f39_an_oversized_non_salient_message_is_not_summarized_to_the_marker():
    """The committed fault: one oversized assistant message (no digits, no names) was trimmed to
    the summarizer's window, its line dropped, and the marker line alone became the summary."""
    engine = make_engine(window=2048, primary=ExtractiveSummarizer(COUNTER), store=InMemorySummaryStore())

    outcome = async_to_sync(engine.summarize)(Summary(), [{"id": 1, **asst("lorem ipsum dolor sit amet " * 800)}])

    assert not outcome.degraded and outcome.summary.summary_type == "llm"
    assert outcome.summary.content.startswith("- Assistant: lorem ipsum")
    assert "trimmed" not in outcome.summary.content


@pytest.mark.parametrize(
    "text",
    [
        TRIM_MARKER,
        f"{TRIM_MARKER}\n\n[Raw archive of newly added messages]\n- [12 earlier archived messages omitted]",
        "[Memory Summary - 16 earlier messages consolidated]\n…",
        "...",
    ],
)
def test_f36_f39_a_marker_only_reply_fails_its_attempt(text: str):
    assert all(is_marker_line(line) for line in text.splitlines() if line.strip())
    primary = ScriptedSummarizer([text, "- User: my code is Q-42."], model="p")

    result = async_to_sync(SummarizerChain(primary=primary, backoff=0).run)(request())

    assert result.text == "- User: my code is Q-42."
    assert result.attempts[0].error.startswith("MarkerOnlySummaryError")


def test_f36_a_reply_cut_off_at_the_output_cap_is_refused_however_plausible():
    with pytest.raises(TruncatedSummaryError, match="finish_reason 'length'"):
        check_reply(SummaryReply(text="- User: my order is A-12", finish_reason="length"))
    assert check_reply(SummaryReply(text=" - User: my order is A-12345. ", finish_reason="stop")) == (
        "- User: my order is A-12345."
    )
    assert check_reply("- User: a fact [... transcript trimmed to fit the summarizer ...]") != ""


def test_f36_a_cut_off_summary_keeps_the_old_one_and_goes_to_the_raw_archive():
    primary = ScriptedSummarizer(default=SummaryReply(text="- User: my order is A-12", finish_reason="length"))
    engine = make_engine(window=2048, primary=primary, store=InMemorySummaryStore())
    old = Summary(content="- User: my name is Ada.", summary_type="llm", last_message_id=0)

    outcome = async_to_sync(engine.summarize)(old, [{"id": 1, **user("my order is A-12345 " * 20)}])

    assert outcome.degraded and outcome.summary.content.startswith("- User: my name is Ada.")
    assert "A-12\n" not in outcome.summary.content and outcome.summary.summary_type == "raw"
    assert [a.error.split(":")[0] for a in outcome.attempts] == ["TruncatedSummaryError"] * 3


def test_f39_the_llm_prompt_asks_for_the_conversation_language():
    system = build_summary_prompt(previous_summary="", transcript="- User: 你好", max_tokens=100)[0]["content"]

    assert "language of the conversation" in system and "never translate" in system


def request() -> SummaryRequest:
    prompt = build_summary_prompt(previous_summary="", transcript="- User: my code is Q-42.", max_tokens=100)
    return SummaryRequest(previous_summary="", messages=[], prompt=prompt, max_tokens=100)


def test_f51_the_extractive_summary_withholds_a_password_and_keeps_the_order_number():
    transcript = "- User: My order is #W2378156 and my password is Blue-Falcon-88, please fix my account."
    summary = summarize(transcript, previous="- User: my PIN is 4821 for the card")
    assert "#W2378156" in summary and "[password withheld]" in summary
    assert "Blue-Falcon-88" not in summary and "4821" not in summary
