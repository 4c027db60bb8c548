"""Fixtures shared by every test: the scripted OpenAI-compatible servers of
:mod:`tests.fake_openai` and a base URL where connections are refused."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from tests.fake_openai import FakeOpenAI

# The same generated examples on every run, so the suite is deterministic; explore with
# ``HYPOTHESIS_PROFILE=explore`` (random examples, as hypothesis does by default).
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A started fake server, stopped after the test."""
    server = FakeOpenAI()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fake_openai_failover() -> Iterator[FakeOpenAI]:
    """A second, independent fake server (for the failover summarizer)."""
    server = FakeOpenAI()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def refused_base_url() -> Iterator[str]:
    """A base URL whose port is bound but not listening, so connections are refused (holding the
    port means no other process can start listening on it during the test)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@pytest.fixture(autouse=True)
def memory_jobs_only_when_asked(settings: Any) -> None:
    """Memory jobs scheduled after a turn (docs/memory.md §10) start only when a test runs them
    (``run_now``, ``wait``) or lowers this debounce and idle time: a job still running when its test ends would
    write into the next test's database."""
    settings.MEMORY_JOB_DEBOUNCE_MS = 3_600_000
    settings.MEMORY_JOB_IDLE_SECONDS = 3_600.0


@pytest.fixture(autouse=True)
def embeddings_only_when_asked(settings: Any) -> None:
    """Recall runs lexical-only unless a test selects an embedder (docs/memory.md §12): the
    bundled model would make every test that runs a memory job slower, and the endpoint needs a
    server. The process's recall caches (vectors, owners known to have embeddings) start empty."""
    from memory.api import MemoryEngine

    settings.EMBEDDING_BACKEND = "none"
    MemoryEngine.caches_clear()


@pytest.fixture(autouse=True)
def turn_leases_of_any_process(settings: Any) -> None:
    """Tests make leases with heartbeats of their choosing, some older than the test process: they
    count as any worker's unless a test asks for the one-process rule
    (``CHAT_TURN_LEASES_ONE_PROCESS``, chatapp.conversation.leases)."""
    settings.CHAT_TURN_LEASES_ONE_PROCESS = False


@pytest.fixture(autouse=True)
def endpoint_refusals_forgotten() -> Iterator[None]:
    """What endpoints refused is remembered per base URL for the process
    (:func:`chatapp.llm.clients.refused_shapes`): a fake server's port may serve another test later."""
    from chatapp.llm.clients import refused_shapes_forget

    refused_shapes_forget()
    yield
    refused_shapes_forget()


RATE_LIMITS_OFF: dict[str, dict[str, dict[str, int] | None]] = {
    action: {"owner": None, "address": None} for action in ("send", "upload")
}


@pytest.fixture(autouse=True)
def rate_limits_only_when_asked(settings: Any) -> None:
    """No rate limits (chatapp/chats/limits.py) unless a test sets them (the ``rate_limits`` fixture): owners and
    addresses repeat across tests within a limit's window, and the counts live in a cache every test shares."""
    settings.RATE_LIMITS = RATE_LIMITS_OFF


@pytest.fixture
def rate_limits(settings: Any) -> Any:
    """``rate_limits(send_owner="2/60", ...)``: set limits (others off) on a cleared cache (Redis with REDIS_URL)."""
    from django.core.cache import cache

    def set_limits(**limits: str) -> None:
        cache.clear()
        configured = {action: dict(subjects) for action, subjects in RATE_LIMITS_OFF.items()}
        for name, rate in limits.items():
            action, subject = name.split("_")
            count, seconds = rate.split("/")
            configured[action][subject] = {"count": int(count), "seconds": int(seconds)}
        settings.RATE_LIMITS = configured

    return set_limits
