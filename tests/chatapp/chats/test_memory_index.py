"""Indexing for recall in the memory job and ``manage.py memory_reindex`` (docs/memory.md §12):
the ``index`` step indexes every new message (tool results with their call, never the app's own
notes) and moves its watermark; the ``embed`` step embeds the items, and an embedder failure
stores no embedding, keeps its watermark and is recorded while the items stay searchable by full
text; a later run fills them. The command rebuilds the index idempotently; deleting a chat
deletes its items."""

from __future__ import annotations

import hashlib
import io
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.management import CommandError, call_command

from chatapp.chats import services as chat_services
from chatapp.chats.memory import chat_session_scope_key, memory_engine, memory_key_of
from chatapp.management.commands import memory_reindex
from chatapp.models import ChatSession, Message
from memory.jobs.runner import MemoryJobRunner
from memory.models import MemoryItem
from memory.recall.values import RecallInput
from memory.storage.index import recall_cache_clear
from memory.storage.job_state import OrmJobStore, memory_job_state_get
from memory.storage.search import recall_candidates
from tests.chatapp.conftest import chat_session_make, message_make, visitor_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "db_connections_closed"),
]


def hashed(text: str, dimension: int = 32) -> np.ndarray:
    vector = np.zeros(dimension, dtype=np.float32)
    for word in text.lower().split():
        vector[int(hashlib.sha1(word.encode()).hexdigest(), 16) % dimension] += 1.0
    return vector / (np.linalg.norm(vector) or 1.0)


class HashEmbedder:
    """A deterministic embedder; ``fail`` makes every call raise, as a dead endpoint would."""

    model = "hash"
    dimension = 32

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.calls = 0

    async def embed(self, texts: list[str], *, kind: str) -> np.ndarray:
        self.calls += 1
        if self.fail:
            raise ConnectionError("the embedding endpoint is down")
        return np.stack([hashed(text) for text in texts])


def runner(embedder: HashEmbedder) -> MemoryJobRunner:
    """A job runner with the engine's indexing and embedding steps, embedding with ``embedder``."""
    steps = [step for step in memory_engine(embedder=embedder).job_steps() if step.name in ("index", "embed")]
    return MemoryJobRunner(store=OrmJobStore(), steps=steps, owner="test-worker", debounce_seconds=0)


async def search(
    session: ChatSession, question: str, boundary: int | None, embedder: Any, *, deadline: bool = True
) -> RecallInput:
    """One turn's recall search for ``question`` at ``boundary``, as a live turn (or, without
    ``deadline``, a replay) makes it."""
    engine = memory_engine(embedder=embedder)
    if not deadline:
        engine = memory_engine(embedder=embedder, config=replace(engine.config, recall_deadline_seconds=None))
    return await engine.recall(memory_key=memory_key_of(session.pk), scope_key=scope(session), question=question)(
        boundary
    )


def scope(session: ChatSession) -> str:
    return chat_session_scope_key(owner_id=session.owner_id, owner_session_key=session.owner_session_key)


def conversation() -> tuple[ChatSession, list[Message]]:
    """A chat with a tool call and its result, a final reply and an app-written note."""
    session = chat_session_make(visitor_make().owner)
    user = message_make(session, "user", "Where is my order ZX-88213?")
    call = {"id": "call-1", "type": "function", "function": {"name": "get_order", "arguments": '{"id": "ZX-88213"}'}}
    asked = message_make(session, "assistant", None, tool_calls=[call], reply_to=user)
    result = message_make(session, "tool", '{"status": "shipped"}', tool_call_id="call-1", reply_to=user)
    reply = message_make(session, "assistant", "It has shipped.", reply_to=user)
    note = message_make(session, "assistant", "The model did not answer.", reply_to=user, origin=Message.Origin.APP)
    return session, [user, asked, result, reply, note]


def items_of(session: ChatSession) -> list[tuple[list[int], str, str]]:
    rows = MemoryItem.objects.filter(memory_key=str(session.pk)).order_by("id")
    return [(row.message_ids, row.text, row.embedding_model) for row in rows]


async def test_the_index_step_indexes_new_messages_with_tool_results_and_without_app_notes() -> None:
    session, (user, asked, result, reply, _note) = await sync_to_async(conversation)()
    embedder = HashEmbedder()
    run = await runner(embedder).run_now(str(session.pk))
    assert run is not None and run.ok and [a.step for a in run.attempts] == ["index", "embed"]
    assert await sync_to_async(items_of)(session) == [
        ([user.pk], "Where is my order ZX-88213?", "hash"),
        ([asked.pk, result.pk], 'get_order({"id": "ZX-88213"}) -> {"status": "shipped"}', "hash"),
        ([reply.pk], "It has shipped.", "hash"),
    ]
    state = await sync_to_async(memory_job_state_get)(memory_key=str(session.pk))
    assert state.watermarks["index"] == reply.pk  # the app's note is never indexed
    again = await runner(embedder).run_now(str(session.pk))
    assert again is not None and again.idle  # nothing new: nothing due


async def test_an_embedder_failure_is_recorded_and_keeps_lexical_recall_then_a_later_run_fills_the_embeddings() -> None:
    session, messages = await sync_to_async(conversation)()
    memory_key = str(session.pk)
    scope_key = chat_session_scope_key(owner_id=session.owner_id, owner_session_key="")
    dead = HashEmbedder(fail=True)
    run = await runner(dead).run_now(memory_key)
    assert run is not None and not run.ok
    index_attempt, embed_attempt = run.attempts
    assert index_attempt.ok and not embed_attempt.ok and "the embedding endpoint is down" in embed_attempt.error
    state = await sync_to_async(memory_job_state_get)(memory_key=memory_key)
    assert "embed" not in state.watermarks and state.attempts["embed"]["ok"] is False
    assert all(model == "" for _, _, model in await sync_to_async(items_of)(session))
    found = await sync_to_async(recall_candidates)(
        scope_key=scope_key, memory_key="0", boundary=None, scope="owner", query="shipped", query_vector=None
    )
    assert {c.item.text for c in found} == {'get_order({"id": "ZX-88213"}) -> {"status": "shipped"}', "It has shipped."}

    recall_cache_clear()
    alive = HashEmbedder()
    later = await runner(alive).run_now(memory_key)
    assert later is not None and later.ok and [a.step for a in later.attempts] == ["embed"]
    assert all(model == "hash" for _, _, model in await sync_to_async(items_of)(session))
    state = await sync_to_async(memory_job_state_get)(memory_key=memory_key)
    assert state.watermarks["embed"] == messages[3].pk


def test_memory_reindex_rebuilds_every_chat_idempotently(monkeypatch: pytest.MonkeyPatch) -> None:
    session, _ = conversation()
    other = chat_session_make(visitor_make().owner)
    message_make(other, "user", "Hello there.")
    monkeypatch.setattr(memory_reindex, "embedder_get", HashEmbedder)
    out, err = io.StringIO(), io.StringIO()
    call_command("memory_reindex", stdout=out, stderr=err)
    assert "reindexed 2 chat(s), 5 message(s): 4 item(s) added, 0 removed, 4 embedded" in out.getvalue()
    assert f"chat {session.pk} index [" in err.getvalue() and f"chat {session.pk} embed [" in err.getvalue()
    rows = list(MemoryItem.objects.order_by("id").values_list("id", "memory_key", "text", "embedding"))
    assert len(rows) == 4 and all(embedding is not None for *_, embedding in rows)

    out = io.StringIO()
    call_command("memory_reindex", stdout=out, stderr=io.StringIO())
    assert "5 message(s): 0 item(s) added, 0 removed, 0 embedded" in out.getvalue()
    assert list(MemoryItem.objects.order_by("id").values_list("id", "memory_key", "text", "embedding")) == rows

    MemoryItem.objects.filter(memory_key=str(session.pk)).delete()
    call_command("memory_reindex", "--chat", str(session.pk), "--no-embed", stdout=io.StringIO(), stderr=io.StringIO())
    assert [model for _, _, model in items_of(session)] == ["", "", ""]
    with pytest.raises(CommandError, match="no chat session 999999"):
        call_command("memory_reindex", "--chat", "999999", stdout=io.StringIO(), stderr=io.StringIO())


def test_knowledge_base_search_results_are_not_indexed_and_a_reindex_removes_old_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent's kb_search that found nothing only repeats its question: recalled for that
    question it would crowd out the answer (found by a newcomer); one that found passages copies
    the knowledge base, which the turn searches afresh."""
    session = chat_session_make(visitor_make().owner)
    user = message_make(session, "user", "Who sold me the Bianchi bicycle?")
    searches = [
        {"id": "k1", "type": "function", "function": {"name": "kb_search", "arguments": '{"query": "Bianchi"}'}},
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2*21"}'}},
    ]
    asked = message_make(session, "assistant", None, tool_calls=searches, reply_to=user)
    message_make(session, "tool", "no passages found for 'Bianchi'", tool_call_id="k1", reply_to=user)
    computed = message_make(session, "tool", "42", tool_call_id="c1", reply_to=user)
    reply = message_make(session, "assistant", "I could not find it.", reply_to=user)
    run = async_to_sync(runner(HashEmbedder()).run_now)(str(session.pk))
    assert run is not None and run.ok
    expected = [
        ([user.pk], "Who sold me the Bianchi bicycle?", "hash"),
        ([asked.pk, computed.pk], 'calculator({"expression": "2*21"}) -> 42', "hash"),
        ([reply.pk], "I could not find it.", "hash"),
    ]
    assert items_of(session) == expected

    # An index built before this rule holds the search's result: a reindex removes it.
    MemoryItem.objects.create(
        scope_key=chat_session_scope_key(owner_id=session.owner_id, owner_session_key=""),
        memory_key=str(session.pk),
        message_ids=[asked.pk, asked.pk + 1],
        last_message_id=asked.pk + 1,
        role="tool",
        text='kb_search({"query": "Bianchi"}) -> no passages found for \'Bianchi\'',
        created_at=user.created,
    )
    monkeypatch.setattr(memory_reindex, "embedder_get", HashEmbedder)
    out = io.StringIO()
    call_command("memory_reindex", "--chat", str(session.pk), stdout=out, stderr=io.StringIO())
    assert "0 item(s) added, 1 removed" in out.getvalue()
    assert items_of(session) == expected


def test_an_answer_given_on_a_search_that_found_nothing_is_not_indexed() -> None:
    """Recalled for a later question, "I found nothing" would stand in front of the message that holds the
    answer (found by a newcomer); the question itself stays recallable."""
    session = chat_session_make(visitor_make().owner)
    user = message_make(session, "user", "Who sold me the Bianchi bicycle?")
    search = [{"id": "k1", "type": "function", "function": {"name": "kb_search", "arguments": '{"query": "Bianchi"}'}}]
    message_make(session, "assistant", None, tool_calls=search, reply_to=user)
    message_make(session, "tool", "no passages found for 'Bianchi'", tool_call_id="k1", reply_to=user)
    message_make(session, "assistant", "I searched the knowledge base for “Bianchi” and found nothing.", reply_to=user)
    told = message_make(session, "user", "Rossi Cicli in Milan sold me the Bianchi.")
    run = async_to_sync(runner(HashEmbedder()).run_now)(str(session.pk))
    assert run is not None and run.ok
    assert [ids for ids, _, _ in items_of(session)] == [[user.pk], [told.pk]]


def test_deleting_a_chat_deletes_its_items_only() -> None:
    session, _ = conversation()
    other = chat_session_make(visitor_make().owner)
    message_make(other, "user", "Keep me.")
    call_command("memory_reindex", "--no-embed", stdout=io.StringIO(), stderr=io.StringIO())
    chat_services.chat_session_delete(session=session)
    assert list(MemoryItem.objects.values_list("text", flat=True)) == ["Keep me."]


@pytest.fixture(autouse=True)
def fresh_cache() -> Any:
    recall_cache_clear()
    yield
    recall_cache_clear()


def recall_deadline(settings: Any, *, deadline_ms: int) -> None:
    """Recall's deadline for the question's embedding."""
    settings.MEMORY_RECALL_DEADLINE_MS = deadline_ms


class SlowEmbedder(HashEmbedder):
    """An embedder slower than the recall deadline."""

    async def embed(self, texts: list[str], *, kind: str) -> np.ndarray:
        import asyncio

        self.calls += 1
        await asyncio.sleep(5)
        return await super().embed(texts, kind=kind)


@pytest.mark.parametrize("kind", ["works", "fails", "too_slow"])
async def test_the_request_embeds_its_question_only_once_the_owner_has_vectors_and_falls_back_to_lexical(
    kind: str, settings: Any, monkeypatch: Any
):
    # Issue 11: a question embedded for an owner with no vectors found nothing and cost ~6 ms of CPU.
    embedder = {"works": HashEmbedder(), "fails": HashEmbedder(fail=True), "too_slow": SlowEmbedder()}[kind]
    recall_deadline(settings, deadline_ms=100)
    session, messages = await sync_to_async(conversation)()
    question = await sync_to_async(message_make)(session, "user", "Has order ZX-88213 shipped yet?")

    found = await search(session, question.content or "", None, embedder)
    assert embedder.calls == 0 and found.model is None
    assert found.notes == ["nothing of this owner is embedded yet: lexical only"]

    await runner(HashEmbedder()).run_now(str(session.pk))  # indexes and embeds with the same model
    recall_cache_clear()
    found = await search(session, question.content or "", messages[-1].pk, embedder)
    assert embedder.calls == 1
    if kind == "works":
        assert found.model == "hash" and found.notes == []
        assert any(candidate.cosine is not None for candidate in found.candidates)
    else:
        assert found.model is None and len(found.notes) == 1 and found.notes[0].endswith("lexical only")
        assert ("failed" if kind == "fails" else "took over 100 ms") in found.notes[0]
        assert found.candidates, "full-text search still finds the order"


class LateEmbedder(HashEmbedder):
    """An embedder that answers after 0.3 s."""

    async def embed(self, texts: list[str], *, kind: str) -> np.ndarray:
        import asyncio

        await asyncio.sleep(0.3)
        return await super().embed(texts, kind=kind)


async def test_without_a_deadline_as_in_a_replay_the_search_waits_for_a_late_embedding(
    settings: Any, monkeypatch: Any
) -> None:
    """A replay's records must not depend on the machine's load (docs/replay.md): its searches
    wait for the question's embedding, where a live request falls back to lexical only."""
    embedder = LateEmbedder()
    recall_deadline(settings, deadline_ms=50)
    session, messages = await sync_to_async(conversation)()
    await runner(HashEmbedder()).run_now(str(session.pk))
    question = await sync_to_async(message_make)(session, "user", "Has order ZX-88213 shipped yet?")
    live = await search(session, question.content or "", messages[-1].pk, embedder)
    assert live.model is None and live.notes == ["the query's embedding took over 50 ms: lexical only"]
    replayed = await search(session, question.content or "", messages[-1].pk, embedder, deadline=False)
    assert replayed.model == "hash" and replayed.notes == [] and replayed.embedding_ms >= 300


class GatedEmbedder(HashEmbedder):
    """An embedder that answers once ``gate`` is set (the turn goes on meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        import asyncio

        self.started = asyncio.Event()
        self.gate = asyncio.Event()

    async def embed(self, texts: list[str], *, kind: str) -> np.ndarray:
        self.calls += 1
        self.started.set()
        await self.gate.wait()
        return np.stack([hashed(text) for text in texts])


async def test_a_turn_starts_its_questions_embedding_when_it_opens_and_every_search_of_the_turn_uses_it(
    settings: Any, monkeypatch: Any
):
    import asyncio

    embedder = GatedEmbedder()
    recall_deadline(settings, deadline_ms=10_000)
    session, messages = await sync_to_async(conversation)()
    await runner(HashEmbedder()).run_now(str(session.pk))
    turn_recall = memory_engine(embedder=embedder).recall(
        memory_key=memory_key_of(session.pk), scope_key=scope(session), question="Has order ZX-88213 shipped yet?"
    )

    turn_recall.prefetch()
    turn_recall.prefetch()  # once per turn
    async with asyncio.timeout(10):  # the embedding starts in the background, before any search
        await embedder.started.wait()
    assert embedder.calls == 1

    search = asyncio.ensure_future(turn_recall(messages[1].pk))
    await asyncio.sleep(0.05)
    assert not search.done(), "the search waits for the embedding it did not start"
    embedder.gate.set()
    found = await search
    assert found.model == "hash" and found.notes == [] and found.embedding_ms >= 0
    assert any(candidate.cosine is not None for candidate in found.candidates)

    # Another boundary (the turn compressed meanwhile) searches again with the same embedding.
    again = await turn_recall(messages[-1].pk)
    assert embedder.calls == 1 and again.model == "hash"


async def test_the_owners_vectors_are_read_into_the_cache_before_their_first_question() -> None:
    from memory.storage.search import vector_cache

    session, _ = await sync_to_async(conversation)()
    embedder = HashEmbedder()
    await runner(embedder).run_now(str(session.pk))
    recall_cache_clear()
    assert not vector_cache.holds(scope(session))
    await memory_engine(embedder=embedder).recall_warm(scope(session))  # as a socket of the chat opens
    assert vector_cache.holds(scope(session))
    recall_cache_clear()
    await memory_engine(embedder=None).recall_warm(scope(session))  # words only: nothing to read
    assert not vector_cache.holds(scope(session))
