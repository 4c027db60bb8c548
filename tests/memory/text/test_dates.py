"""Relative dates resolved against a message's own time (docs/memory.md F-52), in English and Chinese,
with the documented conventions for weekdays, weeks and bare hours."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from memory.text.dates import NaiveTimeError, ResolvedDate, resolve_relative

BERLIN = ZoneInfo("Europe/Berlin")
# Sunday 22 November 2026, 10:00 in Berlin (the week of Monday 16 November).
SUNDAY = datetime(2026, 11, 22, 10, 0, tzinfo=BERLIN)
# Wednesday 25 November 2026, 18:30.
WEDNESDAY = datetime(2026, 11, 25, 18, 30, tzinfo=BERLIN)

CASES = [
    # (said at, text, words, value, granularity)
    (SUNDAY, "see you tomorrow at 3pm then", "tomorrow at 3pm", "2026-11-23 15:00", "minute"),
    (SUNDAY, "today", "today", "2026-11-22", "day"),
    (SUNDAY, "can we talk tonight?", "tonight", "2026-11-22", "day"),
    (SUNDAY, "tonight at 8", "tonight at 8", "2026-11-22 20:00", "minute"),
    (SUNDAY, "the book club is tonight at 8.", "tonight at 8", "2026-11-22 20:00", "minute"),
    (SUNDAY, "it was yesterday", "yesterday", "2026-11-21", "day"),
    (SUNDAY, "the day after tomorrow works", "the day after tomorrow", "2026-11-24", "day"),
    (SUNDAY, "the day before yesterday", "the day before yesterday", "2026-11-20", "day"),
    (SUNDAY, "in 3 days", "in 3 days", "2026-11-25", "day"),
    (SUNDAY, "in two weeks", "in two weeks", "2026-12-06", "day"),
    (SUNDAY, "in a week", "in a week", "2026-11-29", "day"),
    (SUNDAY, "in 3 months", "in 3 months", "2027-02-22", "day"),
    (SUNDAY, "two days ago", "two days ago", "2026-11-20", "day"),
    (SUNDAY, "in 3 hours", "in 3 hours", "2026-11-22 13:00", "minute"),
    (SUNDAY, "Friday at 10:30", "Friday at 10:30", "2026-11-27 10:30", "minute"),
    (SUNDAY, "next Friday", "next Friday", "2026-11-27", "day"),
    (SUNDAY, "this Friday", "this Friday", "2026-11-27", "day"),
    (SUNDAY, "last Friday", "last Friday", "2026-11-20", "day"),
    (SUNDAY, "on Sunday", "on Sunday", "2026-11-22", "day"),
    (SUNDAY, "next week", "next week", "2026-11-23", "week"),
    (SUNDAY, "this week", "this week", "2026-11-16", "week"),
    (SUNDAY, "last week", "last week", "2026-11-09", "week"),
    (SUNDAY, "next month", "next month", "2026-12", "month"),
    (SUNDAY, "last month", "last month", "2026-10", "month"),
    (SUNDAY, "tomorrow morning at 7", "tomorrow morning at 7", "2026-11-23 07:00", "minute"),
    (SUNDAY, "tomorrow at 3", "tomorrow at 3", "2026-11-23 15:00", "minute"),
    (SUNDAY, "tomorrow at 9", "tomorrow at 9", "2026-11-23 09:00", "minute"),
    (SUNDAY, "tomorrow at noon", "tomorrow at noon", "2026-11-23 12:00", "minute"),
    (SUNDAY, "at 9am tomorrow", "at 9am tomorrow", "2026-11-23 09:00", "minute"),
    (SUNDAY, "tomorrow, 18:45", "tomorrow, 18:45", "2026-11-23 18:45", "minute"),
    (WEDNESDAY, "next Friday", "next Friday", "2026-12-04", "day"),
    (WEDNESDAY, "Friday", "Friday", "2026-11-27", "day"),
    (WEDNESDAY, "this Friday", "this Friday", "2026-11-27", "day"),
    (WEDNESDAY, "last Friday", "last Friday", "2026-11-20", "day"),
    (WEDNESDAY, "on Wednesday", "on Wednesday", "2026-11-25", "day"),
    (WEDNESDAY, "next Monday", "next Monday", "2026-11-30", "day"),
    (WEDNESDAY, "last Wednesday", "last Wednesday", "2026-11-18", "day"),
    (WEDNESDAY, "this weekend", "this weekend", "2026-11-28", "day"),
    (WEDNESDAY, "next weekend", "next weekend", "2026-12-05", "day"),
    (WEDNESDAY, "in 30 minutes", "in 30 minutes", "2026-11-25 19:00", "minute"),
    (WEDNESDAY, "in 6 hours", "in 6 hours", "2026-11-26 00:30", "minute"),
    # Chinese
    (SUNDAY, "明天下午3点开会", "明天下午3点", "2026-11-23 15:00", "minute"),
    (SUNDAY, "今天", "今天", "2026-11-22", "day"),
    (SUNDAY, "明天", "明天", "2026-11-23", "day"),
    (SUNDAY, "后天见", "后天", "2026-11-24", "day"),
    (SUNDAY, "大后天", "大后天", "2026-11-25", "day"),
    (SUNDAY, "昨天", "昨天", "2026-11-21", "day"),
    (SUNDAY, "前天", "前天", "2026-11-20", "day"),
    (SUNDAY, "下周五", "下周五", "2026-11-27", "day"),
    (SUNDAY, "下个月", "下个月", "2026-12", "month"),
    (SUNDAY, "下周", "下周", "2026-11-23", "week"),
    (SUNDAY, "明晚8点半", "明晚8点半", "2026-11-23 20:30", "minute"),
    (SUNDAY, "明天上午10点", "明天上午10点", "2026-11-23 10:00", "minute"),
    (SUNDAY, "明天晚上七点", "明天晚上七点", "2026-11-23 19:00", "minute"),
    (SUNDAY, "明天下午", "明天下午", "2026-11-23", "day"),
    (SUNDAY, "3天后", "3天后", "2026-11-25", "day"),
    (SUNDAY, "两周后", "两周后", "2026-12-06", "day"),
    (SUNDAY, "三天前", "三天前", "2026-11-19", "day"),
    (WEDNESDAY, "下周五", "下周五", "2026-12-04", "day"),
    (WEDNESDAY, "这周五", "这周五", "2026-11-27", "day"),
    (WEDNESDAY, "本周一", "本周一", "2026-11-23", "day"),
    (WEDNESDAY, "上周五", "上周五", "2026-11-20", "day"),
    (WEDNESDAY, "周五", "周五", "2026-11-27", "day"),
    (WEDNESDAY, "星期天", "星期天", "2026-11-29", "day"),
    (WEDNESDAY, "下星期二", "下星期二", "2026-12-01", "day"),
]


@pytest.mark.parametrize(("at", "text", "words", "value", "granularity"), CASES)
def test_resolves(at, text, words, value, granularity):
    results = resolve_relative(text, at)
    assert [(r.words, r.value, r.granularity) for r in results] == [(words, value, granularity)]
    assert text[results[0].start : results[0].end] == words


def test_several_expressions_in_one_message_in_order():
    text = "I can't today, but tomorrow at 3pm or next Friday works. 下周五也行。"
    results = resolve_relative(text, SUNDAY)
    assert [(r.words, r.value) for r in results] == [
        ("today", "2026-11-22"),
        ("tomorrow at 3pm", "2026-11-23 15:00"),
        ("next Friday", "2026-11-27"),
        ("下周五", "2026-11-27"),
    ]


def test_results_are_in_the_zone_of_the_message_time():
    # 23:30 in New York is already the next day in UTC: "tomorrow" is New York's tomorrow.
    late = datetime(2026, 11, 22, 23, 30, tzinfo=ZoneInfo("America/New_York"))
    assert resolve_relative("tomorrow", late)[0].value == "2026-11-23"
    assert resolve_relative("tomorrow", late.astimezone(UTC))[0].value == "2026-11-24"
    assert resolve_relative("in 2 hours", late)[0].value == "2026-11-23 01:30"
    plus_eight = datetime(2026, 11, 22, 10, 0, tzinfo=timezone(timedelta(hours=8)))
    assert resolve_relative("明天下午3点", plus_eight)[0].value == "2026-11-23 15:00"


def test_month_arithmetic_clamps_to_the_month_end():
    at = datetime(2027, 1, 31, 9, 0, tzinfo=BERLIN)
    assert resolve_relative("in 1 month", at)[0].value == "2027-02-28"
    assert resolve_relative("next month", at)[0].value == "2027-02"
    assert resolve_relative("last month", datetime(2027, 1, 5, tzinfo=BERLIN))[0].value == "2026-12"


def test_absolute_dates_and_ordinary_words_are_not_reported():
    text = "On 2026-11-30 at 15:00 we met; the next step is a weekly call, this is fine. Order #W2378156."
    assert resolve_relative(text, SUNDAY) == []
    assert resolve_relative("at 3 people per table", SUNDAY) == []


def test_a_bare_hour_after_at_is_not_taken_from_a_count():
    assert [r.value for r in resolve_relative("tomorrow at 5 people", SUNDAY)] == ["2026-11-23"]


def test_naive_reference_time_is_refused():
    with pytest.raises(NaiveTimeError):
        resolve_relative("tomorrow", datetime(2026, 11, 22, 10, 0))


def test_result_shape():
    (result,) = resolve_relative("x tomorrow", SUNDAY)
    assert result == ResolvedDate(start=2, end=10, words="tomorrow", value="2026-11-23", granularity="day")
