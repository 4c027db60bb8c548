"""What the model still sees of what the user typed (key facts, docs/memory.md §11).

Reads the JSON Lines of ``manage.py replay`` over a tau-bench file and the same tau-bench file.
For every model call it takes the **values** of the conversation so far that a user typed or a
tool was called with, and checks that each is visible somewhere in the request that was sent
(system prompt, key-facts block, summary, window or current turn). The definition of a value is
deliberately independent of the product's extractor: in user text, every token holding a digit
of at least 4 characters (punctuation trimmed) and every currency amount; in tool-call
arguments, every string or number leaf of one word holding a digit, of at least 3 characters,
and the values of a leaf of several words read as text (a note's "$305" is one); an arithmetic
expression (a calculator's ``152 + 103``) holds none. Prints the
share of values missing, the conversations that lose one, the key-facts block's size
(p50/p90/max tokens) and, as its last line,
``missing_values=<n> missing_share=<x> conversations_losing=<k> facts_block_p90_tokens=<t>``.

    python manage.py replay ../shared/data/tau-bench-airline/trajectories.json --format tau-bench \\
        --context-window 2048 --mode agent --out /tmp/replay-2048.jsonl
    python bench/facts_visibility.py /tmp/replay-2048.jsonl ../shared/data/tau-bench-airline/trajectories.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

TOKEN = re.compile(r"[^\s,;:!?()\[\]{}\"']+")
MONEY = re.compile(r"[$€£¥]\s?\d+(?:,\d{3})*(?:\.\d+)?")
# A calculator's expression ("1417 + 1440"): the tool was called with arithmetic, not a value.
EXPRESSION = re.compile(r"[\d\s+\-*/().,%]+")


def typed_values(message: dict[str, Any]) -> set[str]:
    """The values of one recorded message a later request should still show (see the module
    docstring for the definition)."""
    found: set[str] = set()
    if message.get("role") == "user":
        found |= text_values(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        raw = (call.get("function") or {}).get("arguments") or "{}"
        try:
            arguments = json.loads(raw)
        except ValueError:
            continue
        for leaf in _leaves(arguments):
            if EXPRESSION.fullmatch(leaf) and any(op in leaf for op in "+-*/"):
                continue
            if " " in leaf.strip():
                found |= text_values(leaf)
            elif len(leaf) >= 3 and any(ch.isdigit() for ch in leaf):
                found.add(leaf)
    return found


def text_values(text: str) -> set[str]:
    """The values of free text: currency amounts and tokens of 4+ characters holding a digit."""
    found = {m.group(0) for m in MONEY.finditer(text)}
    for match in TOKEN.finditer(text):
        token = match.group(0).strip(".")
        if len(token) >= 4 and any(ch.isdigit() for ch in token):
            found.add(token)
    return found


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    if value is None or isinstance(value, bool):
        return []
    return [str(value)]


def request_text(record: dict[str, Any]) -> str:
    """Everything the model was sent, as one string (contents and tool-call arguments)."""
    parts = []
    for message in record["messages"]:
        content = message.get("content")
        parts.append(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
        for call in message.get("tool_calls") or ():
            parts.append((call.get("function") or {}).get("arguments") or "")
    return "\n".join(parts)


def conversations(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Recorded messages (system prompt dropped) by the replay's conversation name."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out = {}
    for index, item in enumerate(data):
        traj = item["traj"]
        start = 1 if traj and traj[0].get("role") == "system" else 0
        out[f"tau-bench-{index}-task{item.get('task_id')}-trial{item.get('trial')}"] = traj[start:]
    return out


def percentile(values: list[int], share: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replay", type=Path, help="JSON Lines written by manage.py replay")
    parser.add_argument("trajectories", type=Path, help="the tau-bench trajectories.json that was replayed")
    parser.add_argument("--show", type=int, default=10, help="print this many missing values")
    args = parser.parse_args()
    recorded = conversations(args.trajectories)
    checks = missing = 0
    losing: dict[str, set[str]] = defaultdict(set)
    block_tokens: list[int] = []
    examples: list[str] = []
    calls = 0
    for line in args.replay.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        messages = recorded[record["conversation"]]
        calls += 1
        # The messages before this model call: everything up to its assistant message.
        assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        earlier = messages[: assistants[record["call"]]]
        values = set().union(*(typed_values(m) for m in earlier)) if earlier else set()
        sent = request_text(record)
        facts = record.get("facts") or {}
        if facts.get("tokens"):
            block_tokens.append(int(facts["tokens"]))
        for value in sorted(values):
            checks += 1
            if value not in sent:
                missing += 1
                losing[record["conversation"]].add(value)
                if len(examples) < args.show:
                    examples.append(f"{record['conversation']} call {record['call']}: {value!r}")
    share = missing / checks if checks else 0.0
    print(f"model calls: {calls}; value checks: {checks}; missing: {missing} ({share:.2%})")
    print(f"conversations losing at least one value: {len(losing)} of {len(recorded)}")
    if block_tokens:
        print(
            f"key-facts block (calls that had one: {len(block_tokens)}): p50 {statistics.median(block_tokens):.0f}, "
            f"p90 {percentile(block_tokens, 0.9)}, max {max(block_tokens)} tokens"
        )
    for example in examples:
        print(f"  missing: {example}")
    print(
        f"missing_values={missing} missing_share={share:.4f} conversations_losing={len(losing)} "
        f"facts_block_p90_tokens={percentile(block_tokens, 0.9)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
