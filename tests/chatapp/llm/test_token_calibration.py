"""Token-estimate calibration against the provider's ``usage.prompt_tokens`` (docs/memory.md §5,
"Calibration"), through real chat turns against the fake OpenAI server: a provider counting 20 %
more or 20 % less than our estimate, one that sends no usage, one that refuses
``stream_options``, and the offline engine, which is never calibrated nor compared."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.conversation.compress import session_memory_compress
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ModelCall
from chatapp.ui.inspector.state import inspector_state_get
from memory.models import TokenCalibration
from tests.chatapp.conftest import Visitor, chat_session_make, message_make
from tests.chatapp.test_settings import settings_load
from tests.fake_openai import FakeOpenAI, chunk, error, request_estimate, stream, text_stream

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "db_connections_closed"),
]

# One user message of this text makes every request larger than the smallest sample (256 tokens).
LONG_QUESTION = "Please consider the following notes carefully. " + "The harbour lights were green tonight. " * 40
NO_USAGE_STREAM = stream(chunk({"role": "assistant", "content": "Sure."}), chunk({}, finish_reason="stop"))


@pytest.fixture
def fake_chat(fake_openai: FakeOpenAI, settings: Any) -> FakeOpenAI:
    """The chat model is the fake server with a roomy window (nothing compresses); the
    summarizer stays the offline engine."""
    settings.LLM_CHAT_BASE_URL = fake_openai.base_url
    settings.LLM_CHAT_MODEL = "fake-model"
    settings.LLM_CHAT_CONTEXT_WINDOW = 32_000
    settings.LLM_TOKEN_CALIBRATION = True
    fake_openai.script(text_stream("Noted."))
    return fake_openai


async def turns_run(visitor: Visitor, count: int) -> ChatSession:
    """A quick-answer chat of ``count`` turns, each asking :data:`LONG_QUESTION`."""
    session = await sync_to_async(chat_session_make)(visitor.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    for _ in range(count):
        question = await sync_to_async(message_make)(session, "user", LONG_QUESTION)
        reply = await chat_turn_run(session_id=session.pk, user_message_id=question.pk)
        assert reply.status == Message.Status.COMPLETE
    return session


def stored_factor() -> float:
    return TokenCalibration.objects.get(model="fake-model").factor


async def test_usage_20_percent_above_converges_to_1_2_is_stored_and_reused_by_a_new_engine(alice, fake_chat):
    fake_chat.usage_scale = 1.2

    session = await turns_run(alice, 8)

    calls = [call async for call in ModelCall.objects.filter(session=session).order_by("id")]
    # The provider counted the exact request sent: our estimate of it is the engine's own figure.
    assert [request_estimate(r.json) for r in fake_chat.requests] == [call.estimated_tokens for call in calls]
    assert all(call.prompt_tokens == round(call.estimated_tokens * 1.2) for call in calls)
    row = await TokenCalibration.objects.aget(model="fake-model")
    assert row.samples == 8 and row.factor == pytest.approx(1.2, abs=0.01) and row.factor <= 1.2
    # Each turn was budgeted with the factor learnt so far: the window shrinks in our tokens.
    factors = [call.context["calibration"]["factor"] for call in calls]
    assert factors[0] == 1.0 and factors == sorted(factors) and factors[-1] > 1.15
    assert calls[-1].context["calibration"]["window_tokens"] == int(32_000 / factors[-1])
    assert calls[-1].context["trigger_tokens"] == int(int(32_000 / factors[-1]) * 0.5)

    engine = memory_engine()
    engine.use_token_factor(await sync_to_async(engine.token_factor)())
    assert engine.budget.token_factor == row.factor
    assert engine.budget.window_tokens == int(32_000 / row.factor)


async def test_usage_20_percent_below_converges_to_0_8_and_gives_more_room(alice, fake_chat):
    fake_chat.usage_scale = 0.8

    session = await turns_run(alice, 25)

    factor = await sync_to_async(stored_factor)()
    assert factor == pytest.approx(0.8, abs=0.01) and factor >= 0.8
    last = await ModelCall.objects.filter(session=session).alatest("id")
    assert last.context["calibration"]["window_tokens"] > 32_000
    assert last.context["target_tokens"] > int(32_000 * 0.5 * 0.6)


async def test_a_provider_that_sends_no_usage_leaves_the_factor_at_1(alice, fake_chat):
    fake_chat.script(NO_USAGE_STREAM)

    session = await turns_run(alice, 3)

    assert not await TokenCalibration.objects.aexists()
    calls = [call async for call in ModelCall.objects.filter(session=session)]
    assert [call.prompt_tokens for call in calls] == [None] * 3
    assert {call.context["calibration"]["factor"] for call in calls} == {1.0}
    assert all("stream_options" in request.json for request in fake_chat.requests)  # still asked for


async def test_an_endpoint_refusing_stream_options_is_asked_again_without_it_and_remembered(alice, fake_chat):
    fake_chat.reject_stream_options = True
    fake_chat.script(NO_USAGE_STREAM)

    await turns_run(alice, 2)

    asked = ["stream_options" in request.json for request in fake_chat.requests]
    assert asked == [True, False, False]  # refused once, retried without, never asked again
    assert not await TokenCalibration.objects.aexists()


async def test_a_call_without_usage_records_why_calibration_learnt_nothing(alice, fake_chat):
    fake_chat.llama_cpp()  # accepts stream_options, sends no usage chunk
    await turns_run(alice, 1)
    fake_chat.reject_stream_options = True
    await turns_run(alice, 2)

    calls = [call async for call in ModelCall.objects.order_by("id")]
    assert [call.context["calibration"].get("usage") for call in calls] == ["not reported", "not asked", "not asked"]
    assert [call.prompt_tokens for call in calls] == [None] * 3
    assert {call.context["calibration"]["factor"] for call in calls} == {1.0}
    assert not await TokenCalibration.objects.aexists()


async def test_a_request_refused_for_another_reason_fails_once_retried_and_is_not_remembered(alice, fake_chat):
    fake_chat.script(error(400, "This model's maximum context length is 32000 tokens."))
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    question = await sync_to_async(message_make)(session, "user", "Hello?")

    reply = await chat_turn_run(session_id=session.pk, user_message_id=question.pk)

    assert reply.status == Message.Status.ERROR and "maximum context length" in (reply.content or "")
    fake_chat.script(text_stream("Hi."))
    again = await sync_to_async(message_make)(session, "user", "Hello again?")
    assert (await chat_turn_run(session_id=session.pk, user_message_id=again.pk)).status == Message.Status.COMPLETE
    asked = ["stream_options" in request.json for request in fake_chat.requests]
    assert asked == [True, False, True]  # the retry failed too: the option is still asked for


async def test_calibration_switched_off_applies_and_stores_nothing(alice, fake_chat, settings):
    settings.LLM_TOKEN_CALIBRATION = False
    fake_chat.usage_scale = 1.2

    session = await turns_run(alice, 3)

    assert not await TokenCalibration.objects.aexists()
    last = await ModelCall.objects.filter(session=session).alatest("id")
    assert last.prompt_tokens == round(last.estimated_tokens * 1.2)  # still recorded and shown
    assert last.context["calibration"] == {"factor": 1.0, "window_tokens": 32_000, "enabled": False, "offline": False}


async def test_pre_compression_and_compress_now_plan_with_the_stored_factor(alice, fake_chat, settings):
    settings.MEMORY_COMPRESSION = "background"
    await sync_to_async(TokenCalibration.objects.create)(model="fake-model", factor=1.5, samples=9)
    session = await turns_run(alice, 1)
    memory_key_of(session.pk)

    planned = await memory_engine().builder()  # what the memory job's pre-compression plans with
    events = await session_memory_compress(session_id=session.pk)

    assert planned.budget.token_factor == 1.5
    assert planned.budget.trigger_tokens == int(int(32_000 / 1.5) * 0.5)
    assert events and events[0].trigger_tokens == int(int(32_000 / 1.5) * 0.5)
    call = await ModelCall.objects.filter(session=session).alatest("id")
    assert call.context["calibration"]["factor"] == 1.5  # the turn itself, too


# --- the inspector ------------------------------------------------------------------------------


async def test_the_inspector_shows_estimate_provider_figure_and_factor(alice, fake_chat):
    fake_chat.usage_scale = 1.2
    session = await turns_run(alice, 2)
    last = await ModelCall.objects.filter(session=session).alatest("id")

    state = await sync_to_async(inspector_state_get)(session_id=session.pk)
    page = (await sync_to_async(alice.client.get)(f"/s/{session.pk}/")).content.decode()

    assert state.request is not None
    check = state.request.estimate_check
    assert check is not None and check.shown and check.factor == pytest.approx(1.1, abs=0.001)  # from call 1
    assert check.factor == last.context["calibration"]["factor"]
    assert (check.estimated_tokens, check.prompt_tokens) == (last.estimated_tokens, last.prompt_tokens)
    assert check.ratio == pytest.approx(1.2, abs=0.01)
    assert state.request.gauge.context_window == check.window_tokens == int(32_000 / check.factor)
    assert 'data-testid="estimate-check"' in page and 'data-testid="calibration-factor">×1.10<' in page
    assert f'data-testid="provider-tokens">{last.prompt_tokens:,}<' in page


async def test_the_offline_engine_is_neither_calibrated_nor_compared(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    question = await sync_to_async(message_make)(session, "user", LONG_QUESTION)
    await chat_turn_run(session_id=session.pk, user_message_id=question.pk)
    call = await ModelCall.objects.filter(session=session).alatest("id")

    state = await sync_to_async(inspector_state_get)(session_id=session.pk)
    page = (await sync_to_async(alice.client.get)(f"/s/{session.pk}/")).content.decode()

    # The offline engine reports usage counted with our own tokenizer: equal, so nothing to learn.
    assert call.prompt_tokens == call.estimated_tokens and call.context["calibration"]["offline"] is True
    assert not await TokenCalibration.objects.aexists()
    assert state.request is not None and state.request.estimate_check is not None
    assert not state.request.estimate_check.shown
    assert 'data-testid="estimate-check"' not in page


# --- the setting --------------------------------------------------------------------------------


def test_the_calibration_setting_is_parsed_strictly(monkeypatch):
    monkeypatch.delenv("LLM_TOKEN_CALIBRATION", raising=False)
    assert settings_load(monkeypatch)["LLM_TOKEN_CALIBRATION"] is True
    assert settings_load(monkeypatch, LLM_TOKEN_CALIBRATION="false")["LLM_TOKEN_CALIBRATION"] is False
    with pytest.raises(ImproperlyConfigured, match="LLM_TOKEN_CALIBRATION must be a boolean"):
        settings_load(monkeypatch, LLM_TOKEN_CALIBRATION="sometimes")
