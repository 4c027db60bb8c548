"""Check every record of ``manage.py replay`` JSON Lines against the replay contract and exact
coverage (docs/replay.md; the same ``check_record`` the test suite runs on five conversations),
count refused requests (``overflow``) and report the key-facts block's size (p50/p90/max tokens).
Last line per file: ``records=<n> violations=<v> overflow=<o> facts_block_p50=<a> facts_block_p90=<b> facts_block_max=<c>``.

    python bench/replay_check.py /tmp/replay-2048.jsonl [more.jsonl ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")

import django  # noqa: E402

django.setup()

from tests.chatapp.conversation.test_replay import check_record  # noqa: E402


def main() -> int:
    for path in sys.argv[1:]:
        records = violations = overflow = 0
        blocks: list[int] = []
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            records += 1
            try:
                check_record(record)
            except AssertionError as exc:
                violations += 1
                if violations <= 3:
                    print(f"  violation: {record['conversation']} call {record['call']}: {str(exc)[:200]}")
            overflow += bool(record["overflow"])
            if (record.get("facts") or {}).get("tokens"):
                blocks.append(int(record["facts"]["tokens"]))
        blocks.sort()

        def share(p: float, values: list[int] = blocks) -> int:
            return values[min(len(values) - 1, int(p * len(values)))] if values else 0

        print(f"{path}: {records} records, {len(blocks)} with a key-facts block")
        print(
            f"records={records} violations={violations} overflow={overflow} facts_block_p50={share(0.5)} "
            f"facts_block_p90={share(0.9)} facts_block_max={blocks[-1] if blocks else 0}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
