"""Property tests over generated conversations (docs/memory.md invariants I1-I9).

Conversations mix plain turns, tool groups with parallel calls answered in any order, extra
system messages, CJK text, oversized messages, orphan results and unanswered calls; the
summarizer succeeds, fails or returns empty text at random. Before every model call (every
assistant message) the engine builds the context and every invariant is checked.
"""

from __future__ import annotations

import copy
import itertools
import json
from datetime import UTC, datetime

from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from memory.context.builder import CAS_ROUNDS
from memory.context.request import ContextRequest
from memory.facts.rules import message_rule_facts
from memory.facts.values import KeyFact
from memory.recall.pieces import message_pieces
from memory.recall.values import RecallCandidate, RecallInput, RecallItem
from memory.summary.archive import raw_text
from memory.summary.extractive import ExtractiveSummarizer
from memory.summary.store import InMemorySummaryStore
from tests.memory.builders import COUNTER, FlakySummarizer, Store, asst, system, tool, user
from tests.memory.conftest import make_engine
from tests.memory.invariants import check_context

SYSTEM = "You are the airline assistant. Follow the policy."
_keys = itertools.count(1)

words = st.sampled_from(
    ["refund", "ZFA04Y", "flight", "2024-05-01", "$312", "baggage", "ada_1815", "gold", "seat", "cancel"]
)
cjk = st.sampled_from(["我们讨论记忆管理", "東京への便を予約", "수하물 규정", "退款政策"])
text = st.one_of(
    st.lists(words, min_size=1, max_size=40).map(" ".join),
    st.lists(cjk, min_size=1, max_size=30).map("".join),
    st.integers(min_value=300, max_value=2500).map(lambda n: "long " * n),
)


@st.composite
def tool_group(draw, turn: int, index: int):
    count = draw(st.integers(min_value=1, max_value=4))
    ids = [f"call_{turn}_{index}_{k}" for k in range(count)]
    caller = asst(draw(st.one_of(st.none(), text)), tc=ids)
    results = [tool(call_id, draw(text)) for call_id in draw(st.permutations(ids))]
    shape = draw(st.sampled_from(["healthy"] * 8 + ["orphan", "dangling"]))
    if shape == "orphan":
        results.insert(draw(st.integers(0, len(results))), tool(f"ghost_{turn}_{index}", "stray result"))
    elif shape == "dangling":
        results = results[:-1]
    return [caller, *results]


@st.composite
def conversation(draw):
    messages = []
    for turn in range(draw(st.integers(min_value=1, max_value=9))):
        if draw(st.integers(0, 9)) == 0:
            messages.append(system("Notice: the booking system restarts tonight."))
        messages.append(user(f"turn {turn}: " + draw(text)))
        for index in range(draw(st.integers(min_value=0, max_value=3))):
            messages.extend(draw(tool_group(turn, index)))
        if draw(st.booleans()):
            messages.append(asst(draw(text)))
    return messages


def dropped_wire_ids(rows):
    """Ids the model-facing copy must drop: orphan results and empty unanswered callers."""
    dropped, answered = set(), set()
    for index, row in enumerate(rows):
        if row["role"] == "tool":
            calls = []
            back = index - 1
            while back >= 0 and rows[back]["role"] == "tool":
                back -= 1
            if back >= 0:
                calls = [c["id"] for c in rows[back].get("tool_calls") or ()]
            if row["tool_call_id"] in calls:
                answered.add(row["tool_call_id"])
            else:
                dropped.add(row["id"])
    for index, row in enumerate(rows):
        calls = [c["id"] for c in row.get("tool_calls") or ()]
        is_last = index == len(rows) - 1
        if calls and not row.get("content") and not any(c in answered for c in calls) and not is_last:
            dropped.add(row["id"])
    return dropped


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    messages=conversation(),
    window=st.sampled_from([256, 512, 1024, 2048, 4096]),
    mode=st.sampled_from(["agent", "quick-answer"]),
    summary_role=st.sampled_from(["system", "user"]),
    script=st.lists(st.sampled_from(["ok", "ok", "ok", "fail", "empty"]), min_size=1, max_size=8),
    with_tools=st.booleans(),
    strict=st.booleans(),
)
def test_invariants_hold_before_every_model_call(messages, window, mode, summary_role, script, with_tools, strict):
    key = f"property-{next(_keys)}"
    tools = (
        [{"type": "function", "function": {"name": "kb_search", "parameters": {"type": "object"}}}]
        if with_tools
        else None
    )
    store_port = InMemorySummaryStore()
    engine = make_engine(
        window,
        FlakySummarizer(script),
        attempts=1,
        summary_role=summary_role,
        strict_alternation=strict,
        store=store_port,
    )
    store = Store()
    boundary = 0
    for message in messages:
        if message["role"] == "assistant" and store.rows:
            snapshot = store.snapshot()
            context = async_to_sync(engine.build_context)(
                ContextRequest(
                    memory_key=key, system_prompt=SYSTEM, load_increment=store.load_increment, mode=mode, tools=tools
                )
            )
            assert store.rows == snapshot, "I6: memory management modified stored rows"
            check_context(
                context,
                stored=store.rows,
                system_prompt=SYSTEM,
                counter=COUNTER,
                tools=tools,
                dropped_ids=dropped_wire_ids(store.rows) - _covered(context),
                single_system=summary_role == "user",
                strict_alternation=strict,
            )
            new_boundary = context.summary.last_message_id or 0
            assert new_boundary >= boundary, "I4: the boundary moved backwards"
            boundary = new_boundary
            assert len(context.events) <= CAS_ROUNDS + 2, "I9: runaway compression"
            for compression in context.events:
                event(f"{compression.kind} {compression.result_type}")
            if context.summary.summary_type != "none":
                assert context.summary.content.strip(), "I8: an empty summary was stored"
        store.add(copy.deepcopy(message))
    stored = store_port.summaries.get(key)
    if stored is not None:
        assert stored.content.count("[Raw archive of newly added messages]") <= 1


def _covered(context):
    return set(range(1, (context.summary.last_message_id or 0) + 1))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversation(), window=st.sampled_from([512, 1024, 2048]))
def test_i9_a_second_build_without_new_messages_summarizes_nothing(messages, window):
    key = f"liveness-{next(_keys)}"
    engine = make_engine(window, ExtractiveSummarizer(COUNTER), attempts=1, store=InMemorySummaryStore())
    store = Store()
    store.add(*messages)
    async_to_sync(engine.build_context)(
        ContextRequest(memory_key=key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent")
    )
    again = async_to_sync(engine.build_context)(
        ContextRequest(memory_key=key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent")
    )
    assert all(event.kind in ("no_progress", "overflow") for event in again.events)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    messages=conversation(),
    window=st.sampled_from([256, 512, 1024, 2048]),
    summary_role=st.sampled_from(["system", "user"]),
)
def test_f38_the_window_after_the_summary_never_starts_with_a_non_user_message(messages, window, summary_role):
    """docs/memory.md F-38, as a property: before every model call of a generated conversation,
    whatever the summary role, the first message after the summary block is a user message."""
    key = f"f38-{next(_keys)}"
    engine = make_engine(
        window, ExtractiveSummarizer(COUNTER), attempts=1, summary_role=summary_role, store=InMemorySummaryStore()
    )
    store = Store()
    checked = 0
    for message in messages:
        if message["role"] == "assistant" and store.rows:
            context = async_to_sync(engine.build_context)(
                ContextRequest(memory_key=key, system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent")
            )
            kinds = [source["kind"] for source in context.sources]
            if "summary" in kinds and kinds.index("summary") + 1 < len(kinds):
                checked += 1
                after = kinds.index("summary") + 1
                assert context.messages[after]["role"] == "user", context.messages[after]
                assert context.sources[after]["kind"] in ("history", "current")
                stored = next(row for row in store.rows if row["id"] == context.sources[after]["id"])
                assert stored["role"] == "user", "a turn starts at a user message, never a later system message"
        store.add(copy.deepcopy(message))
    # An example that never had a summary followed by a window checked nothing: not one of the run's
    # examples (a run where no example compresses fails as unsatisfiable instead of passing).
    assume(checked > 0)


class RecordingJobs:
    """Memory jobs for a property run: a request never waits; what it hands over is noted."""

    def __init__(self) -> None:
        self.scheduled = 0

    async def wait(self, memory_key: str, timeout_seconds: float) -> bool:
        return True

    def schedule(self, memory_key: str) -> None:
        self.scheduled += 1


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    messages=conversation(),
    window=st.sampled_from([256, 512, 1024, 2048]),
    mode=st.sampled_from(["agent", "quick-answer"]),
    script=st.lists(st.sampled_from(["ok", "ok", "ok", "fail", "empty"]), min_size=1, max_size=8),
    next_tokens=st.sampled_from([0, 200, 600]),
)
def test_pre_compression_and_read_only_requests_keep_the_invariants(messages, window, mode, script, next_tokens):
    """docs/memory.md §10 with I1-I9: after every stored reply the memory job pre-compresses
    (an imagined next message of ``next_tokens``), and every request is built in background mode
    (reads only, never calls the summarizer for history). Every request keeps the invariants,
    the boundary only moves forward, and no request writes a summary."""
    key = f"precompress-{next(_keys)}"
    store_port = InMemorySummaryStore()
    jobs = RecordingJobs()
    engine = make_engine(window, FlakySummarizer(script), attempts=1, store=store_port)
    engine.jobs = jobs
    store = Store()
    boundary = 0
    for message in messages:
        if message["role"] == "assistant" and store.rows:
            version = async_to_sync(store_port.get)(key).version
            snapshot = store.snapshot()
            context = async_to_sync(engine.build_context)(
                ContextRequest(
                    memory_key=key,
                    system_prompt=SYSTEM,
                    load_increment=store.load_increment,
                    mode=mode,
                    compression="background",
                )
            )
            assert store.rows == snapshot, "I6: memory management modified stored rows"
            assert async_to_sync(store_port.get)(key).version == version, "a background request wrote a summary"
            assert not any(e.kind == "compression" for e in context.events)
            check_context(
                context,
                stored=store.rows,
                system_prompt=SYSTEM,
                counter=COUNTER,
                tools=None,
                dropped_ids=dropped_wire_ids(store.rows) - _covered(context),
            )
            event(f"path {context.path}")
        store.add(copy.deepcopy(message))
        if message["role"] == "assistant" and not message.get("tool_calls"):
            snapshot = store.snapshot()
            planned = async_to_sync(engine.precompress)(
                ContextRequest(
                    memory_key=key, system_prompt=SYSTEM, load_increment=store.load_increment, mode=mode, origin="job"
                ),
                next_message_tokens=next_tokens,
            )
            assert store.rows == snapshot, "I6: pre-compression modified stored rows"
            stored = async_to_sync(store_port.get)(key)
            new_boundary = stored.last_message_id or 0
            assert new_boundary >= boundary, "I4: the boundary moved backwards"
            assert new_boundary <= len(store.rows), "the imagined message was summarized"
            boundary = new_boundary
            if stored.summary_type != "none":
                assert stored.content.strip(), "I8: an empty summary was stored"
            if planned is not None:
                assert all(e.origin == "job" for e in planned.events)


# --- F-51: credentials never reach a memory-written block ----------------------------------

SECRETS = {
    "my password is Blue-Falcon-88": "Blue-Falcon-88",
    "the API key is sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t": "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t",
    "your verification code is 482913": "482913",
    "pay with card 4111 1111 1111 1111": "4111 1111 1111 1111",
    "my PIN is 4821": "4821",
    "Mein Passwort ist Sommer2026": "Sommer2026",
    "密码是abc123": "abc123",
}
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def with_secret(draw, body: str) -> str:
    """``body``, or it with a credential's sentence at a drawn word boundary."""
    if draw(st.booleans()):
        return body
    words = body.split(" ")
    at = draw(st.integers(0, len(words)))
    return " ".join([*words[:at], f". {draw(st.sampled_from(sorted(SECRETS)))} .", *words[at:]]).strip()


@st.composite
def conversation_with_secrets(draw):
    messages = []
    for turn in range(draw(st.integers(min_value=2, max_value=9))):
        messages.append(user(with_secret(draw, f"turn {turn}: " + draw(text))))
        if draw(st.integers(0, 2)) == 0:
            call_id = f"call_{turn}"
            caller = asst(None, tc=[call_id])
            caller["tool_calls"][0]["function"]["arguments"] = json.dumps({"query": with_secret(draw, "find ZFA04Y")})
            messages.extend([caller, tool(call_id, with_secret(draw, draw(text)))])
        messages.append(asst(with_secret(draw, draw(text))))
    return messages


class EchoSummarizer:
    """A summarizer that ignores its instructions: the raw messages verbatim, and their secrets bare."""

    model = "echo"

    async def summarize(self, request):
        raw = "\n".join(raw_text(message) for message in request.messages)
        bare = [secret for sentence, secret in SECRETS.items() if sentence in raw]
        return COUNTER.truncate_text(f"{request.previous_summary}\n{raw}\n{' '.join(bare)}", request.max_tokens)


def recall_loader(store: Store, key: str):
    """Recall candidates from the real index pieces of the rows up to ``boundary``, the last user message as query."""

    async def load(boundary):
        rows = [{**row, "created_at": NOW} for row in store.rows if boundary is not None and row["id"] <= boundary]
        pieces = message_pieces(rows, counter=COUNTER, calls={})
        query = next(row["content"] for row in reversed(store.rows) if row["role"] == "user")
        candidates = [
            RecallCandidate(
                item=RecallItem(
                    id=number,
                    memory_key=key,
                    chat_title="this chat",
                    message_ids=piece.message_ids,
                    role=piece.role,
                    text=piece.text,
                    tokens=piece.tokens,
                    created_at=NOW,
                ),
                lexical_rank=number,
                cosine=None,
                identifier_match=False,
            )
            for number, piece in enumerate(pieces, 1)
        ]
        return RecallInput(query=query, candidates=candidates, model=None, now=NOW)

    return load


def rule_fact_loader(store: Store):
    """The rule facts of the stored rows, as the store-time extraction keeps them."""

    async def load():
        candidates = [candidate for row in store.rows for candidate in message_rule_facts(row)]
        return [
            KeyFact(
                id=number,
                kind=c.kind,
                key=c.key,
                value=c.value,
                text=c.text,
                source_message_id=c.source_message_id,
                excerpt=c.excerpt,
            )
            for number, c in enumerate(candidates, 1)
        ]

    return load


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    messages=conversation_with_secrets(),
    window=st.sampled_from([512, 1024, 2048]),
    mode=st.sampled_from(["agent", "quick-answer"]),
    summarizer=st.sampled_from(["echo", "extractive", "down"]),
)
def test_f51_no_secret_reaches_a_memory_written_block_of_any_request(messages, window, mode, summarizer):
    """docs/memory.md F-51, as a property: before every model call of a conversation holding
    credentials anywhere, whichever summarizer (one echoing every secret, the extractive one, none
    so the raw archive), no summary, key-facts, recall block or "steps so far" note holds one; the
    user's own message in the window still may."""
    key = f"secrets-{next(_keys)}"
    primary = {"echo": EchoSummarizer(), "extractive": ExtractiveSummarizer(COUNTER), "down": FlakySummarizer(["fail"])}
    engine = make_engine(window, primary[summarizer], attempts=1, store=InMemorySummaryStore(), facts_share=0.3)
    store = Store()
    for message in messages:
        if message["role"] == "assistant" and store.rows:
            context = async_to_sync(engine.build_context)(
                ContextRequest(
                    memory_key=key,
                    system_prompt=SYSTEM,
                    load_increment=store.load_increment,
                    mode=mode,
                    load_facts=rule_fact_loader(store),
                    load_recall=recall_loader(store, key),
                )
            )
            for wire, source in zip(context.messages, context.sources, strict=True):
                if source["kind"] in ("summary", "facts", "recall") or source.get("folded"):
                    event(f"checked {source['kind']}")
                    leaked = [secret for secret in SECRETS.values() if secret in str(wire.get("content"))]
                    assert not leaked, f"{leaked} in the {source['kind']} block: {wire['content']}"
                elif source["kind"] == "history" and any(s in str(wire.get("content")) for s in SECRETS.values()):
                    event("a secret stays in the user's own message of the window")
        store.add(copy.deepcopy(message))
