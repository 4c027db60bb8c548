"""Memory jobs (docs/memory.md §10, "memory job"): debounced and coalescing in a process,
single-flight across workers through the job store's lease, one watermark per step that only a
successful attempt moves. The store contract runs on both the database and the in-memory store."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync

from memory.jobs.runner import MemoryJobRunner, in_memory_job
from memory.jobs.state import InMemoryJobStore, JobStore, StepAttempt
from memory.models import MemoryJobState
from memory.storage.job_state import OrmJobStore
from memory.storage.summaries import session_memory_delete


class Step:
    """A step that records its calls, advances to ``next_watermark`` and can be made to fail or
    to wait on an event."""

    def __init__(self, name: str = "compress", *, next_watermark: int = 10) -> None:
        self.name = name
        self.next_watermark = next_watermark
        self.calls: list[tuple[str, int | None]] = []
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.active = 0
        self.most_active = 0
        self.entered = asyncio.Event()
        self.is_due = True

    async def due(self, memory_key: str) -> bool:
        return self.is_due

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        self.calls.append((memory_key, watermark))
        self.entered.set()
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            return self.next_watermark
        finally:
            self.active -= 1


def runner(store: JobStore, *steps: Step, owner: str = "worker-a", debounce: float = 0.01) -> MemoryJobRunner:
    return MemoryJobRunner(store=store, steps=list(steps), owner=owner, debounce_seconds=debounce, lease_seconds=30)


async def settle(jobs: MemoryJobRunner, key: str) -> None:
    assert await jobs.wait(key, 5), "the job did not end"


async def test_schedules_in_quick_succession_make_one_job():
    store, step = InMemoryJobStore(), Step()
    jobs = runner(store, step, debounce=0.05)
    for _ in range(5):
        jobs.schedule("k")
    await settle(jobs, "k")
    assert step.calls == [("k", None)]
    state = await store.get("k")
    assert (state.status, state.watermarks, state.runs, state.lease_owner) == ("idle", {"compress": 10}, 1, "")


async def test_a_jobs_steps_run_marked_as_memory_job_work_and_the_caller_stays_unmarked():
    """An LLM client that limits requests per server lets a user's turn go before this work (docs/memory.md §6)."""
    seen: list[bool] = []

    class Marked(Step):
        async def run(self, memory_key: str, watermark: int | None) -> int | None:
            seen.append(in_memory_job())
            return await super().run(memory_key, watermark)

    jobs = runner(InMemoryJobStore(), Marked())
    await jobs.run_now("k")
    assert seen == [True] and in_memory_job() is False


async def test_a_schedule_while_the_job_runs_runs_it_once_more_from_the_new_watermark():
    store, step = InMemoryJobStore(), Step()
    step.gate = asyncio.Event()
    jobs = runner(store, step)
    jobs.schedule("k")
    await step.entered.wait()
    jobs.schedule("k")
    jobs.schedule("k")  # merges into the re-run already queued
    step.next_watermark = 12
    step.gate.set()
    await settle(jobs, "k")
    assert step.calls == [("k", None), ("k", 12)]
    assert (await store.get("k")).runs == 2


def idle_runner(store: JobStore, *steps: Step, idle: float = 30.0, batch: int = 3) -> MemoryJobRunner:
    return MemoryJobRunner(
        store=store, steps=list(steps), owner="worker-a", debounce_seconds=0.01, idle_seconds=idle, batch_turns=batch
    )


async def test_an_idle_schedule_waits_for_the_chat_to_go_quiet_and_each_reply_pushes_it_back():
    store, step = InMemoryJobStore(), Step()
    jobs = idle_runner(store, step, idle=0.2, batch=100)
    for _ in range(4):
        jobs.schedule("k", idle=True)
        await asyncio.sleep(0.1)  # replies closer together than the idle time
        assert jobs.waits_for_idle("k") and step.calls == []
    await asyncio.sleep(0.4)
    assert step.calls == [("k", None)], "one job once the chat was quiet"
    assert not jobs.busy("k")


async def test_the_batch_turns_th_idle_schedule_starts_the_job_at_once():
    store, step = InMemoryJobStore(), Step()
    jobs = idle_runner(store, step, batch=3)
    jobs.schedule("k", idle=True)
    jobs.schedule("k", idle=True)
    assert jobs.waits_for_idle("k")
    jobs.schedule("k", idle=True)
    assert not jobs.waits_for_idle("k") and jobs.busy("k")
    await settle(jobs, "k")
    assert step.calls == [("k", None)]
    jobs.schedule("k", idle=True)
    assert jobs.waits_for_idle("k"), "the count starts again after a job"
    await jobs.close()


async def test_an_urgent_schedule_starts_a_pending_idle_job_and_is_never_delayed_by_one():
    store, step = InMemoryJobStore(), Step()
    jobs = idle_runner(store, step)
    jobs.schedule("k", idle=True)
    jobs.schedule("k")
    assert not jobs.waits_for_idle("k")
    jobs.schedule("k", idle=True)
    assert not jobs.waits_for_idle("k"), "an idle schedule does not push back an urgent job"
    await settle(jobs, "k")
    assert step.calls == [("k", None)]


async def test_a_request_waiting_for_the_job_starts_a_pending_idle_one():
    store, step = InMemoryJobStore(), Step()
    jobs = idle_runner(store, step)
    jobs.schedule("k", idle=True)
    assert await jobs.wait("k", 5), "the job ran at once, not after the idle time"
    assert step.calls == [("k", None)]


async def test_an_idle_schedule_while_the_job_runs_queues_an_idle_rerun():
    store, step, ended = InMemoryJobStore(), Step(), asyncio.Event()
    step.gate = asyncio.Event()
    jobs = MemoryJobRunner(
        store=store,
        steps=[step],
        owner="worker-a",
        debounce_seconds=0.01,
        idle_seconds=30,
        on_done=lambda _: ended.set(),
    )
    jobs.schedule("k")
    await step.entered.wait()
    jobs.schedule("k", idle=True)
    step.gate.set()
    await ended.wait()
    await asyncio.sleep(0)  # the job's task queues the re-run right after its callback
    assert jobs.waits_for_idle("k") and len(step.calls) == 1
    await jobs.close()


async def test_a_job_with_nothing_due_takes_no_lease_and_writes_nothing():
    store, step = InMemoryJobStore(), Step()
    step.is_due = False
    done: list = []
    jobs = MemoryJobRunner(store=store, steps=[step], owner="a", debounce_seconds=0, on_done=done.append)
    run = await jobs.run_now("k")
    assert run is not None and run.idle and run.ok
    assert step.calls == [] and store.states == {}
    assert done == [run], "the callback still hears of it (the page's job panel is refreshed)"


async def test_a_failed_step_keeps_its_watermark_and_the_others_still_run():
    store = InMemoryJobStore()
    broken, fine = Step("facts", next_watermark=7), Step("index", next_watermark=7)
    broken.fail = RuntimeError("summarizer returned junk")
    jobs = runner(store, broken, fine)
    assert (await jobs.run_now("k")) is not None
    state = await store.get("k")
    assert state.status == "failed"
    assert state.watermarks == {"index": 7}, "the failed step's watermark must not move"
    assert state.last_error == "facts: RuntimeError: summarizer returned junk"
    assert state.attempts["facts"]["ok"] is False and state.attempts["index"]["ok"] is True
    broken.fail = None
    await jobs.run_now("k")
    assert broken.calls[-1] == ("k", None), "the next job redoes the failed step's work"
    assert (await store.get("k")).status == "idle"


async def test_two_workers_never_run_one_conversations_job_at_once():
    store, step = InMemoryJobStore(), Step()
    step.gate = asyncio.Event()
    worker_a, worker_b = runner(store, step, owner="a"), runner(store, step, owner="b")
    worker_a.schedule("k")
    await step.entered.wait()
    worker_b.schedule("k")
    await asyncio.sleep(0.2)  # worker b keeps asking for the lease meanwhile
    assert len(step.calls) == 1, "worker b must wait for worker a's lease"
    step.gate.set()
    await settle(worker_a, "k")
    await settle(worker_b, "k")
    assert step.most_active == 1
    assert len(step.calls) == 2 and (await store.get("k")).runs == 2


async def test_a_job_killed_mid_way_leaves_its_watermark_and_its_lease_runs_out():
    now = [datetime(2026, 12, 1, tzinfo=UTC)]
    store, step = InMemoryJobStore(clock=lambda: now[0]), Step()
    step.gate = asyncio.Event()
    dying = runner(store, step, owner="dying")
    dying.schedule("k")
    await step.entered.wait()
    await dying.close()  # the worker dies mid-step
    state = await store.get("k")
    assert state.watermarks == {} and state.status == "running" and state.lease_owner == "dying"
    assert await store.acquire("k", owner="other", lease_seconds=30) is None, "the lease is still fresh"
    now[0] += timedelta(seconds=31)
    step.gate.set()
    survivor = runner(store, step, owner="other")
    run = await survivor.run_now("k")
    assert run is not None and run.ok
    assert step.calls[-1] == ("k", None), "the survivor starts from the untouched watermark"


async def test_run_now_replaces_a_job_still_in_its_debounce_pause():
    store, step = InMemoryJobStore(), Step()
    jobs = runner(store, step, debounce=30)
    jobs.schedule("k")
    run = await jobs.run_now("k")
    assert run is not None and run.ok
    assert step.calls == [("k", None)]
    assert not jobs.busy("k")


async def test_run_now_waits_for_a_running_job_and_then_runs_once_more():
    store, step = InMemoryJobStore(), Step()
    step.gate = asyncio.Event()
    jobs = runner(store, step)
    jobs.schedule("k")
    await step.entered.wait()
    again = asyncio.create_task(jobs.run_now("k"))
    await asyncio.sleep(0.05)
    assert len(step.calls) == 1, "run_now waits for the running job"
    step.gate.set()
    run = await again
    assert run is not None and run.ok and len(step.calls) == 2


# --- the store contract, on the database and in memory ---------------------------------------------


@pytest.fixture(params=["orm", "in-memory"])
def store(request) -> JobStore:
    if request.param == "orm":
        request.getfixturevalue("db")
        return OrmJobStore()
    return InMemoryJobStore()


def attempt(step: str, ok: bool, after: int | None) -> StepAttempt:
    return StepAttempt(
        step=step, at="2026-12-01T00:00:00+00:00", ok=ok, error="" if ok else "boom", duration_ms=1,
        watermark_before=None, watermark_after=after,
    )  # fmt: skip


def test_the_lease_is_exclusive_until_released(store):
    acquired = async_to_sync(store.acquire)("k", owner="a", lease_seconds=30)
    assert acquired is not None and acquired.status == "running" and acquired.lease_owner == "a"
    assert async_to_sync(store.acquire)("k", owner="b", lease_seconds=30) is None
    assert async_to_sync(store.acquire)("k", owner="a", lease_seconds=30) is not None, "the holder may re-take it"
    assert not async_to_sync(store.step_done)("k", owner="b", attempt=attempt("s", True, 5))
    assert async_to_sync(store.step_done)("k", owner="a", attempt=attempt("s", True, 5))
    assert async_to_sync(store.step_done)("k", owner="a", attempt=attempt("t", False, 9))
    async_to_sync(store.release)("k", owner="b", status="idle", error="")  # not b's: ignored
    assert async_to_sync(store.get)("k").lease_owner == "a"
    async_to_sync(store.release)("k", owner="a", status="failed", error="t: boom")
    state = async_to_sync(store.get)("k")
    assert (state.status, state.lease_owner, state.runs, state.last_error) == ("failed", "", 1, "t: boom")
    assert state.watermarks == {"s": 5}, "a failed attempt moves no watermark"
    assert state.attempts["t"]["ok"] is False
    assert async_to_sync(store.acquire)("k", owner="b", lease_seconds=30) is not None


def test_a_lease_that_ran_out_can_be_taken_and_the_old_holder_writes_nothing(store):
    assert async_to_sync(store.acquire)("k", owner="a", lease_seconds=-1) is not None  # already expired
    assert async_to_sync(store.acquire)("k", owner="b", lease_seconds=30) is not None
    assert not async_to_sync(store.renew)("k", owner="a", lease_seconds=30)
    assert not async_to_sync(store.step_done)("k", owner="a", attempt=attempt("s", True, 5))
    assert async_to_sync(store.get)("k").watermarks == {}


@pytest.mark.django_db
def test_forgetting_a_conversation_deletes_its_job_state():
    async_to_sync(OrmJobStore().acquire)("k", owner="a", lease_seconds=30)
    session_memory_delete(memory_key="k")
    assert not MemoryJobState.objects.filter(memory_key="k").exists()


async def test_waiting_for_another_workers_job_ends_with_its_lease_or_at_the_deadline():
    store = InMemoryJobStore()
    here = runner(store, Step(), owner="here")
    assert await here.wait("k", 0.01), "nothing runs: nothing to wait for"
    await store.acquire("k", owner="there", lease_seconds=30)
    assert not await here.wait("k", 0.05, poll_seconds=0.01), "the other worker still holds the lease"

    async def finish_there() -> None:
        await asyncio.sleep(0.03)
        await store.release("k", owner="there", status="idle", error="")

    finishing = asyncio.create_task(finish_there())
    assert await here.wait("k", 2, poll_seconds=0.01)
    await finishing
