"""How much database work one chat turn costs (docs/benchmarks.md): a quick-answer turn
as the JSON socket runs it (the user message stored with its lease, then the turn) is held to an
upper bound of SQL statements and write transactions, counted on every thread that runs ORM work
(:mod:`chatapp.orm_threads`' threads and asgiref's thread-sensitive one)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, connections
from django.test.utils import CaptureQueriesContext

from chatapp.conversation import leases
from chatapp.conversation.runner import chat_turn_start
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async, orm_executor
from tests.chatapp.conftest import chat_session_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]

# Upper bounds for one quick-answer turn without compression: the key facts (one SELECT), the
# question with its owner and the owner's full-text search (one SELECT each) are read once; the
# history of these figures is in CHANGELOG.md.
MAX_STATEMENTS = 16
MAX_WRITES = 8
MAX_WRITE_TRANSACTIONS = 3
TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
WRITES = ("INSERT", "UPDATE", "DELETE")


class Captured:
    """The SQL statements captured on every ORM thread (``sql`` strings, in no particular order
    across threads) and the write transactions among them."""

    def __init__(self) -> None:
        self.contexts: dict[int, CaptureQueriesContext] = {}
        self.lock = threading.Lock()

    def enter(self) -> None:
        context = CaptureQueriesContext(connections[DEFAULT_DB_ALIAS])
        context.__enter__()
        with self.lock:
            self.contexts[threading.get_ident()] = context

    def exit(self) -> None:
        self.contexts[threading.get_ident()].__exit__(None, None, None)

    def per_thread(self) -> list[list[str]]:
        return [[query["sql"] for query in context.captured_queries] for context in self.contexts.values()]

    @property
    def statements(self) -> list[str]:
        """The SQL statements, transaction control (BEGIN, SAVEPOINT ...) left out."""
        return [sql for sqls in self.per_thread() for sql in sqls if not sql.upper().startswith(TRANSACTION_CONTROL)]

    @property
    def writes(self) -> list[str]:
        return [sql for sql in self.statements if sql.upper().startswith(WRITES)]


@contextmanager
def orm_queries_captured() -> Iterator[Captured]:
    """Capture the statements of every ORM thread (Django's ``CaptureQueriesContext`` on each)
    for the duration of the block. Synchronous set-up: call it outside any ORM work."""
    captured = Captured()
    executor = orm_executor()
    executor.run_everywhere(captured.enter)
    yield captured
    executor.run_everywhere(captured.exit)


async def turn_as_the_socket_runs_it(session: ChatSession, client_message_id: str, text: str) -> Message:
    message, created = await orm_async(leases.user_message_submit)(
        session=session, client_message_id=client_message_id, text=text, max_pending=5
    )
    assert created
    return await chat_turn_start(session_id=session.pk, user_message_id=message.pk, lease_fresh=True, question=text)


async def test_a_quick_answer_turn_stays_within_its_statement_and_write_budget(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    # A first turn names the session and loads what is loaded once; the second is the one measured.
    await turn_as_the_socket_runs_it(session, "first", "How much storage does the Free plan include?")
    sensitive = Captured()
    await sync_to_async(sensitive.enter)()
    with orm_queries_captured() as captured:
        final = await turn_as_the_socket_runs_it(session, "second", "What is the largest file on paid plans?")
    await sync_to_async(sensitive.exit)()

    assert final.status == Message.Status.COMPLETE
    statements = captured.statements + sensitive.statements
    writes = captured.writes + sensitive.writes
    report = "\n".join(statements)
    # PostgreSQL adds one: the session row lock (SELECT ... FOR UPDATE) that bounds the turns in
    # flight; SQLite's writers are serialized without it.
    row_lock = 1 if connections[DEFAULT_DB_ALIAS].features.has_select_for_update else 0
    assert len(statements) <= MAX_STATEMENTS + row_lock, f"{len(statements)} statements:\n{report}"
    assert len(writes) <= MAX_WRITES, f"{len(writes)} writes:\n{report}"
    # The user message (message, lease, session), the model call, the final reply (message,
    # session, lease deletion, the call's usage). Only SQLite's log shows where a transaction begins.
    if connections[DEFAULT_DB_ALIAS].vendor == "sqlite":
        transactions = transactions_count(captured.per_thread() + sensitive.per_thread())
        assert transactions <= MAX_WRITE_TRANSACTIONS, f"{transactions} write transactions:\n{report}"


def transactions_count(threads: list[list[str]]) -> int:
    """Write transactions in each thread's statement sequence: a run of statements between BEGIN
    and COMMIT (SQLite, PostgreSQL with ``atomic``) that writes counts once, and so does every
    write outside such a run (autocommit)."""
    count = 0
    for sqls in threads:
        inside = wrote = False
        for sql in sqls:
            head = sql.upper()
            if head.startswith(("BEGIN", "SAVEPOINT")) and not inside:
                inside, wrote = True, False
            elif head.startswith(("COMMIT", "RELEASE", "ROLLBACK")) and inside:
                count += wrote
                inside = False
            elif head.startswith(WRITES):
                if inside:
                    wrote = True
                else:
                    count += 1
    return count
