"""LLM key-fact extraction in the memory job (docs/memory.md §11), end to end on real sessions
with the offline engine: digit-free facts are extracted (F-32), a corrected address supersedes
the old one and leaves other slots alone (F-28), CJK values are copied verbatim, and a failed,
empty or unparsable extraction changes nothing and keeps the watermark, so a later job picks
the same messages up (F-29)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.chats import memory as chat_memory
from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.conversation.runner import chat_turn_run
from chatapp.llm.offline.transport import OFFLINE_MODEL
from chatapp.models import ChatSession, Message
from chatapp.realtime.protocol import MemoryFactsEvent
from memory.api import KeyFact, SummaryReply, SummaryRequest, get_counter
from memory.jobs.runner import MemoryJobRunner
from memory.jobs.steps import FactExtraction
from memory.storage.facts import key_fact_list, key_fact_list_active
from memory.storage.job_state import OrmJobStore, memory_job_state_get
from memory.summary.chain import SummarizerChain
from tests.chatapp.conftest import chat_session_make, message_make
from tests.fake_openai import completion, error

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "db_connections_closed"),
]
EXTRACTOR = f"llm:{OFFLINE_MODEL}"


@pytest.fixture(autouse=True)
def one_attempt(settings: Any) -> None:
    """One summarizer attempt per layer, so a failing chain fails without backoff pauses."""
    settings.MEMORY_SUMMARY_ATTEMPTS = 1


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, Any]]:
    """The events the memory job broadcast to sessions, recorded instead of sent."""
    events: list[tuple[int, Any]] = []

    async def record(session_id: int, event: Any) -> None:
        events.append((session_id, event))

    monkeypatch.setattr(chat_memory, "event_broadcast", record)
    return events


async def say(session: ChatSession, *texts: str) -> int:
    """Store a user message and a short reply per text; the id of the last message."""
    last = 0
    for text in texts:
        user = await sync_to_async(message_make)(session, "user", text)
        reply = await sync_to_async(message_make)(session, "assistant", "Noted.", reply_to=user)
        last = reply.pk
    return last


async def facts_of(session: ChatSession, *, active: bool = False) -> list[KeyFact]:
    select = key_fact_list_active if active else key_fact_list
    return await sync_to_async(select)(memory_key=str(session.pk))


async def watermark(session: ChatSession) -> int | None:
    state = await sync_to_async(memory_job_state_get)(memory_key=str(session.pk))
    return state.watermarks.get(FactExtraction.name)


def slots(facts: list[KeyFact]) -> set[tuple[str, str]]:
    return {(fact.key, fact.value) for fact in facts}


@pytest.fixture
async def session(alice: Any) -> ChatSession:
    return await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)


async def test_f32_digit_free_facts_are_extracted_by_the_offline_engine_and_told_to_the_sockets(session, told):
    last = await say(
        session, "Hi! I'm allergic to penicillin.", "My dog is called Biscuit, and I love green tea.", "thanks"
    )

    await memory_engine().run_jobs(memory_key_of(session.pk))

    facts = await facts_of(session)
    assert {("allergy", "penicillin"), ("pet_name", "Biscuit"), ("likes", "green tea")} <= slots(facts)
    assert {fact.extractor for fact in facts} == {EXTRACTOR}
    first_user = (
        await Message.objects.filter(session=session, role="user").order_by("id").values_list("id", flat=True).afirst()
    )
    allergy = next(fact for fact in facts if fact.key == "allergy")
    assert allergy.source_message_id == first_user and allergy.valid_from is not None
    assert await watermark(session) == last
    (event,) = [event for _, event in told if isinstance(event, MemoryFactsEvent)]
    assert [fact["value"] for fact in event.facts] == [fact.value for fact in facts]

    # Nothing new since the watermark: the next job has nothing to extract and tells nothing.
    told.clear()
    assert not await extraction().due(str(session.pk))
    await memory_engine().run_jobs(memory_key_of(session.pk))
    assert not [event for _, event in told if isinstance(event, MemoryFactsEvent)]


async def test_f28_a_new_address_supersedes_the_old_one_and_leaves_other_slots_alone(session):
    await say(session, "I live at 12 Elm Road. I'm allergic to penicillin.")
    await memory_engine().run_jobs(memory_key_of(session.pk))
    old = next(fact for fact in await facts_of(session) if fact.value == "12 Elm Road")
    assert old.key == "home_address" and old.kind == "address"

    await say(session, "we moved; the new address is 48 Birch Lane")
    await memory_engine().run_jobs(memory_key_of(session.pk))

    facts = {fact.value: fact for fact in await facts_of(session)}
    new = facts["48 Birch Lane"]
    assert (new.key, new.extractor, new.replaces) == ("home_address", EXTRACTOR, "12 Elm Road")
    kept = facts["12 Elm Road"]
    assert kept.invalidated_at is not None and kept.superseded_by == new.id, "superseded rows are kept"
    assert facts["penicillin"].active, "an unrelated slot is untouched"
    assert slots(await facts_of(session, active=True)) == {("home_address", "48 Birch Lane"), ("allergy", "penicillin")}


async def test_cjk_name_and_place_are_extracted_verbatim(session):
    await say(session, "我叫李明，我住在上海。我对花生过敏。")
    await memory_engine().run_jobs(memory_key_of(session.pk))
    assert {("name", "李明"), ("home_address", "上海"), ("allergy", "花生")} <= slots(await facts_of(session))


async def test_f29_a_failing_summarizer_changes_nothing_and_a_later_job_picks_the_messages_up(session, settings):
    last = await say(session, "I'm allergic to penicillin.")
    settings.OFFLINE_FAIL_SUMMARY = True

    await memory_engine().run_jobs(memory_key_of(session.pk))

    assert await facts_of(session) == []
    state = await sync_to_async(memory_job_state_get)(memory_key=str(session.pk))
    assert state.status == "failed" and FactExtraction.name not in state.watermarks
    assert "HTTP 500" in state.attempts[FactExtraction.name]["error"]

    settings.OFFLINE_FAIL_SUMMARY = False
    await memory_engine().run_jobs(memory_key_of(session.pk))
    assert slots(await facts_of(session)) == {("allergy", "penicillin")}
    assert await watermark(session) == last


@dataclass
class Scripted:
    """A summarizer answering each request with the next scripted reply (text or exception)."""

    replies: list[str | Exception]
    model: str = "scripted"
    requests: list[SummaryRequest] = field(default_factory=list)

    async def summarize(self, request: SummaryRequest) -> SummaryReply:
        self.requests.append(request)
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, Exception):
            raise reply
        return SummaryReply(text=reply, finish_reason="stop")


def extraction(summarizer: Any = None, *, max_batches: int | None = 3) -> FactExtraction:
    """The engine's extraction step as the live app builds it, with ``summarizer`` alone (one
    attempt) instead of the configured chain when given."""
    engine = memory_engine()
    chain = engine.chain if summarizer is None else SummarizerChain(primary=summarizer, attempts=1)
    return FactExtraction(
        chain=chain,
        source=engine.source,
        facts=engine.fact_store,
        jobs=engine.job_store,
        counter=get_counter(engine.config.summary_model),
        windows=engine.config.summarizer_windows,
        max_batches=max_batches,
        more=engine.schedule,
    )


def job_with(step: FactExtraction) -> MemoryJobRunner:
    return MemoryJobRunner(store=OrmJobStore(), steps=[step], owner="test", debounce_seconds=0)


GOOD = '{"facts": [{"kind": "preference", "key": "allergy", "value": "penicillin", "text": "allergy", "source": [1]}]}'


@pytest.mark.parametrize(
    ("reply", "error"),
    [("", "FactExtractionFailed"), ("no facts here, sorry", "ExtractionError"), ("{}", "ExtractionError")],
    ids=["empty", "garbage", "empty-object"],
)
async def test_f29_an_empty_or_unparsable_reply_changes_nothing_and_keeps_the_watermark(session, reply, error):
    await say(session, "I'm allergic to penicillin.")
    await memory_engine().run_jobs(memory_key_of(session.pk))  # the offline engine extracts the allergy
    before = await facts_of(session)
    mark = await watermark(session)
    await say(session, "we moved; the new address is 48 Birch Lane")

    summarizer = Scripted([reply])
    run = await job_with(extraction(summarizer)).run_now(str(session.pk))

    assert run is not None and not run.ok and error in run.attempts[0].error
    assert await facts_of(session) == before
    assert await watermark(session) == mark
    # The same messages again, now with a working summarizer.
    await memory_engine().run_jobs(memory_key_of(session.pk))
    assert ("address", "48 Birch Lane") in slots(await facts_of(session, active=True))


async def test_the_step_works_through_a_backlog_in_batches_and_keeps_what_a_later_batch_could_not_do(session):
    texts = [f"I'm allergic to thing{i}." for i in range(5)]
    await say(session, *texts)
    ids = [m async for m in Message.objects.filter(session=session).order_by("id").values_list("id", flat=True)]
    good = GOOD.replace("penicillin", "thing0")
    summarizer = Scripted([good, good, RuntimeError("down")])
    step = extraction(summarizer)
    step.batch_size = 4

    run = await job_with(step).run_now(str(session.pk))

    assert run is not None and run.ok
    assert [len(request.messages) for request in summarizer.requests] == [4, 4, 2]
    assert await watermark(session) == ids[7], "up to the last batch that succeeded"
    assert slots(await facts_of(session)) == {("allergy", "thing0")}
    assert step.last_rejected, "the second batch's item was not in its message 1"
    assert summarizer.requests[0].response_format is not None
    assert summarizer.requests[0].response_format["json_schema"]["strict"] is True


async def test_extraction_runs_in_sync_mode_and_leaves_app_rows_out(session, settings):
    settings.MEMORY_COMPRESSION = "sync"
    await sync_to_async(message_make)(session, "user", "My dog is called Biscuit.")
    await sync_to_async(message_make)(
        session, "assistant", "[My dog is called Rex]", origin=Message.Origin.APP, status=Message.Status.ERROR
    )
    summarizer = Scripted(['{"facts": []}'])
    step = extraction(summarizer)
    assert await step.due(str(session.pk))
    await job_with(step).run_now(str(session.pk))
    (request,) = summarizer.requests
    assert [m["content"] for m in request.messages] == ["My dog is called Biscuit."]


async def test_a_job_of_a_session_that_is_gone_extracts_nothing(session):
    await say(session, "I'm allergic to penicillin.")
    session_id = session.pk
    await session.adelete()
    assert not await extraction().due(str(session_id))
    run = await memory_engine().jobs().run_now(str(session_id))
    assert run is not None and run.idle, "nothing was due: no lease taken, nothing written"
    assert await sync_to_async(key_fact_list)(memory_key=str(session_id)) == []


async def test_every_stored_reply_schedules_the_job_batched(session):
    question = await sync_to_async(message_make)(session, "user", "My cat is named Tom. What is Wi-Fi?")
    await chat_turn_run(session_id=session.pk, user_message_id=question.pk)
    assert memory_engine().jobs().waits_for_idle(str(session.pk)), "extraction waits for the chat to go quiet"
    await memory_engine().run_jobs(memory_key_of(session.pk))
    assert ("pet_name", "Tom") in slots(await facts_of(session))


async def test_a_batch_whose_prompt_would_not_fit_the_summarizer_window_is_split(session, settings):
    settings.LLM_SUMMARY_CONTEXT_WINDOW = 1500
    last = await say(session, *[f"Note {i}: " + "the quick brown fox jumps over the lazy dog " * 10 for i in range(6)])
    summarizer = Scripted(['{"facts": []}'])
    step = extraction(summarizer)

    run = await job_with(step).run_now(str(session.pk))

    assert run is not None and run.ok
    sizes = [len(request.messages) for request in summarizer.requests]
    assert sum(sizes) == 12 and max(sizes) < 12, "every message once, in more than one request"
    counter = get_counter(settings.LLM_SUMMARY_MODEL)
    assert all(counter.count_request(r.prompt) + r.max_tokens <= 1500 for r in summarizer.requests)
    assert await watermark(session) == last


async def test_a_rejected_json_schema_is_remembered_across_runs_of_the_step(session, settings, fake_openai):
    settings.LLM_SUMMARY_BASE_URL = fake_openai.base_url
    settings.LLM_SUMMARY_MODEL = "fake-model"
    reply = '{"facts": [{"kind": "preference", "key": "allergy", "value": "penicillin", "source": [1]}]}'
    fake_openai.script(error(400, "json_schema is not supported"), completion(reply))
    step = extraction()
    await say(session, "I'm allergic to penicillin.")

    await job_with(step).run_now(str(session.pk))
    await say(session, "My dog is called Biscuit.")
    await job_with(step).run_now(str(session.pk))

    formats = [(recorded.json.get("response_format") or {}).get("type") for recorded in fake_openai.requests]
    assert formats == ["json_schema", "json_object", "json_object"]
    (fact,) = await facts_of(session)
    assert (fact.key, fact.value, fact.extractor) == ("allergy", "penicillin", "llm:fake-model")


@dataclass
class CutOffAbove:
    """A summarizer whose reply is cut off at the output cap when a request has more than
    ``most`` messages (too many facts for one reply)."""

    most: int
    model: str = "cut"
    sizes: list[int] = field(default_factory=list)

    async def summarize(self, request: SummaryRequest) -> SummaryReply:
        self.sizes.append(len(request.messages))
        if len(request.messages) > self.most:
            return SummaryReply(text='{"facts": [{"kind": "id", "key"', finish_reason="length")
        return SummaryReply(text='{"facts": []}', finish_reason="stop")


async def test_a_reply_cut_off_at_the_output_cap_makes_the_batch_smaller_instead_of_stalling(session):
    last = await say(session, *[f"note {i}" for i in range(5)])
    summarizer = CutOffAbove(most=3)
    step = extraction(summarizer, max_batches=None)

    run = await job_with(step).run_now(str(session.pk))

    assert run is not None and run.ok
    assert await watermark(session) == last
    assert summarizer.sizes[:3] == [10, 5, 2], "halved until the reply fits"
    assert sum(size for size in summarizer.sizes if size <= 3) == 10, "every message extracted once"


async def test_a_long_backlog_is_worked_off_a_few_batches_per_job_and_the_rest_is_queued(session, settings):
    settings.LLM_SUMMARY_CONTEXT_WINDOW = 1024  # room for few messages per extraction request
    last = await say(session, *[f"note {i}: " + "words " * 60 for i in range(12)])
    step = extraction(max_batches=2)

    run = await job_with(step).run_now(str(session.pk))

    assert run is not None and run.ok
    reached = await watermark(session)
    assert reached is not None and reached < last, "the run stopped after two batches"
    assert memory_engine().jobs().status(str(session.pk)) == "queued", "the rest was queued for the next job"
