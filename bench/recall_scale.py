"""Recall's search inside PostgreSQL at scale (docs/memory.md §12 "The index"): a synthetic recall index of
``--rows`` items over owners of ``--items-per-owner`` each, generated in the database, then one owner's searches.

Measured per search, p50/p95 over ``--queries`` questions of a few content words:

- ``lexical``: the full-text side as the product runs it (:func:`memory.storage.search.recall_lexical_hits`: the
  stored, GIN-indexed ``search_vector`` column of memory migration 0008, ranked by ``ts_rank_cd``);
- ``expression``: the same statement over the expression the index had before (``to_tsvector`` of each row's
  text, with that expression's GIN index created for the comparison), side by side in the same run;
- ``dense_cold`` / ``dense_warm``: the dense side (:func:`memory.storage.search.recall_search` with a vector)
  over the owner's items, each with a unit vector of 384 dimensions: the first search of a worker whose cache
  does not hold the owner (it reads every embedded row of the owner), then with the cache warm.

Needs PostgreSQL (``DATABASE_URL``, default ``postgres://postgres@127.0.0.1:5432/test``; the bench uses a database
of its own, ``<name>_recallscale``, dropped at the end). Last line::

    rows=<n> items_per_owner=<k> lexical_p50_ms=… lexical_p95_ms=… expression_p50_ms=… expression_p95_ms=…
    dense_cold_p95_ms=… dense_warm_p50_ms=… dense_warm_p95_ms=…

    python bench/recall_scale.py [--rows 100000] [--items-per-owner 10000] [--queries 40]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/test"
DIMENSION = 384
# Pseudo-words: syllables joined, so that the English stemmer keeps them apart; their frequencies are skewed in seed().
SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "sa",
    "ti",
    "vo",
    "be",
    "da",
    "fe",
    "gu",
    "hi",
    "jo",
    "ke",
    "la",
    "mo",
    "nu",
    "pi",
    "ro",
]
VOCABULARY = [a + b + c for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES[:6]]  # 2,400 words
TEXT_WORDS = 14


def database(name_suffix: str) -> tuple[str, str, str]:
    """``(admin dsn, bench dsn, bench database name)``, the bench database created afresh."""
    import psycopg

    parts = urlsplit(os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL)
    if parts.scheme not in ("postgres", "postgresql"):
        raise SystemExit("bench/recall_scale.py needs DATABASE_URL to be a PostgreSQL URL")
    name = (parts.path.strip("/") or "postgres") + name_suffix
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    return admin, urlunsplit(parts._replace(path=f"/{name}")), name


def seed(rows: int, per_owner: int) -> str:
    """Generate ``rows`` items in the database (text only), then embed the measured owner's; its scope key."""
    from django.db import connection

    owner = "owner-0"
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO memory_memoryitem (scope_key, memory_key, message_ids, last_message_id, piece, role, text, "
            "search_text, token_count, created_at, embedding_model, embedding_dim) "
            "SELECT 'owner-' || (g / %s), 'chat-' || (g / 500), jsonb_build_array(g), g, 0, 'user', "
            # Word frequencies fall off like a language's (a cube of a uniform draw): a few words in most items.
            "(SELECT string_agg(w.words[1 + floor((w.n - 1) * power(((g * 7919 + k * 104729) %% 10007) / 10007.0, 3))"
            "::int], ' ') "
            " FROM generate_series(1, %s) k), '', 20, now() - make_interval(secs => g), '', 0 "
            "FROM generate_series(0::bigint, %s - 1) g, (SELECT %s::text[] AS words, %s AS n) w",
            [per_owner, TEXT_WORDS, rows, VOCABULARY, len(VOCABULARY)],
        )
        cursor.execute("SELECT id FROM memory_memoryitem WHERE scope_key = %s ORDER BY id", [owner])
        ids = [row[0] for row in cursor.fetchall()]
        rng = np.random.default_rng(3)
        vectors = rng.standard_normal((len(ids), DIMENSION)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        cursor.executemany(
            "UPDATE memory_memoryitem SET embedding = %s, embedding_model = 'bench', embedding_dim = %s WHERE id = %s",
            [(vector.tobytes(), DIMENSION, item_id) for item_id, vector in zip(ids, vectors, strict=True)],
        )
        cursor.execute("ANALYZE memory_memoryitem")
    return owner


def timed(run: object, repeats: list[object]) -> list[float]:
    times = []
    for argument in repeats:
        started = time.perf_counter()
        run(argument)  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    return times


def p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main(args: argparse.Namespace) -> int:
    admin, dsn, name = database("_recallscale")
    os.environ["DATABASE_URL"] = dsn
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    from memory.storage import search

    try:
        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        owner = seed(args.rows, args.items_per_owner)
        print(f"seeded {args.rows} items ({args.items_per_owner} per owner) in {time.perf_counter() - started:.0f} s")
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE INDEX bench_expression_tsv ON memory_memoryitem USING gin (to_tsvector('english', "
                "CASE WHEN search_text = '' THEN text ELSE search_text END))"
            )
            cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('memory_memoryitem'))")
            print(f"table with its indexes: {cursor.fetchone()[0]}")
        rng = random.Random(5)
        # Questions drawn like the texts: mostly rare words, now and then a common one.
        questions = [
            " ".join(VOCABULARY[int((len(VOCABULARY) - 1) * rng.random() ** 3)] for _ in range(3))
            for _ in range(args.queries)
        ]

        def lexical(question: object) -> None:
            search.recall_lexical_hits(
                scope_key=owner, memory_key="chat-none", boundary=None, scope="owner", query=str(question)
            )

        expression_body = "to_tsvector('english', CASE WHEN i.search_text = '' THEN i.text ELSE i.search_text END)"

        def expression(question: object) -> None:
            original = search._PG_BODY
            search._PG_BODY = expression_body  # the statement as it was before the stored column
            try:
                lexical(question)
            finally:
                search._PG_BODY = original

        for question in questions[:3]:  # warm the buffers for both
            lexical(question)
            expression(question)
        lexical_ms: list[float] = []
        expression_ms: list[float] = []
        for number, question in enumerate(questions):  # interleaved, alternating which goes first (warm pages)
            pair = [(lexical, lexical_ms), (expression, expression_ms)]
            for run, times in pair if number % 2 == 0 else pair[::-1]:
                times += timed(run, [question])

        query_vectors = np.random.default_rng(11).standard_normal((args.queries, DIMENSION)).astype(np.float32)
        query_vectors /= np.linalg.norm(query_vectors, axis=1, keepdims=True)

        def dense(vector: object) -> None:
            search.recall_search(
                scope_key=owner, memory_key="chat-none", boundary=None, scope="owner", query="",
                query_vector=vector, embedding_model="bench",  # type: ignore[arg-type]
            )  # fmt: skip

        cold_ms: list[float] = []
        for vector in query_vectors[: max(3, args.queries // 8)]:
            search.vector_cache.clear()
            cold_ms += timed(dense, [vector])
        warm_ms = timed(dense, list(query_vectors))
        print(f"{'search':<12}{'p50 ms':>9}{'p95 ms':>9}")
        for label, values in (
            ("lexical", lexical_ms),
            ("expression", expression_ms),
            ("dense cold", cold_ms),
            ("dense warm", warm_ms),
        ):
            print(f"{label:<12}{p(values, 50):9.1f}{p(values, 95):9.1f}")
        print(
            f"rows={args.rows} items_per_owner={args.items_per_owner} lexical_p50_ms={p(lexical_ms, 50):.1f} "
            f"lexical_p95_ms={p(lexical_ms, 95):.1f} expression_p50_ms={p(expression_ms, 50):.1f} "
            f"expression_p95_ms={p(expression_ms, 95):.1f} dense_cold_p95_ms={p(cold_ms, 95):.1f} "
            f"dense_warm_p50_ms={p(warm_ms, 50):.1f} dense_warm_p95_ms={p(warm_ms, 95):.1f}"
        )
        return 0
    finally:
        connections.close_all()
        import psycopg

        if args.keep:
            print(f"kept database {name}", file=sys.stderr)
        else:
            with psycopg.connect(admin, autocommit=True) as admin_connection:
                admin_connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="items in the index (default 100000)")
    parser.add_argument("--items-per-owner", type=int, default=10_000, help="items per owner (default 10000)")
    parser.add_argument("--queries", type=int, default=40, help="searches per kind (default 40)")
    parser.add_argument("--keep", action="store_true", help="keep the bench database (to EXPLAIN its statements)")
    sys.exit(main(parser.parse_args()))
