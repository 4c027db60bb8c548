"""How much of a very long conversation stays answerable: truncation, the summary, key facts and
recall (docs/memory.md §12), measured on LoCoMo.

Replays the LoCoMo conversations of ../shared/data/locomo (speaker_a as user, speaker_b as
assistant) through the live memory path (``chatapp.conversation.replay.ReplaySession``: the
configured summarizer, the offline engine by default, the memory job after every reply, recall
in every request), all of them under one owner, then asks every annotated question (categories
1-4, those with an answer) as the next, unstored user turn (docs/replay.md, "Questions") and
checks what the model would be sent:

- ``evidence``: share of the questions with annotated evidence for which at least one evidence
  turn's text is in the request verbatim (whitespace normalised);
- ``evidence_ids``: the same by provenance (an evidence message is a source of the request:
  retained, or in the recall block), so without the summary's paraphrases;
- ``answer``: share of the questions whose answer text is in the request (case-insensitive; a
  rough proxy, the same for every method);
- ``foreign``: recalled items per question that come from another of the owner's chats (another
  conversation: nothing there answers the question, every such item is noise, docs/memory.md F-33);
- ``p50_ms``/``p95_ms``: the recall report's ``latency_ms`` over the questions: what the request
  waited for the search (full-text and vector search, and what was left of the question's
  embedding, started as the question's turn opened); with an embedder, the embedding's own
  time from its start (``embedding_ms``) is printed below the row;
- under each recall configuration, where recall left the evidence: recalled, among the best
  rejected candidates, over the block's budget; and the block's mean size in tokens.

Configurations, each at every window, each in its own process with a fresh SQLite database
(settings are read at import): ``truncation`` (the system prompt plus the newest messages that
fit the same target, computed beside ``summary``), ``summary`` (MEMORY_FACTS_SHARE=0,
MEMORY_RECALL_SHARE=0), ``facts`` (summary + key facts), ``lexical`` (+ recall, full-text search
only: EMBEDDING_BACKEND=none) and ``embedder`` (+ recall with the default bundled model:
EMBEDDING_BACKEND=local); ``embedder_e5`` and ``embedder_use`` name a bundled model, to compare them. MEMORY_RECALL_SCOPE=owner throughout. Passage embeddings are cached in
``--cache`` between runs (never query embeddings: their latency is measured). Prints a table,
then as its last line ``evidence_4096=<x> answer_4096=<y> foreign_hits=<z> evidence_8192=<x>
answer_8192=<y> latency_p50_ms=<p> latency_p95_ms=<p> recall_managed=<x> recall_truncation=<y>
configuration=<c>``: the fullest configuration run (``embedder``), foreign hits and latency at
the first window; ``recall_managed``/``recall_truncation``: answer in context at the first
window, that configuration versus truncation; then ``answer_<window>_cat<k>=<x>``: answer in context per
LoCoMo category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop) at each window, the same configuration,
and ``answer_dates_<window>_cat<k>=<x>``: the same with written dates read as ISO 8601 on both sides
(:func:`iso_dates`: "29 January, 2023" in an answer is found as the request's ``2023-01-29``).

    python bench/locomo_recall.py [--windows 4096,8192] [--limit 5] [--configs ...] [--cache DIR]
    python bench/locomo_recall.py --report DIR   # the figures of the runs kept in DIR (printed first)
    python bench/locomo_recall.py --folds FOLDS.json --configs embedder --window 4096   # leave-one-out

``--folds`` replays once per fold of ``bench/recall_calibrate.py --folds-out`` with that fold's thresholds
(calibrated without one conversation) and measures only the conversation left out; last line
``loo_evidence_<window>=<x> loo_foreign_hits=<y> configuration=<c>``.

About 25 minutes on two cores with a cold cache (the embedder indexes about 20 messages/s; the
embedder's runs are much shorter with a warm ``--cache``).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "locomo"
CONFIGS: dict[str, dict[str, str]] = {
    "summary": {"MEMORY_FACTS_SHARE": "0", "MEMORY_RECALL_SHARE": "0", "EMBEDDING_BACKEND": "none"},
    "facts": {"MEMORY_RECALL_SHARE": "0", "EMBEDDING_BACKEND": "none"},
    "lexical": {"EMBEDDING_BACKEND": "none"},
    "embedder": {"EMBEDDING_BACKEND": "local"},
    "embedder_e5": {"EMBEDDING_BACKEND": "local", "EMBEDDING_LOCAL_MODEL": "multilingual-e5-small"},
    "embedder_use": {"EMBEDDING_BACKEND": "local", "EMBEDDING_LOCAL_MODEL": "use-multilingual-3"},
}
# A fold's thresholds (JSON of memory.recall.gate.RecallThresholds) for the worker of a --folds run.
FOLD_THRESHOLDS = "BENCH_RECALL_THRESHOLDS"
DEFAULT_CONFIGS = ("summary", "facts", "lexical", "embedder")
LABELS = {
    "truncation": "truncation",
    "summary": "summary only",
    "facts": "summary + key facts",
    "lexical": "+ recall, lexical only",
    "embedder": "+ recall, with embedder",
    "embedder_e5": "+ recall, with e5",
    "embedder_use": "+ recall, with USE",
}
SPACE = re.compile(r"\s+")


def normalised(text: str) -> str:
    return SPACE.sub(" ", text).strip()


MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
WRITTEN_DATE = re.compile(rf"(?:(\d{{1,2}})\s+)?({'|'.join(MONTHS)}),?\s+(\d{{4}})", re.IGNORECASE)


def iso_dates(text: str) -> str:
    """``text`` with written dates as ISO 8601 ("29 January, 2023" -> "2023-01-29", "May 2023" -> "2023-05"), so a
    date is found in the request whatever form the request or the answer writes it in."""

    def iso(match: re.Match[str]) -> str:
        day, month, year = match.groups()
        number = MONTHS.index(month.lower()) + 1
        return f"{year}-{number:02d}-{int(day):02d}" if day else f"{year}-{number:02d}"

    return WRITTEN_DATE.sub(iso, text)


# --- the worker: one configuration at one window, in its own process -------------------------


def worker(config: str, window: int, limit: int, cache: Path, out: Path) -> None:
    """Replay, ask, measure; write the per-question rows to ``out`` (JSON)."""
    os.environ["SQLITE_PATH"] = str(Path(tempfile.mkdtemp(prefix="locomo-recall-")) / "recall.sqlite3")
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
    os.environ["MEMORY_RECALL_SCOPE"] = "owner"
    os.environ.update(CONFIGS[config])
    sys.path.insert(0, str(ROOT))
    import logging

    import django

    django.setup()
    logging.getLogger("memory").setLevel(logging.WARNING)
    logging.getLogger("chatapp").setLevel(logging.WARNING)
    from django.core.management import call_command

    from chatapp.conversation.replay import ReplaySession, locomo_conversation, replay_config

    call_command("migrate", verbosity=0)
    if os.environ.get(FOLD_THRESHOLDS):
        from memory.recall import gate

        chosen = gate.RecallThresholds(**json.loads(os.environ[FOLD_THRESHOLDS]))
        gate.RECALL_THRESHOLDS[chosen.model] = chosen  # this fold's calibration, in this process only
    print(f"  [{config} {window}] database {os.environ['SQLITE_PATH']}", file=sys.stderr, flush=True)
    vectors = _passage_cache(cache) if config.startswith("embedder") else None
    memory = replay_config(window)
    started = time.perf_counter()
    sessions = []
    for path in sorted(DATA.glob("conv-*.json"))[:limit]:
        conversation = locomo_conversation(json.loads(path.read_text(encoding="utf-8")), path.stem)
        session = ReplaySession(conversation, config=memory, mode="quick-answer")
        calls = sum(1 for _ in session.records())
        sessions.append(session)
        print(
            f"  [{config} {window}] {path.stem}: {calls} model calls, {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    if vectors is not None:
        vectors.save()
    rows = []
    for session in sessions:
        conversation = session.conversation
        texts = dict(
            zip(conversation.turn_ids, (normalised(m["content"] or "") for m in conversation.messages), strict=False)
        )
        own_key = session.memory_key
        for record in session.questions(conversation.questions):
            question = record["question"]
            sent = normalised("\n".join(m.get("content") or "" for m in record["messages"]))
            evidence = [texts[e] for e in question["evidence"] if e in texts]
            present = {s["id"] for s in record["sources"] if s["id"] is not None}
            present |= {i for s in record["sources"] if s["kind"] == "recall" for i in s["message_ids"]}
            items = record["recall"].get("items", []) if record["recall"] else []
            evidence_ids = set(question["evidence_message_ids"])

            def among(entries: list[dict], wanted: set[int] = evidence_ids) -> bool:
                return any(wanted & set(entry["message_ids"]) for entry in entries)

            row = {
                "conversation": conversation.name,
                "category": question["category"],
                "has_evidence": bool(evidence),
                "evidence": any(text in sent for text in evidence),
                "evidence_ids": bool(present & set(question["evidence_message_ids"])),
                "answer": question["answer"].lower() in sent.lower(),
                "answer_dates": iso_dates(question["answer"].strip()).lower() in iso_dates(sent).lower(),
                "foreign": sum(item["memory_key"] != own_key for item in items),
                "recalled": len(items),
                # Where recall left the evidence (diagnostics for the gate and the budget).
                "evidence_recalled": among(items),
                "evidence_rejected": among(record["recall"].get("rejected", []) if record["recall"] else []),
                "evidence_over_budget": among(record["recall"].get("over_budget", []) if record["recall"] else []),
                "recall_tokens": record["recall"].get("tokens", 0) if record["recall"] else 0,
                "latency_ms": record["recall"].get("latency_ms") if record["recall"] else None,
                "embedding_ms": record["recall"].get("embedding_ms") if record["recall"] else None,
                "tokens": record["tokens"],
                "path": record["path"],
            }
            if config == "summary":
                truncated = normalised(
                    _truncation_text(session, session.engine, question["text"], record["target_tokens"])
                )
                row["truncation_evidence"] = any(text in truncated for text in evidence)
                row["truncation_answer"] = question["answer"].lower() in truncated.lower()
            rows.append(row)
    out.write_text(
        json.dumps({"config": config, "window": window, "seconds": time.perf_counter() - started, "rows": rows})
    )


def _truncation_text(session: Any, engine: Any, question: str, target: int) -> str:
    """The system prompt plus the newest recorded messages that fit ``target`` tokens with the
    question (what plain truncation would send)."""
    counter = engine.counter
    system = session.conversation.system_prompt
    budget = target - counter.count_message({"role": "system", "content": system})
    budget -= counter.count_message({"role": "user", "content": question})
    kept: list[str] = []
    for message in reversed(session.conversation.messages):
        tokens = counter.count_message(message)
        if tokens > budget:
            break
        budget -= tokens
        kept.append(message["content"] or "")
    return "\n".join([system, *reversed(kept), question])


class _PassageCache:
    """Passage embeddings of the bundled model kept on disk between runs (text -> vector)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.vectors: dict[str, Any] = pickle.loads(path.read_bytes()) if path.exists() else {}
        self.added = 0

    def save(self) -> None:
        if self.added:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(pickle.dumps(self.vectors))
            tmp.replace(self.path)


def _passage_cache(cache: Path) -> _PassageCache:
    """Patch the bundled embedder so that passages (never queries) come from the cache."""
    import numpy as np
    from django.conf import settings

    from chatapp.llm.embeddings import LocalEmbedder

    store = _PassageCache(cache / f"passages-{settings.EMBEDDING_LOCAL_MODEL}.pkl")
    embed_sync = LocalEmbedder.embed_sync

    def cached(self: LocalEmbedder, texts: list[str], *, kind: Any) -> Any:
        if kind != "passage" or not texts:
            return embed_sync(self, texts, kind=kind)
        missing = list(dict.fromkeys(t for t in texts if t not in store.vectors))
        if missing:
            store.vectors.update(zip(missing, embed_sync(self, missing, kind=kind), strict=True))
            store.added += len(missing)
        return np.stack([store.vectors[t] for t in texts]).astype(np.float32)

    LocalEmbedder.embed_sync = cached  # type: ignore[method-assign]
    return store


# --- the parent: runs the workers, prints the figures ----------------------------------------


def share(rows: list[dict], key: str, *, evidence_only: bool = False) -> float:
    pool = [r for r in rows if r["has_evidence"]] if evidence_only else rows
    return sum(bool(r[key]) for r in pool) / max(1, len(pool))


def percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))])


def run_all(configs: list[str], windows: list[int], limit: int, cache: Path, work: Path) -> dict:
    """Run every (config, window) worker, two at a time; the embedder runs go one after another
    in one lane so the second one finds the passage cache warm."""
    jobs = [(c, w) for c in configs for w in windows]
    lanes = [[j for j in jobs if j[0].startswith("embedder")], [j for j in jobs if not j[0].startswith("embedder")]]
    while len(lanes[0]) < len(lanes[1]) - 1:  # balance: move plain runs to the embedder lane's end
        lanes[0].append(lanes[1].pop())
    results: dict = {}
    failures: list[str] = []

    def lane(items: list[tuple[str, int]]) -> None:
        for config, window in items:
            out = work / f"{config}-{window}.json"
            log = work / f"{config}-{window}.log"
            command = [
                sys.executable,
                __file__,
                "--worker",
                config,
                "--windows",
                str(window),
                "--limit",
                str(limit),
                "--cache",
                str(cache),
                "--out",
                str(out),
            ]
            with log.open("w") as stderr:
                done = subprocess.run(command, stderr=stderr, stdout=stderr, check=False)
            if done.returncode != 0:
                failures.append(f"{config} {window}: exit {done.returncode}, see {log}")
                continue
            results[(config, window)] = json.loads(out.read_text())
            print(
                f"done {config} at {window}: {results[(config, window)]['seconds']:.0f} s", file=sys.stderr, flush=True
            )

    threads = [threading.Thread(target=lane, args=(items,)) for items in lanes if items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        sys.exit("failed: " + "; ".join(failures))
    return results


def report(results: dict, configs: list[str], windows: list[int]) -> None:
    any_rows = next(iter(results.values()))["rows"]
    with_evidence = sum(r["has_evidence"] for r in any_rows)
    print(f"questions={len(any_rows)} with_evidence={with_evidence}")
    header = (
        f"{'window':>6}  {'configuration':<26}{'evidence':>9}{'ev_ids':>8}{'answer':>8}{'foreign':>9}"
        f"{'recalled':>9}{'p50_ms':>8}{'p95_ms':>8}{'seconds':>9}"
    )
    print(header)
    figures: dict[tuple[str, int], dict[str, float]] = {}
    for window in windows:
        if ("summary", window) in results:
            rows = results[("summary", window)]["rows"]
            figures[("truncation", window)] = {
                "evidence": share(rows, "truncation_evidence", evidence_only=True),
                "answer": share(rows, "truncation_answer"),
            }
            print(
                f"{window:>6}  {LABELS['truncation']:<26}{figures[('truncation', window)]['evidence']:>9.3f}"
                f"{'':>8}{figures[('truncation', window)]['answer']:>8.3f}"
            )
        for config in configs:
            if (config, window) not in results:
                continue
            result = results[(config, window)]
            rows = result["rows"]
            latencies = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
            figure = {
                "evidence": share(rows, "evidence", evidence_only=True),
                "evidence_ids": share(rows, "evidence_ids", evidence_only=True),
                "answer": share(rows, "answer"),
                "foreign": sum(r["foreign"] for r in rows) / max(1, len(rows)),
                "recalled": sum(r["recalled"] for r in rows) / max(1, len(rows)),
                "p50": percentile(latencies, 0.5),
                "p95": percentile(latencies, 0.95),
            }
            for category in sorted({r["category"] for r in rows}):
                pool = [r for r in rows if r["category"] == category]
                figure[f"answer_cat{category}"] = share(pool, "answer")
                if "answer_dates" in rows[0]:
                    figure[f"dates_cat{category}"] = share(pool, "answer_dates")
                figure[f"evidence_cat{category}"] = share(pool, "evidence", evidence_only=True)
            figures[(config, window)] = figure
            print(
                f"{window:>6}  {LABELS[config]:<26}{figure['evidence']:>9.3f}{figure['evidence_ids']:>8.3f}"
                f"{figure['answer']:>8.3f}{figure['foreign']:>9.2f}{figure['recalled']:>9.2f}"
                f"{figure['p50']:>8.0f}{figure['p95']:>8.0f}{result['seconds']:>9.0f}"
            )
            if "evidence_recalled" in rows[0] and latencies:
                print(
                    f"{'':>8}evidence recalled {share(rows, 'evidence_recalled', evidence_only=True):.3f}, "
                    f"best rejected {share(rows, 'evidence_rejected', evidence_only=True):.3f}, "
                    f"over budget {share(rows, 'evidence_over_budget', evidence_only=True):.3f}; "
                    f"recall block {sum(r['recall_tokens'] for r in rows) / len(rows):.0f} tokens on average"
                )
            print(
                f"{'':>8}by category (answer, evidence, questions): "
                + "; ".join(
                    f"{c} {figure[f'answer_cat{c}']:.3f} {figure[f'evidence_cat{c}']:.3f} "
                    f"{sum(r['category'] == c for r in rows)}"
                    + (f" (answer, dates as ISO: {figure[f'dates_cat{c}']:.3f})" if f"dates_cat{c}" in figure else "")
                    for c in sorted({r["category"] for r in rows})
                )
            )
            embedding = [r["embedding_ms"] for r in rows if r.get("embedding_ms")]
            if embedding:
                print(
                    f"{'':>8}the question's embedding, from its start: p50 {percentile(embedding, 0.5):.0f} ms, "
                    f"p95 {percentile(embedding, 0.95):.0f} ms (the latency above is what the request waited)"
                )
    full = next((c for c in ("embedder", "lexical", "facts", "summary") if c in configs), configs[0])
    first = windows[0]
    parts = []
    for window in windows:
        if (full, window) in figures:
            parts += [
                f"evidence_{window}={figures[(full, window)]['evidence']:.3f}",
                f"answer_{window}={figures[(full, window)]['answer']:.3f}",
            ]
            if window == first:
                parts.append(f"foreign_hits={figures[(full, first)]['foreign']:.2f}")
    if (full, first) in figures:
        parts += [
            f"latency_p50_ms={figures[(full, first)]['p50']:.0f}",
            f"latency_p95_ms={figures[(full, first)]['p95']:.0f}",
            f"recall_managed={figures[(full, first)]['answer']:.3f}",
        ]
    if ("truncation", first) in figures:
        parts.append(f"recall_truncation={figures[('truncation', first)]['answer']:.3f}")
    for window in windows:
        by_category = sorted(key for key in figures.get((full, window), {}) if key.startswith("answer_cat"))
        parts += [
            f"answer_{window}_{key.removeprefix('answer_')}={figures[(full, window)][key]:.3f}" for key in by_category
        ]
        dates = sorted(key for key in figures.get((full, window), {}) if key.startswith("dates_cat"))
        parts += [
            f"answer_dates_{window}_{key.removeprefix('dates_')}={figures[(full, window)][key]:.3f}" for key in dates
        ]
    print(" ".join([*parts, f"configuration={full}"]))


def leave_one_out(folds_path: Path, config: str, window: int, limit: int, cache: Path) -> None:
    """One replay per fold of ``folds_path`` (``bench/recall_calibrate.py --folds-out``: thresholds calibrated
    without the held-out conversation), counting only the held-out conversation's questions; prints each fold and
    the figures over all of them."""
    folds = json.loads(folds_path.read_text())
    work = Path(tempfile.mkdtemp(prefix="locomo-recall-folds-"))
    print(f"logs and per-question rows in {work}", file=sys.stderr)
    held_rows: list[dict] = []
    print(f"leave-one-out at {window}, {config}: thresholds calibrated on the other conversations")
    print(f"{'held out':<10}{'high':>6}{'moder':>7}{'margin':>8}{'questions':>10}{'evidence':>9}{'foreign':>9}")
    for fold in folds:
        out = work / f"{fold['held_out']}.json"
        command = [sys.executable, __file__, "--worker", config, "--windows", str(window), "--limit", str(limit)]
        command += ["--cache", str(cache), "--out", str(out)]
        env = {**os.environ, FOLD_THRESHOLDS: json.dumps(fold["thresholds"])}
        with (work / f"{fold['held_out']}.log").open("w") as log:
            if subprocess.run(command, stderr=log, stdout=log, env=env, check=False).returncode != 0:
                sys.exit(f"fold {fold['held_out']} failed, see {log.name}")
        rows = [r for r in json.loads(out.read_text())["rows"] if r["conversation"] == fold["held_out"]]
        held_rows += rows
        t = fold["thresholds"]
        print(
            f"{fold['held_out']:<10}{t['high']:>6}{t['moderate']:>7}{t['margin']!s:>8}{len(rows):>10}"
            f"{share(rows, 'evidence', evidence_only=True):9.3f}{sum(r['foreign'] for r in rows) / max(1, len(rows)):9.2f}"
        )
    evidence = share(held_rows, "evidence", evidence_only=True)
    foreign = sum(r["foreign"] for r in held_rows) / max(1, len(held_rows))
    print(f"loo_evidence_{window}={evidence:.3f} loo_foreign_hits={foreign:.2f} configuration={config}")


def main() -> None:
    parser = argparse.ArgumentParser(description="LoCoMo: evidence and answer in context, by memory configuration")
    parser.add_argument("--windows", default="4096,8192", help="context windows in tokens (default 4096,8192)")
    parser.add_argument("--window", type=int, default=None, help="one window only (same as --windows W)")
    parser.add_argument("--limit", type=int, default=5, help="conversations to replay (default 5)")
    parser.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help=f"among {','.join(CONFIGS)} (default {','.join(DEFAULT_CONFIGS)})",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "locomo-recall-cache",
        help="passage embeddings kept between runs",
    )
    parser.add_argument("--report", type=Path, default=None, help="only report the runs kept in this folder")
    parser.add_argument(
        "--folds", type=Path, default=None, help="leave-one-out: the folds of bench/recall_calibrate.py --folds-out"
    )
    parser.add_argument("--worker", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    windows = [args.window] if args.window else [int(w) for w in args.windows.split(",")]
    if args.report is not None:
        runs = [json.loads(path.read_text()) for path in sorted(args.report.glob("*.json"))]
        results = {(run["config"], run["window"]): run for run in runs}
        report(results, [c for c in CONFIGS if any(c == k[0] for k in results)], sorted({k[1] for k in results}))
        return
    if not DATA.exists():
        sys.exit(f"LoCoMo data not found at {DATA}")
    if args.worker:
        worker(args.worker, windows[0], args.limit, args.cache, args.out)
        return
    configs = [c for c in args.configs.split(",") if c]
    if args.folds is not None:
        leave_one_out(args.folds, configs[-1], windows[0], args.limit, args.cache)
        return
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        sys.exit(f"unknown configurations: {sorted(unknown)}")
    work = Path(tempfile.mkdtemp(prefix="locomo-recall-runs-"))
    print(f"logs and per-question rows in {work}", file=sys.stderr)
    results = run_all(configs, windows, args.limit, args.cache, work)
    report(results, configs, windows)


if __name__ == "__main__":
    main()
