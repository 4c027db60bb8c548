"""Cost of rule extraction at store time (docs/memory.md §11): ``memory.facts.message_rule_facts``
timed on every user message and every assistant tool call of the tau-bench and LoCoMo data
(../shared/data), each run ``--repeat`` times; pure Python, no database. Prints p50/p95/max in
microseconds per message and, as its last line, ``extraction_p50_us=<a> extraction_p95_us=<b> messages=<n>``.

    python bench/facts_extraction_cost.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memory.facts.rules import message_rule_facts  # noqa: E402

DATA = ROOT.parent / "shared" / "data"


def messages() -> list[dict]:
    """User messages and assistant tool calls of the shared data, with ids."""
    found: list[dict] = []
    tau = DATA / "tau-bench-airline" / "trajectories.json"
    for item in json.loads(tau.read_text(encoding="utf-8")):
        for message in item["traj"]:
            if message.get("role") == "user" or message.get("tool_calls"):
                found.append({**message, "id": len(found) + 1})
    for path in sorted((DATA / "locomo").glob("conv-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        conversation = data.get("conversation", data)
        for key, turns in conversation.items():
            if key.startswith("session_") and isinstance(turns, list):
                found.extend({"role": "user", "content": t.get("text", ""), "id": len(found) + 1} for t in turns)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if not DATA.exists():
        print(f"the shared data folder is absent ({DATA})")
        return 1
    sample = messages()
    timings: list[float] = []
    facts = 0
    for _ in range(args.repeat):
        for message in sample:
            started = time.perf_counter()
            facts += len(message_rule_facts(message))
            timings.append((time.perf_counter() - started) * 1e6)
    timings.sort()
    p50, p95 = statistics.median(timings), timings[int(0.95 * len(timings))]
    print(f"{len(sample)} messages x {args.repeat}: p50 {p50:.1f} us, p95 {p95:.1f} us, max {timings[-1]:.0f} us")
    print(f"facts found per pass: {facts // args.repeat}")
    print(f"extraction_p50_us={p50:.1f} extraction_p95_us={p95:.1f} messages={len(sample)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
