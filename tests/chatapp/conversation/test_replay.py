"""``manage.py replay``: the JSON Lines contract, on real transcripts from ../shared/data
(skipped when absent) and on small crafted files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

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
}

pytestmark = pytest.mark.django_db


def replay(tmp_path: Path, *args: str) -> list[dict]:
    out = tmp_path / "out.jsonl"
    call_command("replay", *args, "--out", str(out))
    return [json.loads(line) for line in out.read_text().splitlines()]


def check_record(record: dict) -> None:
    """The contract of one line, and exact coverage (docs/memory.md I4) from the line alone."""
    assert set(record) == KEYS
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
    first = records[0]
    assert first["call"] == 0 and first["messages"][0]["content"] == data[0]["traj"][0]["content"]


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
    assert records[1]["messages"][-1] == {"role": "user", "content": "Look [shares an image: a photo of a cat]"}
    assert records[1]["messages"][-2] == {"role": "assistant", "content": "[1 May 2023] Hi Ann"}


@pytest.mark.parametrize(
    ("content", "fmt", "message"),
    [
        (None, "tau-bench", "does not exist"),
        ("{not json", "tau-bench", "not readable JSON"),
        ('{"a": 1}', "tau-bench", "JSON list"),
        ("[]", "locomo", "speaker_a"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, content, fmt, message):
    path = tmp_path / "input.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CommandError, match=message):
        call_command("replay", str(path), "--format", fmt, "--out", str(tmp_path / "o.jsonl"))


def test_in_sync_mode_requests_compress_themselves_and_no_job_runs(tmp_path, settings):
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
    assert not MemoryJobState.objects.exists()
