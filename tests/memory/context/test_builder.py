"""The engine over the database: compression, write-back, degradation, concurrency
(docs/memory.md §2-§4; docs/memory.md F-07, F-08, F-10 .. F-17, F-23, F-24, F-26)."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync

from memory.context.builder import AgentMemoryMiddleware
from memory.context.request import ContextRequest
from memory.models import CompressionEvent, SessionSummary
from memory.storage import summaries as services
from memory.summary.archive import RAW_ARCHIVE_MARKER
from memory.summary.extractive import ExtractiveSummarizer
from tests.memory.builders import COUNTER, ScriptedSummarizer, Store, asst, tool, user
from tests.memory.conftest import make_engine
from tests.memory.invariants import check_context

pytestmark = pytest.mark.django_db
SYSTEM = "You are a helpful assistant."


def build(engine, store, key, *, mode="quick-answer", tools=None, system=SYSTEM):
    context = async_to_sync(engine.build_context)(
        ContextRequest(
            memory_key=key, system_prompt=system, load_increment=store.load_increment, mode=mode, tools=tools
        )
    )
    check_context(context, stored=store.rows, system_prompt=system, counter=COUNTER, tools=tools)
    return context


def chat(store, turns: int, words: int = 40, start: int = 0):
    for i in range(start, start + turns):
        store.add(user(f"Question {i}: " + "lorem " * words), asst(f"Answer {i}: " + "ipsum " * words))


def test_under_the_trigger_nothing_is_summarized(memory_key):
    store = Store()
    store.add(user("hi"), asst("hello"), user("how are you?"))
    summarizer = ScriptedSummarizer()
    context = build(make_engine(primary=summarizer), store, memory_key)
    assert context.events == [] and summarizer.requests == []
    assert [m["content"] for m in context.messages[1:]] == ["hi", "hello", "how are you?"]
    assert not SessionSummary.objects.filter(memory_key=memory_key).exists()


def test_compression_writes_summary_boundary_and_event(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("final question"))
    context = build(
        make_engine(primary=ScriptedSummarizer(default="Summary: questions 0 to 9 asked.")), store, memory_key
    )
    row = SessionSummary.objects.get(memory_key=memory_key)
    assert row.summary_type == "llm" and row.content == "Summary: questions 0 to 9 asked." and row.version == 1
    assert row.compressed_count == row.last_message_id  # ids start at 1, every message up to the boundary
    event = CompressionEvent.objects.get(memory_key=memory_key)
    assert event.kind == "compression" and event.tokens_before > event.tokens_after
    assert event.boundary_before is None and event.boundary_after == row.last_message_id
    assert context.messages[1]["content"].startswith(
        f"[Memory Summary - {row.compressed_count} earlier messages consolidated]"
    )
    assert context.tokens <= context.target_tokens


def test_f08_newest_user_message_is_never_summarized(memory_key):
    store = Store()
    store.add(user("Hello"), asst("Bye"), user("and now?"))
    context = build(make_engine(window=64, summary_max_tokens=32), store, memory_key)
    assert context.messages[-1] == {"role": "user", "content": "and now?"}
    assert context.sources[-1] == {"id": 3, "kind": "current"}


def test_f10_summary_role_user_leaves_one_leading_system_message(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("go on"))
    context = build(make_engine(summary_role="user", primary=ScriptedSummarizer(default="facts")), store, memory_key)
    roles = [m["role"] for m in context.messages]
    assert roles.count("system") == 1 and roles[0] == "system"
    assert context.messages[1]["role"] == "user" and context.messages[1]["content"].startswith("[Memory Summary")


def test_f11_summarizer_request_is_valid_for_strict_providers(memory_key):
    store = Store()
    store.add(user("look it up"), asst(None, tc=["c1"]), tool("c1", "found " * 200))
    chat(store, 10)
    store.add(user("next"))
    summarizer = ScriptedSummarizer(default="facts")
    build(make_engine(primary=summarizer), store, memory_key)
    prompt = summarizer.requests[0].prompt
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert all(set(m) == {"role", "content"} for m in prompt)
    assert "- Tool[kb_search]: found" in prompt[1]["content"]
    assert "- Assistant [tools: kb_search]:" in prompt[1]["content"]  # F-25: content null


def test_f12_f14_merge_not_stack_and_first_prompt_has_no_previous_section(memory_key):
    store = Store()
    summarizer = ExtractiveSummarizer()
    engine = make_engine(window=1024, primary=summarizer)
    requests = []
    original = engine.chain.primary.summarize

    async def spy(request):
        requests.append(request)
        return await original(request)

    engine.chain.primary.summarize = spy  # type: ignore[method-assign]  # a spy around the scripted summarizer
    for round_ in range(10):
        chat(store, 4, start=round_ * 4)
        store.add(user(f"round {round_}"))
        build(engine, store, memory_key)
    assert "<previous_summary>" not in requests[0].prompt[1]["content"]
    assert "<previous_summary>" in requests[-1].prompt[1]["content"]
    row = SessionSummary.objects.get(memory_key=memory_key)
    assert row.version == CompressionEvent.objects.filter(memory_key=memory_key, kind="compression").count() >= 9
    for marker in ("<previous_summary>", "[Memory Summary", "Previous summary"):
        assert marker not in row.content
    assert COUNTER.count_text(row.content) <= engine.summary_cap


def test_i7_first_facts_survive_many_compressions(memory_key):
    store = Store()
    engine = make_engine(window=1024, primary=ExtractiveSummarizer())
    store.add(user("My reservation is RES-7Q2X9 and my user id is ada_1815."), asst("Noted."))
    for round_ in range(15):
        chat(store, 3, words=30, start=round_ * 3)
        store.add(user(f"round {round_}"))
        build(engine, store, memory_key)
    content = SessionSummary.objects.get(memory_key=memory_key).content
    assert "RES-7Q2X9" in content and "ada_1815" in content


def test_f13_coverage_after_degraded_compression_and_when_nothing_is_kept(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    failing = ScriptedSummarizer(default=RuntimeError("down"))
    build(make_engine(primary=failing), store, memory_key)  # check_context asserts I4
    store.add(asst("a"), user("huge " * 700))
    context = build(make_engine(primary=failing), store, memory_key)
    assert context.sections["retained"] == 0


def test_f15_the_increment_is_everything_after_the_boundary(memory_key):
    store = Store()
    chat(store, 150, words=5)
    store.add(user("q"))
    calls = []

    async def loader(boundary):
        calls.append(boundary)
        return await store.load_increment(boundary)

    engine = make_engine(window=4096, primary=ScriptedSummarizer(default="facts"))
    context = async_to_sync(engine.build_context)(
        ContextRequest(memory_key=memory_key, system_prompt=SYSTEM, load_increment=loader, mode="quick-answer")
    )
    check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)
    assert calls == [None]
    store.add(asst("a"), user("again"))
    calls.clear()
    context = async_to_sync(engine.build_context)(
        ContextRequest(memory_key=memory_key, system_prompt=SYSTEM, load_increment=loader, mode="quick-answer")
    )
    assert calls == [SessionSummary.objects.get(memory_key=memory_key).last_message_id]


def test_f16_giant_current_message_does_not_loop(memory_key):
    store = Store()
    chat(store, 2)
    store.add(user("giant " * 3000))
    summarizer = ScriptedSummarizer(default="facts")
    engine = make_engine(window=2048, primary=summarizer)
    build(engine, store, memory_key)
    first_requests = len(summarizer.requests)
    context = build(engine, store, memory_key)
    assert len(summarizer.requests) == first_requests, "the same prefix was summarized again"
    kinds = [event.kind for event in context.events]
    assert "no_progress" in kinds and "overflow" in kinds and context.overflow
    no_progress = next(e for e in context.events if e.kind == "no_progress")
    assert any("nothing left to summarize" in note for note in no_progress.notes if isinstance(note, str))
    assert context.messages[-1]["content"] == "giant " * 3000


def test_f17_summarizer_input_is_chunked_to_its_window(memory_key):
    store = Store()
    for i in range(40):
        store.add(user(f"fact {i}: " + "data " * 120), asst(f"ok {i}"))
    store.add(user("q"))
    summarizer = ScriptedSummarizer(default="merged facts")
    build(make_engine(window=8192, summarizer_context_window=1024, primary=summarizer), store, memory_key)
    assert len(summarizer.requests) > 1
    for request in summarizer.requests:
        assert COUNTER.count_request(request.prompt) + request.max_tokens <= 1024


def test_f07_oversized_tool_result_in_the_current_turn_is_elided(memory_key):
    store = Store()
    store.add(user("what does the big document say?"), asst(None, tc=["search"]), tool("search", "token " * 20_000))
    stored_before = store.snapshot()
    context = build(make_engine(window=16_000), store, memory_key, mode="agent")
    assert context.messages[1] == {"role": "user", "content": "what does the big document say?"}
    assert "tokens elided to fit the context window" in context.messages[-1]["content"]
    # Elided to the window minus the reply reserve (16,000 - 2,000), not down to the target.
    assert 14_000 - 10 <= context.tokens <= 14_000
    assert [e.kind for e in context.events] == ["no_progress", "overflow"] or "overflow" in [
        e.kind for e in context.events
    ]
    assert store.rows == stored_before


def test_f23_failing_summarizer_keeps_old_summary_and_records_attempts(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("q1"))
    build(make_engine(primary=ScriptedSummarizer(default="OLD SUMMARY: user likes tea.")), store, memory_key)
    chat(store, 12, start=100)
    store.add(user("q2"))
    for index, failure in enumerate((RuntimeError("HTTP 500 from provider"), "", "   \n", "sleep:1")):
        primary = ScriptedSummarizer(default=failure, model="primary-model")
        failover = ScriptedSummarizer(default=failure, model="failover-model")
        engine = make_engine(primary=primary, failover=failover, timeout=0.05)
        context = build(engine, store, memory_key)
        row = SessionSummary.objects.get(memory_key=memory_key)
        assert row.summary_type == "raw" and row.content.startswith("OLD SUMMARY: user likes tea.")
        assert "HTTP 500" not in row.content and "late summary" not in row.content
        event = next(e for e in context.events if e.kind == "compression")
        assert event.degraded and [(a["phase"], a["number"]) for a in event.attempts] == [
            ("primary", 1),
            ("primary", 2),
            ("primary", 3),
            ("failover", 1),
            ("failover", 2),
            ("failover", 3),
        ]
        assert all(not a["ok"] and a["error"] for a in event.attempts)
        chat(store, 12, start=200 + 20 * index)
        store.add(user("next"))


def test_primary_fails_three_times_then_failover_succeeds(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    primary = ScriptedSummarizer(default=ConnectionError("refused"), model="primary-model")
    failover = ScriptedSummarizer(default="from the failover", model="failover-model")
    context = build(make_engine(primary=primary, failover=failover), store, memory_key)
    event = context.events[0]
    assert [(a["model"], a["ok"]) for a in event.attempts] == [
        ("primary-model", False),
        ("primary-model", False),
        ("primary-model", False),
        ("failover-model", True),
    ]
    assert not event.degraded and event.result_type == "llm"
    assert SessionSummary.objects.get(memory_key=memory_key).content == "from the failover"


def test_first_time_failure_gives_the_archive_alone_and_a_later_success_folds_it(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    build(make_engine(primary=ScriptedSummarizer(default=RuntimeError("x"))), store, memory_key)
    row = SessionSummary.objects.get(memory_key=memory_key)
    assert row.summary_type == "raw" and row.content.startswith(RAW_ARCHIVE_MARKER)
    assert COUNTER.count_text(row.content) <= make_engine().summary_cap
    omitted = int(row.content.split("- [", 1)[1].split(" ", 1)[0])
    assert omitted + row.content.count("\n- User:") + row.content.count("\n- Assistant:") == row.compressed_count
    chat(store, 12, start=50)
    store.add(user("q again"))
    summarizer = ScriptedSummarizer(default="clean merged summary")
    context = build(make_engine(primary=summarizer), store, memory_key)
    assert RAW_ARCHIVE_MARKER in summarizer.requests[0].previous_summary
    row = SessionSummary.objects.get(memory_key=memory_key)
    assert row.summary_type == "llm" and row.content == "clean merged summary"
    assert (
        context.messages[1]["content"].startswith("[Memory Summary")
        and "consolidated" in context.messages[1]["content"]
    )


def test_timeout_really_fires(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    engine = make_engine(primary=ScriptedSummarizer(default="sleep:30"), attempts=1, timeout=0.1)
    context = build(engine, store, memory_key)
    attempt = context.events[0].attempts[0]
    assert attempt["error"].startswith("TimeoutError") and 80 <= attempt["latency_ms"] < 5000


def test_f24_cancellation_midway_leaves_the_session_as_it_was(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    engine = make_engine(primary=ScriptedSummarizer(default="sleep:30"), timeout=60)

    async def cancel_midway():
        task = asyncio.ensure_future(
            engine.build_context(
                ContextRequest(
                    memory_key=memory_key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent"
                )
            )
        )
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async_to_sync(cancel_midway)()
    assert not SessionSummary.objects.filter(memory_key=memory_key).exists()
    assert not CompressionEvent.objects.filter(memory_key=memory_key).exists()


def test_agent_middleware_degrades_when_the_engine_fails(memory_key, monkeypatch):
    store = Store()
    chat(store, 12)
    store.add(user("q"))

    def broken_save(**kwargs):
        raise RuntimeError("database hiccup")

    monkeypatch.setattr(services, "session_summary_save", broken_save)
    engine = make_engine(primary=ScriptedSummarizer(default="facts"))
    request = ContextRequest(
        memory_key=memory_key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent"
    )
    context = async_to_sync(AgentMemoryMiddleware(engine).before_model)(request)
    assert context.summary.summary_type == "raw" and RAW_ARCHIVE_MARKER in context.messages[1]["content"]
    assert context.messages[-1] == {"role": "user", "content": "q"} and context.tokens <= context.target_tokens
    assert not SessionSummary.objects.filter(memory_key=memory_key).exists()


def test_agent_mode_notes_when_the_budget_beats_preserve_turns(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    context = build(make_engine(primary=ScriptedSummarizer(default="facts")), store, memory_key, mode="agent")
    notes = context.events[0].notes
    assert any("preserve_turns=5" in note for note in notes)


def test_f26_racing_compressions_end_with_one_consistent_boundary(memory_key):
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    slow = ScriptedSummarizer(["sleep:0.3"], default="late")
    fast = ScriptedSummarizer(default="fast summary")

    async def race():
        return await asyncio.gather(
            make_engine(primary=slow, timeout=5).build_context(
                ContextRequest(
                    memory_key=memory_key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent"
                )
            ),
            make_engine(primary=fast).build_context(
                ContextRequest(
                    memory_key=memory_key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent"
                )
            ),
        )

    first, second = async_to_sync(race)()
    row = SessionSummary.objects.get(memory_key=memory_key)
    kinds = sorted(e["kind"] for e in CompressionEvent.objects.filter(memory_key=memory_key).values("kind"))
    assert "superseded" in kinds
    assert row.version == kinds.count("compression")
    for context in (first, second):
        check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)
        assert context.summary.last_message_id == row.last_message_id or context.summary.version < row.version


def test_a_turn_in_flight_is_never_summarized_by_a_concurrent_turn(memory_key):
    store = Store()
    chat(store, 12)
    in_flight = store.add(user("the other tab's question, still being answered"))[0]
    store.add(user("this tab's question"))
    summarizer = ScriptedSummarizer(default="facts")
    context = async_to_sync(make_engine(primary=summarizer).build_context)(
        ContextRequest(
            memory_key=memory_key,
            system_prompt=SYSTEM,
            load_increment=store.load_increment,
            mode="agent",
            summarize_below=in_flight["id"],
        )
    )
    check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)
    assert context.summary.last_message_id < in_flight["id"]
    assert {"id": in_flight["id"], "kind": "history"} in context.sources


def test_a_memory_job_never_folds_a_turn_in_flight_even_one_too_large_for_the_window(memory_key):
    # A newcomer's 3,000-token paste: the job ran while its turn waited, folded the question into
    # the summary, and the turn's own request then had no current turn to answer.
    store = Store()
    chat(store, 12)
    in_flight = store.add(user("paste " * 3000))[0]
    engine = make_engine(primary=ScriptedSummarizer(default="facts"))
    request = ContextRequest(
        memory_key=memory_key,
        system_prompt=SYSTEM,
        load_increment=store.load_increment,
        mode="agent",
        summarize_below=in_flight["id"],
        origin="job",
    )
    context = async_to_sync(engine.precompress)(request, next_message_tokens=200)
    assert context is not None, "the history before the turn in flight was over the trigger"
    assert 0 < (context.summary.last_message_id or 0) < in_flight["id"]
    assert (services.session_summary_get(memory_key=memory_key).last_message_id or 0) < in_flight["id"]
    # The turn's own request still has its question, verbatim or elided, never summarized.
    turn = async_to_sync(engine.build_context)(
        ContextRequest(memory_key=memory_key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent")
    )
    assert {"id": in_flight["id"], "kind": "current"} in turn.sources


def test_compress_now_folds_all_history_before_the_current_turn(memory_key):
    store = Store()
    store.add(user("hi"), asst("hello"), user("latest"))
    context = async_to_sync(make_engine(primary=ScriptedSummarizer(default="greetings exchanged")).build_context)(
        ContextRequest(
            memory_key=memory_key,
            system_prompt=SYSTEM,
            load_increment=store.load_increment,
            mode="quick-answer",
            force=True,
        )
    )
    check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)
    assert context.summary.last_message_id == 2 and [s["kind"] for s in context.sources] == [
        "system",
        "summary",
        "current",
    ]
    assert any("requested by the user" in note for note in context.events[0].notes)


@pytest.mark.parametrize(
    ("primary", "failover", "status"),
    [
        (["ok"], None, "ok"),
        ([RuntimeError("a"), "ok"], None, "retrying"),
        ([RuntimeError("a")] * 3, ["ok"], "failover"),
        ([RuntimeError("a")] * 3, [RuntimeError("b")] * 3, "raw_archive"),
    ],
)
def test_summarizer_health(memory_key, primary, failover, status):
    assert services.summarizer_health_get(memory_key=memory_key)["status"] == "idle"
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    engine = make_engine(
        primary=ScriptedSummarizer(primary), failover=ScriptedSummarizer(failover) if failover else None
    )
    build(engine, store, memory_key)
    health = services.summarizer_health_get(memory_key=memory_key)
    assert health["status"] == status
    assert (health["last_error"] != "") == (status != "ok")


def test_losing_every_compare_and_set_round_degrades_without_writing(memory_key, monkeypatch):
    store = Store()
    chat(store, 12)
    store.add(user("q"))
    monkeypatch.setattr(services, "session_summary_save", lambda **kwargs: False)
    context = build(make_engine(primary=ScriptedSummarizer(default="facts")), store, memory_key)
    assert [e.kind for e in context.events] == ["superseded"] * 3
    assert context.summary.summary_type == "raw" and context.tokens <= context.target_tokens
    assert any("won the race" in note for note in context.repairs)
    assert not SessionSummary.objects.filter(memory_key=memory_key).exists()


@pytest.mark.parametrize(("summary_role", "notice_role"), [("system", "system"), ("user", "user")])
def test_f09_f10_a_later_system_message_is_history(memory_key, summary_role, notice_role):
    store = Store()
    chat(store, 12)
    store.add({"role": "system", "content": "Notice: maintenance tonight."}, user("q"))
    context = build(
        make_engine(summary_role=summary_role, primary=ScriptedSummarizer(default="facts")), store, memory_key
    )
    assert context.messages[0] == {"role": "system", "content": SYSTEM}
    notice = next(m for m in context.messages if "maintenance" in (m["content"] or ""))
    assert notice["role"] == notice_role
    if summary_role == "user":
        assert [m["role"] for m in context.messages].count("system") == 1
        assert notice["content"] == "[System message] Notice: maintenance tonight."


def test_a_pin_that_would_overflow_the_window_yields(memory_key):
    store = Store()
    first = store.add(user("an old question of a turn that looks in flight"))[0]
    chat(store, 40)
    store.add(user("now"))
    context = async_to_sync(make_engine(primary=ScriptedSummarizer(default="facts")).build_context)(
        ContextRequest(
            memory_key=memory_key,
            system_prompt=SYSTEM,
            load_increment=store.load_increment,
            mode="agent",
            summarize_below=first["id"],
        )
    )
    check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)
    assert context.tokens <= context.target_tokens and not context.overflow
    assert any("would overflow the context window" in note for note in context.events[0].notes)


def test_compress_now_with_nothing_left_says_so_plainly(memory_key):
    store = Store()
    store.add(user("only question"))
    context = async_to_sync(make_engine().build_context)(
        ContextRequest(
            memory_key=memory_key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent", force=True
        )
    )
    notes = context.events[0].notes
    assert context.events[0].kind == "no_progress"
    assert any("nothing to compress" in note for note in notes)
    assert not any("over the trigger" in note or "preserve_turns" in note for note in notes)
