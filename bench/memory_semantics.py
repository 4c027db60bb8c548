"""Does memory keep what the user *meant*? Scenario replays checked on the last request
(docs/memory.md F-46 to F-54).

Each scenario of ``bench/scenarios/semantics/<kind>.json`` (kinds: :data:`KINDS`) is a list of
LoCoMo-format conversations replayed in order under one owner (``manage.py replay --format
locomo --questions``, docs/replay.md) in a fresh SQLite database; the last conversation's single
``qa`` item is asked as the final request, never stored, and the checks apply to that request's
replay record. Deterministic filler turns (``bench/scenarios/filler.json``) are inserted after the
turns named in ``filler_after`` (``"D1:2"``, or ``"<sample_id>#D1:2"`` when the scenario has
several conversations; always an assistant turn), ``filler_pairs`` user/assistant pairs each
(default :data:`FILLER_PAIRS`), so that the facts are folded out of a 2,048-token window.

``expect`` keys, all optional:

- ``current``: ``[{"key"?, "value", "polarity"?, "provenance"?, "status"?}]``: a current fact of
  the request matches (value and key as case-insensitive substrings; ``polarity`` ``positive`` or
  ``negative``; ``provenance`` ``user``, ``tool_args``, ``mentioned`` or ``tool_result``;
  ``status`` ``pinned``, ``in_window`` or ``over_budget``, or a list of them);
- ``not_current``: values (strings) or the same objects: no current fact matches;
- ``absent``: strings in no memory-written block (messages whose source kind is ``summary``,
  ``facts`` or ``recall``), case-sensitive;
- ``recalled``: strings in the recall block (case-insensitive);
- ``wire_contains``: strings somewhere in the request's messages (case-insensitive);
- ``provenance``: ``{value: provenance}``: every current fact holding the value has it.

Current facts are the record's ``facts.entries`` (``{"id", "kind", "key", "value", "polarity",
"provenance", "status", "note"}``). A record without them is read from the key-facts block's text:
pinned facts only, polarity guessed from the slot name (``dislikes`` is negative); provenance and
other statuses cannot be read there, so checks that need them fail, saying why.

    python bench/memory_semantics.py [--kinds update,withdrawal] [--names withdrawal-03]
        [--extraction rule|llm] [--context-window 2048] [--jobs N] [--embedding per-kind|none|local|auto]
        [--keep DIR]
    python bench/memory_semantics.py --check RECORDS.jsonl --scenario NAME

Prints one line per failing check (``FAIL``) and per vacuous pass (``VACUOUS``: a ``not_current``
value that no request of the replay ever held), ``kind_<kind>=k/n`` per kind, and as its last line
``semantics_pass=<k>/<n>`` followed by the per-kind figures, ``vacuous_checks``, the extraction and
the window.
``--extraction llm`` (the default) is the memory job's extraction with the configured model (the
offline engine unless one is configured); ``rule`` turns it off (``MEMORY_FACTS_EXTRACTION=0``).
``--embedding per-kind`` (the default) uses the bundled embedder for the ``paraphrase`` kind only
(recall by meaning needs one; the others run faster without).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "bench" / "scenarios" / "semantics"
FILLER = ROOT / "bench" / "scenarios" / "filler.json"
KINDS = (
    "update",
    "withdrawal",
    "polarity",
    "self_correction",
    "quoted",
    "pasted_bulk",
    "secrets",
    "relative_dates",
    "paraphrase",
    "cross_chat",
)
EXPECT_KEYS = frozenset({"current", "not_current", "absent", "recalled", "wire_contains", "provenance"})
FACT_FIELDS = frozenset({"key", "value", "polarity", "provenance", "status"})
MEMORY_KINDS = frozenset({"summary", "facts", "recall"})
# User/assistant filler pairs inserted at each ``filler_after`` turn.
FILLER_PAIRS = 12
# Kinds replayed with the bundled embedder under ``--embedding per-kind``.
EMBEDDER_KINDS = frozenset({"paraphrase"})
QUESTION_CATEGORIES = (1, 2, 3, 4)
# Slot names of negative preferences or states, for records without ``facts.entries``.
NEGATIVE_SLOT = re.compile(r"dislike|hate|avoid|no_longer|not_|former", re.IGNORECASE)

Scenario = dict[str, Any]
Record = dict[str, Any]


@dataclass(frozen=True)
class CheckResult:
    """One check of a scenario on a record: ``check`` (an ``expect`` key), ``target`` (what was
    checked, as shown), ``ok``, and ``reason`` (why it failed, or what matched); ``vacuous``: a
    ``not_current`` pass for a value no earlier request held as a current fact either (the
    replay never stored it, so the pass says nothing)."""

    check: str
    target: str
    ok: bool
    reason: str
    vacuous: bool = False


# --- scenarios -------------------------------------------------------------------------------


def scenarios_load(kinds: Iterable[str] = KINDS, names: Iterable[str] | None = None) -> list[Scenario]:
    """The scenarios of ``kinds`` (file order), only those named in ``names`` when given."""
    wanted = set(names) if names is not None else None
    found = []
    for kind in kinds:
        path = SCENARIOS / f"{kind}.json"
        for scenario in json.loads(path.read_text(encoding="utf-8")):
            if wanted is None or scenario["name"] in wanted:
                found.append(scenario)
    return found


def scenario_problems(scenario: Scenario) -> list[str]:
    """What is wrong with a scenario's structure (empty when it is well-formed)."""
    problems = []
    name = scenario.get("name", "?")
    if scenario.get("kind") not in KINDS:
        problems.append(f"{name}: kind {scenario.get('kind')!r} is not one of {', '.join(KINDS)}")
    if not str(scenario.get("note", "")).strip():
        problems.append(f"{name}: no note")
    conversations = scenario.get("conversations") or []
    if not conversations:
        problems.append(f"{name}: no conversations")
    for position, item in enumerate(conversations):
        conversation = item.get("conversation", {})
        if not {"speaker_a", "speaker_b", "session_1"} <= set(conversation):
            problems.append(f"{name}: conversation {position} lacks speaker_a, speaker_b or session_1")
        qa = item.get("qa") or []
        last = position == len(conversations) - 1
        if last and (len(qa) != 1 or qa[0].get("category") not in QUESTION_CATEGORIES or "answer" not in qa[0]):
            problems.append(f"{name}: the last conversation needs exactly one qa item of category 1-4 with an answer")
        if not last and qa:
            problems.append(f"{name}: only the last conversation asks a question")
    unknown = set(scenario.get("expect", {})) - EXPECT_KEYS
    if unknown:
        problems.append(f"{name}: unknown expect keys {sorted(unknown)}")
    for key in ("current", "not_current"):
        for item in scenario.get("expect", {}).get(key, []):
            if isinstance(item, dict) and (set(item) - FACT_FIELDS or "value" not in item):
                problems.append(f"{name}: {key} item {item} needs a value and only {sorted(FACT_FIELDS)}")
    try:
        with_filler(scenario)
    except ValueError as exc:
        problems.append(f"{name}: {exc}")
    return problems


def _turns(item: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    conversation = item["conversation"]
    for key in sorted(
        (k for k in conversation if k.startswith("session_") and k[8:].isdigit()), key=lambda k: int(k[8:])
    ):
        for turn in conversation[key]:
            yield key, turn


def filler_texts() -> dict[str, list[str]]:
    """The filler bank: ``{"user": [...], "assistant": [...]}``."""
    data: dict[str, list[str]] = json.loads(FILLER.read_text(encoding="utf-8"))
    return data


def with_filler(scenario: Scenario, filler: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """The scenario's conversations with filler pairs inserted after each ``filler_after`` turn
    (deterministic: the bank's lines from an offset given by the scenario's name). Raises
    ValueError for a ``filler_after`` entry that names no assistant turn."""
    bank = filler or filler_texts()
    pairs = int(scenario.get("filler_pairs", FILLER_PAIRS))
    conversations = json.loads(json.dumps(scenario["conversations"]))
    several = len(conversations) > 1
    places: dict[tuple[int, str], int] = {}
    for entry in scenario.get("filler_after", []):
        sample, _, dia_id = entry.rpartition("#") if several else ("", "", entry)
        matches = [
            (index, turn)
            for index, item in enumerate(conversations)
            if not several or item.get("sample_id") == sample
            for _, turn in _turns(item)
            if turn.get("dia_id") == dia_id
        ]
        if len(matches) != 1:
            raise ValueError(f"filler_after {entry!r} names {len(matches)} turns, not one")
        index, turn = matches[0]
        if turn.get("speaker") != conversations[index]["conversation"]["speaker_b"]:
            raise ValueError(f"filler_after {entry!r} is not an assistant turn")
        places[(index, dia_id)] = len(places)
    offset = zlib.crc32(scenario["name"].encode())
    for index, item in enumerate(conversations):
        conversation = item["conversation"]
        user, assistant = conversation["speaker_a"], conversation["speaker_b"]
        for key in dict.fromkeys(key for key, _ in _turns(item)):
            session = []
            for turn in conversation[key]:
                session.append(turn)
                place = places.get((index, turn.get("dia_id", "")))
                if place is None:
                    continue
                for k in range(pairs):
                    n = offset + place * pairs + k
                    session.append(
                        {"speaker": user, "dia_id": f"{turn['dia_id']}.f{2 * k}", "text": _pick(bank["user"], n)}
                    )
                    session.append(
                        {
                            "speaker": assistant,
                            "dia_id": f"{turn['dia_id']}.f{2 * k + 1}",
                            "text": _pick(bank["assistant"], n * 7),
                        }
                    )
            conversation[key] = session
    return conversations


def _pick(lines: Sequence[str], n: int) -> str:
    return lines[n % len(lines)]


# --- checks ----------------------------------------------------------------------------------


def scenario_check(scenario: Scenario, record: Record, earlier: Sequence[Record] = ()) -> list[CheckResult]:
    """Every check of the scenario's ``expect`` on ``record`` (the final question's replay record);
    ``earlier``: the replay's records before it, to tell a vacuous ``not_current`` pass."""
    expect = scenario.get("expect", {})
    if "question" not in record:
        return [CheckResult("record", "question", False, "the last record is not the question's request")]
    entries, source = fact_entries(record)
    results = []
    for item in expect.get("current", []):
        results.append(_current(item, entries, source, present=True))
    for item in expect.get("not_current", []):
        item = item if isinstance(item, dict) else {"value": item}
        result = _current(item, entries, source, present=False)
        if result.ok and earlier and not any(_matches(e, item) for r in earlier for e in fact_entries(r)[0]):
            result = replace(result, reason=result.reason + "; never current earlier either", vacuous=True)
        results.append(result)
    memory = memory_text(record)
    for text in expect.get("absent", []):
        where = [kind for kind, content in memory if text in content]
        results.append(
            CheckResult("absent", text, not where, f"found in the {', '.join(where)} block" if where else "absent")
        )
    recall = "\n".join(content for kind, content in memory if kind == "recall")
    for text in expect.get("recalled", []):
        found = text.casefold() in recall.casefold()
        reason = "in the recall block" if found else ("not in the recall block" if recall else "no recall block")
        results.append(CheckResult("recalled", text, found, reason))
    wire = "\n".join(_content(message) for message in record.get("messages", []))
    for text in expect.get("wire_contains", []):
        found = text.casefold() in wire.casefold()
        results.append(CheckResult("wire_contains", text, found, "on the wire" if found else "not in the request"))
    for value, wanted in expect.get("provenance", {}).items():
        results.append(_provenance(value, wanted, entries, source))
    return results


def fact_entries(record: Record) -> tuple[list[dict[str, Any]], str]:
    """The request's current facts and where they were read: ``("entries")`` from
    ``facts.entries``, else ``("block")`` from the key-facts block's text (pinned facts only,
    without provenance; polarity guessed from the slot name)."""
    facts = record.get("facts") or {}
    if isinstance(facts.get("entries"), list):
        return facts["entries"], "entries"
    return [
        {"key": key, "value": value, "status": "pinned", "polarity": _slot_polarity(key)}
        for key, value in block_facts(memory_text(record))
    ], "block"


def _slot_polarity(key: str) -> str:
    """A block line's polarity guessed from its slot name (``dislikes`` → negative)."""
    return "negative" if NEGATIVE_SLOT.search(key) else "positive"


def block_facts(memory: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(key, value)`` pairs of the key-facts block's lines (``- key: value (msg N, …)`` or
    ``- key: value; value``)."""
    pairs = []
    for kind, content in memory:
        if kind != "facts":
            continue
        for line in content.splitlines():
            if not line.startswith("- ") or ":" not in line:
                continue
            key, _, rest = line[2:].partition(":")
            rest = rest.strip()
            if rest.endswith(")") and " (" in rest:
                rest = rest[: rest.rindex(" (")]
            pairs += [(key.strip(), value.strip()) for value in rest.split("; ")]
    return pairs


def memory_text(record: Record) -> list[tuple[str, str]]:
    """``(kind, content)`` of the request's memory-written messages (summary, facts, recall)."""
    written = []
    for message, source in zip(record.get("messages", []), record.get("sources", []), strict=False):
        kinds = {source.get("kind")} | {merged.get("kind") for merged in source.get("merged", [])}
        kind = next((k for k in ("facts", "summary", "recall") if k in kinds), None)
        if kind is not None:
            written.append((kind, _content(message)))
    return written


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False) if content else ""


def _matches(entry: dict[str, Any], item: dict[str, Any]) -> bool:
    if str(item["value"]).casefold() not in str(entry.get("value", "")).casefold():
        return False
    if item.get("key") and str(item["key"]).casefold() not in str(entry.get("key", "")).casefold():
        return False
    for field in ("polarity", "provenance"):
        if field in item and entry.get(field) != item[field]:
            return False
    statuses = item.get("status")
    return statuses is None or entry.get("status") in ([statuses] if isinstance(statuses, str) else statuses)


def _describe(item: dict[str, Any]) -> str:
    extra = ", ".join(f"{k}={item[k]}" for k in ("key", "polarity", "provenance", "status") if item.get(k))
    return f"{item['value']!r}" + (f" ({extra})" if extra else "")


def _shown(entry: dict[str, Any]) -> str:
    extra = ", ".join(str(entry[k]) for k in ("status", "polarity", "provenance") if entry.get(k))
    return f"{entry.get('key')}={entry.get('value')}" + (f" ({extra})" if extra else "")


def _current(item: dict[str, Any], entries: list[dict[str, Any]], source: str, *, present: bool) -> CheckResult:
    check = "current" if present else "not_current"
    target = _describe(item)
    unreadable = [field for field in ("provenance", "status") if field in item]
    if source == "block" and unreadable and not (unreadable == ["status"] and item["status"] == "pinned"):
        return CheckResult(check, target, False, f"needs facts.entries ({', '.join(unreadable)}); the record has none")
    matched = [entry for entry in entries if _matches(entry, item)]
    note = "" if source == "entries" else " (read from the block text: the record has no facts.entries)"
    if source == "block" and "polarity" in item:
        note = note[:-1] + "; polarity from the slot name)"
    if present:
        if matched:
            return CheckResult(check, target, True, f"current as {_shown(matched[0])}{note}")
        near = [_shown(e) for e in entries if str(item["value"]).casefold() in str(e.get("value", "")).casefold()]
        reason = f"not current; same value as {', '.join(near)}" if near else "no current fact holds it"
        return CheckResult(check, target, False, reason + note)
    if matched:
        return CheckResult(check, target, False, f"still current as {'; '.join(_shown(e) for e in matched)}{note}")
    return CheckResult(check, target, True, "not current" + note)


def _provenance(value: str, wanted: str, entries: list[dict[str, Any]], source: str) -> CheckResult:
    target = f"{value!r} from {wanted}"
    if source == "block":
        return CheckResult("provenance", target, False, "needs facts.entries (provenance); the record has none")
    matched = [entry for entry in entries if value.casefold() in str(entry.get("value", "")).casefold()]
    if not matched:
        return CheckResult("provenance", target, False, "no current fact holds it")
    wrong = [entry for entry in matched if entry.get("provenance") != wanted]
    if wrong:
        return CheckResult("provenance", target, False, f"provenance of {'; '.join(_shown(e) for e in wrong)}")
    return CheckResult("provenance", target, True, f"{len(matched)} fact(s) from {wanted}")


def records_read(path: Path) -> list[Record]:
    """The records of a replay's JSON Lines, in order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- replays ---------------------------------------------------------------------------------


def template_database(directory: Path) -> Path:
    """A freshly migrated SQLite database to copy for each scenario (migrating once per run)."""
    path = directory / "template.sqlite3"
    env = _environment(path)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    return path


def _environment(database: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"SQLITE_PATH": str(database), "MEMORY_RECALL_SCOPE": "owner"}, **(extra or {}))
    return env


def scenario_replay(
    scenario: Scenario,
    *,
    directory: Path,
    template: Path,
    extraction: str,
    embedding: str,
    context_window: int,
) -> tuple[list[Record], str]:
    """Replay a scenario in ``directory`` (its LoCoMo file, records and database) from a copy of
    ``template``; returns its records and, when the replay failed, why."""
    directory.mkdir(parents=True, exist_ok=True)
    database = directory / "replay.sqlite3"
    shutil.copyfile(template, database)
    conversations = directory / "conversations.json"
    conversations.write_text(json.dumps(with_filler(scenario), ensure_ascii=False, indent=1), encoding="utf-8")
    records = directory / "records.jsonl"
    backend = embedding if embedding != "per-kind" else ("local" if scenario["kind"] in EMBEDDER_KINDS else "none")
    env = _environment(
        database,
        {"MEMORY_FACTS_EXTRACTION": "1" if extraction == "llm" else "0", "EMBEDDING_BACKEND": backend},
    )
    command = [sys.executable, "manage.py", "replay", str(conversations), "--format", "locomo", "--questions"]
    command += ["--context-window", str(context_window), "--mode", "quick-answer", "--out", str(records)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return [], f"replay exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    written = records_read(records) if records.exists() else []
    return written, "" if written else "the replay wrote no record"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument("--names", default=None, help="comma-separated scenario names")
    parser.add_argument("--extraction", choices=["rule", "llm"], default="llm")
    parser.add_argument("--context-window", type=int, default=2048)
    parser.add_argument("--jobs", type=int, default=1, help="scenarios replayed in parallel")
    parser.add_argument("--embedding", choices=["per-kind", "none", "local", "auto"], default="per-kind")
    parser.add_argument("--keep", type=Path, default=None, help="keep each scenario's files in DIR/<name>/")
    parser.add_argument("--check", type=Path, default=None, help="check an existing records file instead")
    parser.add_argument("--scenario", default=None, help="with --check: the scenario's name")
    args = parser.parse_args(argv)
    kinds = [kind for kind in args.kinds.split(",") if kind]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    names = args.names.split(",") if args.names else None
    if args.check is not None:
        if not args.scenario:
            parser.error("--check needs --scenario NAME")
        return _check_file(args.check, args.scenario)
    scenarios = scenarios_load(kinds, names)
    problems = [problem for scenario in scenarios for problem in scenario_problems(scenario)]
    if problems or not scenarios:
        print("\n".join(problems or ["no scenario matched"]), file=sys.stderr)
        return 2
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="memory-semantics-"))
    keep = args.keep
    template = template_database(work)

    def run(scenario: Scenario) -> tuple[Scenario, list[CheckResult]]:
        directory = (keep or work) / scenario["name"]
        began = time.perf_counter()
        written, error = scenario_replay(
            scenario,
            directory=directory,
            template=template,
            extraction=args.extraction,
            embedding=args.embedding,
            context_window=args.context_window,
        )
        results = (
            scenario_check(scenario, written[-1], written[:-1])
            if written
            else [CheckResult("replay", "", False, error)]
        )
        verdict = "pass" if all(r.ok for r in results) else "fail"
        print(f"  {scenario['name']}: {verdict} ({time.perf_counter() - began:.1f} s)", file=sys.stderr, flush=True)
        return scenario, results

    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(run, scenarios))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report_text(outcomes, extraction=args.extraction, context_window=args.context_window))
    print(f"{len(outcomes)} scenarios in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


def report_text(outcomes: list[tuple[Scenario, list[CheckResult]]], *, extraction: str, context_window: int) -> str:
    """The bench's output: ``FAIL``/``VACUOUS`` lines, a figure per kind, the last key=value line."""
    lines = []
    for scenario, results in outcomes:
        for result in results:
            if not result.ok or result.vacuous:
                verdict = "FAIL" if not result.ok else "VACUOUS"
                lines.append(f"{verdict} {scenario['name']} {result.check} {result.target}: {result.reason}")
    figures = []
    for kind in KINDS:
        ran = [results for scenario, results in outcomes if scenario["kind"] == kind]
        if ran:
            figures.append(f"kind_{kind}={sum(all(r.ok for r in results) for results in ran)}/{len(ran)}")
    lines += figures
    passed = sum(all(r.ok for r in results) for _, results in outcomes)
    vacuous = sum(r.vacuous for _, results in outcomes for r in results)
    lines.append(
        f"semantics_pass={passed}/{len(outcomes)} {' '.join(figures)} vacuous_checks={vacuous} "
        f"extraction={extraction} context_window={context_window}"
    )
    return "\n".join(lines)


def _check_file(path: Path, name: str) -> int:
    matched = [scenario for scenario in scenarios_load() if scenario["name"] == name]
    if not matched:
        print(f"no scenario named {name}", file=sys.stderr)
        return 2
    written = records_read(path)
    results = (
        scenario_check(matched[0], written[-1], written[:-1])
        if written
        else [CheckResult("record", "", False, "no record")]
    )
    for result in results:
        verdict = "FAIL" if not result.ok else "VACUOUS" if result.vacuous else "PASS"
        print(f"{verdict} {name} {result.check} {result.target}: {result.reason}")
    passed = all(result.ok for result in results)
    print(f"semantics_pass={int(passed)}/1 scenario={name}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
