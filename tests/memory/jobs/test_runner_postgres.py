"""Memory jobs are single-flight across processes (docs/memory.md §10, "memory job"): two worker
processes sharing PostgreSQL run the same conversation's job over and over, and no two runs
overlap. PostgreSQL only: the embedded default has one worker process."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from memory.storage.job_state import memory_job_state_get

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[3]
RUNS_PER_WORKER = 5

WORKER = """
import asyncio, json, os, sys, time

import django

django.setup()

from memory.jobs.runner import MemoryJobRunner
from memory.storage.job_state import OrmJobStore


class Probe:
    name = "probe"

    async def due(self, memory_key):
        return True

    async def run(self, memory_key, watermark):
        started = time.time()
        await asyncio.sleep(0.1)
        with open(sys.argv[1], "a") as log:
            log.write(json.dumps([os.getpid(), started, time.time()]) + "\\n")
        return (watermark or 0) + 1


async def main():
    runner = MemoryJobRunner(
        store=OrmJobStore(), steps=[Probe()], owner=f"worker-{os.getpid()}", debounce_seconds=0, lease_seconds=30
    )
    for _ in range(int(sys.argv[2])):
        run = await runner.run_now("shared")
        assert run is not None and run.ok, run


asyncio.run(main())
"""


def test_two_processes_never_run_one_conversations_job_at_once(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("two worker processes need a shared server database: PostgreSQL only (DATABASE_URL)")
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "chatapp.settings", "PYTHONPATH": str(ROOT)}
    log = tmp_path / "runs.jsonl"
    workers = [
        subprocess.Popen(  # our own interpreter and script
            [sys.executable, "-c", WORKER, str(log), str(RUNS_PER_WORKER)], cwd=ROOT, env=env
        )
        for _ in range(2)
    ]
    assert [worker.wait(timeout=60) for worker in workers] == [0, 0]

    runs = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda run: run[1])
    assert len(runs) == 2 * RUNS_PER_WORKER
    assert len({pid for pid, _, _ in runs}) == 2, "both workers ran the job"
    for (_, _, ended), (_, started, _) in itertools.pairwise(runs):
        assert started >= ended, "two runs of one conversation's job overlapped"
    state = memory_job_state_get(memory_key="shared")
    assert state.watermarks == {"probe": 2 * RUNS_PER_WORKER}, "every run read the watermark the previous one wrote"
    assert (state.status, state.lease_owner, state.runs) == ("idle", "", 2 * RUNS_PER_WORKER)
