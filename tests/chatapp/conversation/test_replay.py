"""``manage.py replay``: the JSON Lines contract, on real transcripts from ../shared/data
(skipped when absent) and on small crafted files."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from chatapp.conversation.replay import locomo_time, stated_time
from chatapp.models import Message, TurnLease
from memory.models import MemoryJobState

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
TAU = DATA / "tau-bench-airline" / "trajectories.json"
LOCOMO = DATA / "locomo"
KEYS = {
    "conversation",
    "call",
    "context_window",
    "trigger_tokens",
    "target_tokens",
    "messages",
    "sources",
    "tokens",
    "summary",
    "stored_message_ids",
    "events",
    "overflow",
    "path",
    "job_events",
    "facts",
    "recall",
}
QUESTION_KEYS = {"text", "answer", "category", "evidence", "evidence_message_ids", "conversation"}
STATUSES = ("pinned", "in_window", "over_budget")

pytestmark = pytest.mark.django_db


def replay(tmp_path: Path, *args: str) -> list[dict]:
    out = tmp_path / "out.jsonl"
    call_command("replay", *args, "--out", str(out))
    return [json.loads(line) for line in out.read_text().splitlines()]


def check_record(record: dict) -> None:
    """The contract of one line, and exact coverage (docs/memory.md I4) from the line alone."""
    assert set(record) == (KEYS | {"question"} if "question" in record else KEYS)
    assert len(record["messages"]) == len(record["sources"])
    assert record["sources"][0]["kind"] == "system" and record["messages"][0]["role"] == "system"
    assert record["trigger_tokens"] == record["context_window"] // 2
    boundary = record["summary"]["last_message_id"] or 0
    # A source may stand for merged neighbours (strict alternation) or folded steps (docs/replay.md).
    expanded = [part for s in record["sources"] for part in (s, *s.get("merged", []))]
    folded = [i for part in expanded for i in part.get("folded", [])]
    present = [s["id"] for s in expanded if s["id"] is not None]
    assert present == [i for i in record["stored_message_ids"] if i > boundary and i not in folded]
    assert record["stored_message_ids"] == sorted(record["stored_message_ids"])
    assert record["overflow"] == (record["tokens"] > record["context_window"])
    assert record["tokens"] <= record["context_window"] or any(e["kind"] == "overflow" for e in record["events"])
    for event in [*record["events"], *record["job_events"]]:
        assert isinstance(event["attempts"], list)
    # The key-facts block (docs/memory.md §11): right after the system prompt, with provenance of
    # facts whose messages the summary covers or that are pinned, edited or superseding.
    kinds = [s["kind"] for s in record["sources"]]
    assert set(record["facts"]) == {"pinned", "in_window", "over_budget", "tokens", "entries"}
    listed = {status: [e["id"] for e in record["facts"]["entries"] if e["status"] == status] for status in STATUSES}
    assert listed == {status: record["facts"][status] for status in STATUSES}
    if "facts" in kinds:
        assert kinds.index("facts") == 1
        block = record["sources"][1]
        assert block["fact_ids"] == record["facts"]["pinned"] and block["message_ids"]
        assert all(i in record["stored_message_ids"] for i in block["message_ids"])
    else:
        assert record["facts"]["pinned"] == []
    # The recall block (docs/memory.md §12): after the summary, with its items' provenance; never
    # a message of this chat the request still carries or has not folded into the summary.
    if "recall" in kinds:
        block = record["sources"][kinds.index("recall")]
        assert set(kinds[: kinds.index("recall")]) <= {"system", "facts", "summary"}
        assert block["item_ids"] == [item["item_id"] for item in record["recall"]["items"]]
        assert block["message_ids"] and not set(block["message_ids"]) & set(present)
        own = [i for i in block["message_ids"] if i in record["stored_message_ids"]]
        assert all(i <= boundary for i in own)
    else:
        assert not record["recall"] or record["recall"]["items"] == []


def test_tau_bench_replay_follows_the_contract(tmp_path):
    if not TAU.exists():
        pytest.skip(f"tau-bench transcripts not found at {TAU} (the shared data folder is absent)")
    records = replay(
        tmp_path, str(TAU), "--format", "tau-bench", "--limit", "5", "--context-window", "4096", "--mode", "agent"
    )
    data = json.loads(TAU.read_text())[:5]
    expected_calls = sum(1 for item in data for m in item["traj"] if m["role"] == "assistant")
    assert len(records) == expected_calls
    assert len({r["conversation"] for r in records}) == 5
    for record in records:
        check_record(record)
    # Background mode (the default): the memory job compresses between model calls.
    assert any(e["kind"] == "compression" and e["origin"] == "job" for r in records for e in r["job_events"])
    # Facts the summary folded away are pinned: some request carries the block, and its
    # identifiers are ones the user typed or a tool was called with.
    blocks = [r["messages"][1]["content"] for r in records if r["sources"][1]["kind"] == "facts"]
    assert blocks and any("mia_li_3668" in block for block in blocks)
    first = records[0]
    assert first["call"] == 0 and first["messages"][0]["content"].startswith(data[0]["traj"][0]["content"].rstrip())
    # The transcript's stated time ("The current time is 2024-05-15 15:00:00 EST.") is the request's now.
    assert first["messages"][0]["content"].endswith("Current date: 2024-05-15 (Wednesday), 15:00, time zone EST.")


def test_locomo_replay_maps_speakers_and_captions(tmp_path):
    if not LOCOMO.exists():
        pytest.skip(f"LoCoMo conversations not found at {LOCOMO} (the shared data folder is absent)")
    records = replay(
        tmp_path,
        str(LOCOMO / "conv-30.json"),
        "--format",
        "locomo",
        "--context-window",
        "4096",
        "--mode",
        "quick-answer",
    )
    assert records and {r["conversation"] for r in records} == {"conv-30"}
    for record in records:
        check_record(record)
    roles = {m["role"] for r in records for m in r["messages"]}
    assert roles <= {"system", "user", "assistant"}
    assert any(r["summary"]["type"] != "none" for r in records)


def test_crafted_locomo_file_with_an_image_turn(tmp_path):
    conv = {
        "speaker_a": "Ann",
        "speaker_b": "Bo",
        "session_1_date_time": "1 May 2023",
        "session_1": [
            {"speaker": "Bo", "dia_id": "D1:1", "text": "Hi Ann"},
            {"speaker": "Ann", "dia_id": "D1:2", "text": "Look", "img_url": ["x"], "blip_caption": "a photo of a cat"},
            {"speaker": "Bo", "dia_id": "D1:3", "text": "Cute!"},
        ],
    }
    path = tmp_path / "conv-1.json"
    path.write_text(json.dumps(conv))
    records = replay(tmp_path, str(path), "--format", "locomo", "--mode", "quick-answer")
    assert [r["call"] for r in records] == [0, 1]
    assert records[0]["messages"][1:] == []  # Bo speaks first: nothing stored yet
    assert records[1]["messages"][-1] == {
        "role": "user",
        "content": "Look [shares an image: a photo of a cat]",
        "name": "Ann",
    }
    assert records[1]["messages"][-2] == {"role": "assistant", "content": "[1 May 2023] Hi Ann", "name": "Bo"}
    # Each speaker is stored as the message's OpenAI name (recall indexes "Ann: Look …").
    assert list(Message.objects.order_by("id").values_list("role", "name")) == [
        ("assistant", "Bo"),
        ("user", "Ann"),
        ("assistant", "Bo"),
    ]


def test_stated_and_session_times_are_read_as_aware_times():
    est = timezone(timedelta(hours=-5), "EST")
    assert stated_time("Policy.\n\nThe current time is 2024-05-15 15:00:00 EST.\n") == datetime(
        2024, 5, 15, 15, 0, tzinfo=est
    )
    assert stated_time("No time here.") is None
    assert locomo_time("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert locomo_time("12:09 am on 13 September, 2023") == datetime(2023, 9, 13, 0, 9, tzinfo=UTC)
    assert locomo_time("1 May 2023") is None


def test_a_locomo_replay_sends_the_recorded_dates_not_the_replay_day(tmp_path):
    conv = {
        "speaker_a": "Ann",
        "speaker_b": "Bo",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I ran a charity race yesterday"},
            {"speaker": "Bo", "dia_id": "D1:2", "text": "Well done!"},
        ],
        "session_2_date_time": "1:14 pm on 25 May, 2023",
        "session_2": [
            {"speaker": "Ann", "dia_id": "D2:1", "text": "Hi again"},
            {"speaker": "Bo", "dia_id": "D2:2", "text": "Hello"},
        ],
    }
    path = tmp_path / "conv-1.json"
    path.write_text(json.dumps(conv))
    records = replay(tmp_path, str(path), "--format", "locomo", "--mode", "quick-answer")
    first, second = records
    assert first["messages"][0]["content"].endswith("Current date: 2023-05-08 (Monday), 13:56, time zone UTC.")
    assert second["messages"][0]["content"].endswith("Current date: 2023-05-25 (Thursday), 13:14, time zone UTC.")
    assert [m["content"] for m in second["messages"][1:]] == [
        "[2023-05-08 Mon]\nI ran a charity race yesterday",
        "Well done!",
        "Hi again",
    ]
    # Stored as said, at the recorded time: the date is on the wire, never in the text.
    assert list(Message.objects.order_by("id").values_list("content", "created")) == [
        ("I ran a charity race yesterday", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("Well done!", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("Hi again", datetime(2023, 5, 25, 13, 14, tzinfo=UTC)),
        ("Hello", datetime(2023, 5, 25, 13, 14, tzinfo=UTC)),
    ]


@pytest.mark.parametrize(
    ("content", "fmt", "message"),
    [
        (None, "tau-bench", "does not exist"),
        ("{not json", "tau-bench", "not readable JSON"),
        ('{"a": 1}', "tau-bench", "JSON list"),
        ("[]", "locomo", "holds an empty list"),
        ("[1]", "locomo", "speaker_a"),
        ('{"a": 1}', "locomo", "speaker_a"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, content, fmt, message):
    path = tmp_path / "input.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CommandError, match=message):
        call_command("replay", str(path), "--format", fmt, "--out", str(tmp_path / "o.jsonl"))


def test_in_sync_mode_requests_compress_themselves_and_the_job_only_extracts_facts(tmp_path, settings):
    if not TAU.exists():
        pytest.skip(f"tau-bench transcripts not found at {TAU} (the shared data folder is absent)")
    settings.MEMORY_COMPRESSION = "sync"
    records = replay(
        tmp_path, str(TAU), "--format", "tau-bench", "--limit", "3", "--context-window", "4096", "--mode", "agent"
    )
    for record in records:
        check_record(record)
        assert record["job_events"] == []
        assert record["path"] in ("under_trigger", "no_progress", "compressed", "degraded")
        assert all(event["origin"] == "request" for event in record["events"])
    assert any(record["path"] == "compressed" for record in records)
    # The job ran after each reply, for key-fact extraction and indexing only (docs/memory.md §11, §12).
    states = list(MemoryJobState.objects.all())
    assert len(states) == 3 and all(set(state.watermarks) == {"extract_facts", "index"} for state in states)


FILLER = [
    "We spent the afternoon arguing about which bakery sells the best croissants downtown.",
    "The weather turned cold again, so I finally unpacked the winter coats from the attic.",
    "My neighbour keeps practising the trumpet at night and the whole street can hear it.",
    "I started reading a long novel about sailors crossing the northern ocean in winter.",
    "Work has been busy with quarterly reports and endless meetings about the budget.",
    "We tried a new recipe for lentil soup and it turned out surprisingly good.",
]


def crafted_locomo(name: str, fact: str, questions: list[dict]) -> dict:
    """A LoCoMo file of three sessions: ``fact`` is turn D1:3 (Ann's), the rest is filler; Ann
    speaks twice in a row at D2:1-D2:2 (a turn with no reply)."""
    turns = [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi Bo, long time no see!"},
        {"speaker": "Bo", "dia_id": "D1:2", "text": "Hi Ann! What is new with you?"},
        {"speaker": "Ann", "dia_id": "D1:3", "text": fact},
        {"speaker": "Bo", "dia_id": "D1:4", "text": "That is wonderful news, tell me more next time."},
    ]
    sessions: dict = {"session_1_date_time": "1 May 2023", "session_1": turns}
    for number in (2, 3):
        session = []
        for position in range(12):
            speaker = "Ann" if position % 2 == 0 or (number, position) == (2, 1) else "Bo"
            session.append(
                {"speaker": speaker, "dia_id": f"D{number}:{position + 1}", "text": FILLER[(position + number) % 6]}
            )
        sessions[f"session_{number}_date_time"] = f"{number} June 2023"
        sessions[f"session_{number}"] = session
    return {"speaker_a": "Ann", "speaker_b": "Bo", **sessions, "qa": questions}


PARROT_QA = [
    {
        "question": "What is the name of the parrot Henrietta adopted in Lisbon?",
        "answer": "Zorblax",
        "evidence": ["D1:3"],
        "category": 1,
    },
    {"question": "When did Henrietta adopt the parrot?", "answer": 2023, "evidence": ["D1:3; D2:2"], "category": 2},
    {"question": "What did Ann have for dinner?", "answer": "Not mentioned", "evidence": [], "category": 4},
    {"question": "Did Bo adopt the parrot?", "adversarial_answer": "no", "evidence": ["D1:3"], "category": 5},
]


def check_question(record: dict, asked: dict, conversation: str) -> None:
    """A question record: the usual contract (coverage included: the question is the current
    turn, never stored), plus ``question``."""
    check_record(record)
    assert set(record["question"]) == QUESTION_KEYS
    assert record["question"]["text"] == asked["question"]
    assert record["question"]["answer"] == str(asked["answer"])
    assert record["question"]["category"] == asked["category"]
    assert record["question"]["conversation"] == conversation
    assert record["messages"][-1] == {"role": "user", "content": asked["question"]}
    assert record["sources"][-1] == {"id": None, "kind": "current"}
    assert record["recall"]["query"] == asked["question"]


def test_a_locomo_file_may_hold_a_list_of_conversations_as_the_dataset_does(tmp_path):
    def conversation(a: str, b: str, **extra: object) -> dict:
        turns = [{"speaker": a, "dia_id": "D1:1", "text": f"Hi {b}"}, {"speaker": b, "dia_id": "D1:2", "text": "Hi"}]
        return {"conversation": {"speaker_a": a, "speaker_b": b, "session_1": turns}, "qa": [], **extra}

    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([conversation("Ann", "Bo", sample_id="conv-7"), conversation("Cy", "Di")]))
    records = replay(tmp_path, str(path), "--format", "locomo", "--mode", "quick-answer")
    assert [(r["conversation"], r["call"]) for r in records] == [("conv-7", 0), ("locomo10-2", 0)]
    assert [r["messages"][-1]["content"] for r in records] == ["Hi Bo", "Hi Di"]


def test_locomo_questions_are_asked_unstored_with_their_evidence(tmp_path, settings):
    settings.MEMORY_RECALL_SCOPE = "chat"
    fact = "Big news: my sister Henrietta adopted a parrot named Zorblax in Lisbon last week."
    path = tmp_path / "conv-7.json"
    path.write_text(json.dumps(crafted_locomo("conv-7", fact, PARROT_QA)))
    records = replay(
        tmp_path, str(path), "--format", "locomo", "--mode", "quick-answer", "--context-window", "1024", "--questions"
    )
    replayed = [r for r in records if "question" not in r]
    asked = [r for r in records if "question" in r]
    assert all(set(r) == KEYS for r in replayed)
    assert [r["call"] for r in records] == list(range(len(records)))
    # Categories 1-4 with an answer, in file order; the adversarial one (5) is not asked.
    assert [r["question"]["category"] for r in asked] == [1, 2, 4]
    for record, qa in zip(asked, PARROT_QA, strict=False):
        assert set(record) == KEYS | {"question"}
        check_question(record, qa, "conv-7")
    # Nothing was stored for the questions: each sees exactly the stored conversation.
    stored = list(Message.objects.order_by("id").values_list("id", flat=True))
    assert len(stored) == 4 + 24 and all(r["stored_message_ids"] == stored for r in asked)
    # Evidence ids are the stored messages of the annotated turns ("D1:3; D2:2" is two turns).
    fact_id = Message.objects.get(content=fact).pk
    d2_2 = Message.objects.filter(role="user").order_by("id")[3]  # D1:1, D1:3, D2:1, D2:2
    assert asked[0]["question"]["evidence"] == ["D1:3"] and asked[0]["question"]["evidence_message_ids"] == [fact_id]
    assert asked[1]["question"]["evidence"] == ["D1:3", "D2:2"]
    assert asked[1]["question"]["evidence_message_ids"] == [fact_id, d2_2.pk]
    assert d2_2.content == FILLER[(1 + 2) % 6]
    assert asked[2]["question"]["evidence_message_ids"] == []
    # The first session was folded into the summary long ago: the fact comes back verbatim, recalled.
    first = asked[0]
    assert first["summary"]["last_message_id"] > fact_id
    recalled = next(s for s in first["sources"] if s["kind"] == "recall")
    assert fact_id in recalled["message_ids"]
    assert fact in first["messages"][first["sources"].index(recalled)]["content"]
    # Ann's turn without a reply (D2:1) pins nothing: no lease is left once the questions start.
    assert not TurnLease.objects.exists()


def test_questions_from_another_conversation_are_a_noise_check(tmp_path, settings):
    settings.MEMORY_RECALL_SCOPE = "chat"
    path = tmp_path / "conv-7.json"
    other = tmp_path / "conv-8.json"
    path.write_text(json.dumps(crafted_locomo("conv-7", "I finally repaired the old bicycle in the garage.", [])))
    fact = "Big news: my sister Henrietta adopted a parrot named Zorblax in Lisbon last week."
    other.write_text(json.dumps(crafted_locomo("conv-8", fact, PARROT_QA)))
    records = replay(
        tmp_path,
        str(path),
        "--format",
        "locomo",
        "--mode",
        "quick-answer",
        "--context-window",
        "1024",
        "--questions",
        "--questions-from",
        str(other),
    )
    asked = [r for r in records if "question" in r]
    assert [r["question"]["text"] for r in asked] == [qa["question"] for qa in PARROT_QA[:3]]
    assert {r["conversation"] for r in records} == {"conv-7"}
    for record, qa in zip(asked, PARROT_QA, strict=False):
        check_question(record, qa, "conv-8")
        # Its evidence lies in a conversation that was never stored here; nothing about it is recalled.
        assert record["question"]["evidence_message_ids"] == []
        assert record["recall"]["items"] == []
        assert not any("Zorblax" in (m["content"] or "") for m in record["messages"][:-1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "tau-bench", "--questions"], "needs --format locomo"),
        (["--format", "locomo", "--questions-from", "x.json"], "needs --questions"),
    ],
)
def test_question_options_are_checked(tmp_path, args, message):
    path = tmp_path / "input.json"
    path.write_text("[]")
    with pytest.raises(CommandError, match=message):
        call_command("replay", str(path), *args, "--out", str(tmp_path / "o.jsonl"))
