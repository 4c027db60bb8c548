"""Time on the wire (docs/memory.md F-52): the date line, day markers, their tokens and budgets."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.context.request import ContextRequest
from memory.context.timeline import date_line, day_marker, with_date_line
from memory.summary.extractive import ExtractiveSummarizer
from memory.summary.store import InMemorySummaryStore
from tests.memory.builders import COUNTER, FlakySummarizer, Store, asst, user
from tests.memory.conftest import make_engine
from tests.memory.context.test_properties import conversation, dropped_wire_ids
from tests.memory.invariants import check_context

SYSTEM = "You are a helpful assistant."
NOW = datetime(2026, 11, 24, 9, 30, tzinfo=UTC)
_keys = itertools.count(1)


def at(day: int, hour: int = 10) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


def dated(message, when):
    return {**message, "created_at": when}


def build(engine, store, *, now=NOW, key=None):
    request = ContextRequest(
        memory_key=key or f"timeline-{next(_keys)}",
        system_prompt=SYSTEM,
        load_increment=store.load_increment,
        mode="quick-answer",
        now=now,
    )
    context = async_to_sync(engine.build_context)(request)
    check_context(context, stored=store.rows, system_prompt=f"{SYSTEM}\n\n{date_line(now)}", counter=COUNTER)
    return context


def test_the_date_line_names_the_day_the_weekday_the_time_and_the_zone():
    assert date_line(datetime(2026, 11, 22, 14, 5, tzinfo=ZoneInfo("Europe/Berlin"))) == (
        "Current date: 2026-11-22 (Sunday), 14:05, time zone Europe/Berlin."
    )
    est = timezone(timedelta(hours=-5), "EST")
    assert date_line(datetime(2024, 5, 15, 15, 0, tzinfo=est)).endswith("15:00, time zone EST.")
    assert date_line(datetime(2024, 5, 15, 15, 0)) == "Current date: 2024-05-15 (Wednesday), 15:00."
    assert day_marker(date(2026, 11, 22)) == "[2026-11-22 Sun]"


def test_a_request_without_now_carries_no_date():
    assert with_date_line(SYSTEM, None) == SYSTEM
    request = ContextRequest(memory_key="k", system_prompt=SYSTEM, load_increment=Store().load_increment, mode="agent")
    assert request.system == {"role": "system", "content": SYSTEM}


def test_the_system_prompt_carries_todays_date_and_the_stored_rows_stay_unchanged():
    store = Store()
    store.add(dated(user("hi"), at(24, 8)), dated(asst("hello"), at(24, 8)), dated(user("what day is it?"), NOW))
    snapshot = store.snapshot()
    context = build(make_engine(primary=ExtractiveSummarizer(COUNTER), store=InMemorySummaryStore()), store)
    assert context.messages[0]["content"] == f"{SYSTEM}\n\n{date_line(NOW)}"
    assert "2026-11-24" in context.messages[0]["content"]
    # Today's history carries no marker: the date line already says which day it is.
    assert [m["content"] for m in context.messages[1:]] == ["hi", "hello", "what day is it?"]
    assert store.rows == snapshot


def test_history_carries_a_day_marker_where_the_day_changes():
    store = Store()
    store.add(
        dated(user("I fly to Lisbon tomorrow"), at(21)),
        dated(asst("Have a good trip"), at(21)),
        dated(user("Same day, one more thing"), at(21, 11)),
        dated(asst("Sure"), at(21, 11)),
        dated(user("Landed yesterday"), at(23)),
        dated(asst("Welcome"), at(23)),
        dated(user("When did I fly?"), NOW),
    )
    context = build(make_engine(primary=ExtractiveSummarizer(COUNTER), store=InMemorySummaryStore()), store)
    contents = [m["content"] for m in context.messages[1:]]
    assert contents == [
        "[2026-11-21 Sat]\nI fly to Lisbon tomorrow",
        "Have a good trip",
        "Same day, one more thing",
        "Sure",
        "[2026-11-23 Mon]\nLanded yesterday",
        "Welcome",
        "When did I fly?",
    ]


def test_the_first_retained_turn_after_a_cut_carries_its_day_within_the_target():
    store = Store()
    for turn in range(14):
        store.add(dated(user(f"Question {turn}: " + "lorem " * 40), at(20)), dated(asst("ipsum " * 40), at(20)))
    store.add(dated(user("final question"), NOW))
    context = build(make_engine(primary=ExtractiveSummarizer(COUNTER), store=InMemorySummaryStore()), store)
    assert any(event.kind == "compression" for event in context.events)
    history = [m for m, s in zip(context.messages, context.sources, strict=True) if s["kind"] == "history"]
    assert history and history[0]["content"].startswith("[2026-11-20 Fri]\nQuestion")
    assert sum("[2026-11-20" in m["content"] for m in history) == 1
    assert context.tokens <= context.target_tokens


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    messages=conversation(),
    window=st.sampled_from([256, 512, 1024, 2048]),
    mode=st.sampled_from(["agent", "quick-answer"]),
    summary_role=st.sampled_from(["system", "user"]),
    strict=st.booleans(),
    gaps=st.lists(st.sampled_from([0, 0, 1, 3]), min_size=12, max_size=12),
    script=st.lists(st.sampled_from(["ok", "ok", "fail"]), min_size=1, max_size=4),
)
def test_dated_requests_keep_the_invariants_and_mark_every_new_day(
    messages, window, mode, summary_role, strict, gaps, script
):
    """I1-I9 hold with the date line and markers counted; each history turn on another day than the message before it,
    and the window's first turn when not today, leads with its marker; the current turn never does."""
    key = f"timeline-property-{next(_keys)}"
    engine = make_engine(
        window,
        FlakySummarizer(script),
        attempts=1,
        summary_role=summary_role,
        strict_alternation=strict,
        store=InMemorySummaryStore(),
    )
    store = Store()
    when, turn = at(1), 0
    for message in messages:
        if message["role"] == "user":
            when += timedelta(days=gaps[turn % len(gaps)], minutes=5)
            turn += 1
        if message["role"] == "assistant" and store.rows:
            now = when + timedelta(days=gaps[turn % len(gaps)])
            request = ContextRequest(
                memory_key=key, system_prompt=SYSTEM, load_increment=store.load_increment, mode=mode, now=now
            )
            context = async_to_sync(engine.build_context)(request)
            check_context(
                context,
                stored=store.rows,
                system_prompt=f"{SYSTEM}\n\n{date_line(now)}",
                counter=COUNTER,
                dropped_ids=dropped_wire_ids(store.rows) - set(range(1, (context.summary.last_message_id or 0) + 1)),
                single_system=summary_role == "user",
                strict_alternation=strict,
            )
            _check_markers(context, store.rows, now)
        store.add(dated(copy.deepcopy(message), when))


def _check_markers(context, rows, now):
    by_id = {row["id"]: row for row in rows}
    first = True
    for message, source in zip(context.messages, context.sources, strict=True):
        if source["kind"] != "history" or source.get("merged") or by_id[source["id"]]["role"] != "user":
            continue
        day = by_id[source["id"]]["created_at"].date()
        before = by_id.get(source["id"] - 1)
        changed = before is not None and before["created_at"].date() != day
        # A day change marks a turn wherever it lies; the window's first turn also when it is not today.
        if changed or (first and day != now.date()):
            assert message["content"].startswith(day_marker(day)), (message, first)
        else:
            assert not message["content"].startswith("[20"), (message, first)
        first = False
