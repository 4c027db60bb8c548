"""The admission gate of recall (docs/memory.md §12): whether a candidate is relevant at all,
from its shared terms, their rarity, identifiers and cosine. Returning nothing is valid. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

from memory.recall.values import RecallCandidate, TermRarity

DENSE_WEIGHT = 0.5


# Words that carry no topic: left out of the terms a lexical match is measured on.
_STOP_WORDS = frozenset(
    """
    a about after again all also am an and any are as at be been before being both but by can could
    did do does doing done for from get got had has have having he her here hers him his how i if in
    into is it its itself just let like many me more most much my no not now of off on once only or
    other our ours out over own please said same say she should so some such tell than that the
    their theirs them then there these they this those through to too under until up us very was we
    were what when where which while who whom whose why will with would yes yet you your yours
    """.split()  # noqa: SIM905 (a word list, not a sentence)
)


# A run of CJK characters (Han, kana, Hangul): indexed as overlapping character pairs.
_CJK_RUN_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")


_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)


# Letters and digits joined by - . / : (an order number, a loan id, a version): one term when it
# holds both a letter and a digit (docs/memory.md §12, "gate").
_JOINED_RE = re.compile(r"[^\W_]+(?:[-./:][^\W_]+)+", re.UNICODE)


_HAS_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)


_HAS_DIGIT = re.compile(r"\d")


@dataclass(frozen=True, kw_only=True)
class RecallThresholds:
    """The admission gate's thresholds for one embedding model (docs/memory.md §12, "gate").

    ``model``: the embedding model they were calibrated for (``""``: no embedder); ``high``: a
    cosine at or above it admits alone; ``moderate``: a cosine at or above it admits together
    with a lexical hit (the full-text search found the item and it holds at least
    ``moderate_share`` of the query's content terms); both None when cosines of the model are not
    trusted for admission (they still rank). Without a usable cosine an item is admitted when it
    holds at least ``lexical_share`` of the query's content terms and at least ``lexical_terms``
    of them (:func:`lexical_overlap`). When the owner's term frequencies are known
    (:class:`TermRarity`), that count-based floor gives way to the rarity floor: the matched terms'
    rarity weights (:meth:`TermRarity.weight`, 0..~1) sum to at least ``rarity_mass``, make at
    least ``rarity_share`` of the query's weight (``rarity_single_share`` when a single term
    matched: one word admits only when it is most of what the query asks about, so a name in a
    greeting does not), and at least ``rarity_relative`` of the best
    candidate's matched weight (:func:`rarity_overlap`). An exact identifier match always admits.
    ``dense_weight``: the weight of the dense rank in the fused score (:func:`rrf`), lower for a
    model whose cosines rank poorly.
    Calibrated on LoCoMo by ``bench/recall_calibrate.py`` (count floor) and
    ``bench/locomo_recall.py`` (rarity floor, docs/benchmarks.md).
    """

    model: str
    high: float | None
    moderate: float | None
    moderate_share: float
    lexical_share: float
    lexical_terms: int
    rarity_mass: float = 0.8
    rarity_share: float = 0.2
    rarity_single_share: float = 0.5
    rarity_relative: float = 0.5
    dense_weight: float = DENSE_WEIGHT


# Without an embedder, or with a model nobody calibrated: the conservative lexical floor.
# On LoCoMo (bench/recall_calibrate.py): an evidence turn admitted for 48 % of the questions,
# 0.93 foreign turns admitted per question asked of another conversation.
LEXICAL_THRESHOLDS = RecallThresholds(
    model="", high=None, moderate=None, moderate_share=1.0, lexical_share=0.4, lexical_terms=2
)


# Per embedding model name (docs/memory.md §12). e5 cosines are compressed (LoCoMo: evidence turns
# p50 0.80, other turns of the same conversation p50 0.80, another conversation's best turn p50
# 0.82), so a cosine alone admits only above every foreign turn seen (p99 0.86), and a moderate one
# admits lexical hits too thin for the floor: evidence for 52 % of the questions, 1.1 foreign.
RECALL_THRESHOLDS: dict[str, RecallThresholds] = {
    "multilingual-e5-small": RecallThresholds(
        model="multilingual-e5-small",
        high=0.88,
        moderate=0.82,
        moderate_share=0.25,
        lexical_share=0.4,
        lexical_terms=2,
    ),
}


def thresholds_for(model: str | None) -> RecallThresholds:
    """The gate's thresholds for embedding model ``model``: its calibrated entry of
    :data:`RECALL_THRESHOLDS`; for None (no embedder) or an uncalibrated model,
    :data:`LEXICAL_THRESHOLDS` (cosines then only rank, docs/memory.md §12)."""
    if model and model in RECALL_THRESHOLDS:
        return RECALL_THRESHOLDS[model]
    return replace(LEXICAL_THRESHOLDS, model=model or "")


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    """A light English suffix strip, the same on both sides of a comparison ("groups", "group";
    "painted", "paint"; "running", "run"; "shared", "share"; "families", "family"): one of
    ``'s ies ing ed es s`` off, then a last ``e`` dropped and a last ``y`` made ``i``. Words of
    three letters or fewer, and stems that would be shorter, stay as they are."""
    stem = word
    for suffix, keep in (("'s", ""), ("’s", ""), ("ies", "i"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) + len(keep) >= 3 and not word.endswith("ss"):
            stem = word[: len(word) - len(suffix)] + keep
            if suffix in ("ing", "ed") and len(stem) > 3 and stem[-1] == stem[-2] and stem[-1] not in "aeiouls":
                stem = stem[:-1]
            break
    if len(stem) > 3 and stem[-1] == "e":
        stem = stem[:-1]
    elif len(stem) > 3 and stem[-1] == "y":
        stem = stem[:-1] + "i"
    return stem


@lru_cache(maxsize=4096)
def content_terms(text: str) -> frozenset[str]:
    """The terms of ``text`` a lexical match is measured on (docs/memory.md §12, "gate"): an
    identifier-like token (letters and digits joined by ``-``, ``.``, ``/`` or ``:``, such as
    ``LN-4050`` or ``ZX-88213``) as one term in lower case, so ``LN-4049`` shares nothing with it;
    other words in lower case without English stop words and one-letter words, lightly stemmed
    (:func:`_stem`); and every pair of adjacent characters of a CJK run (a lone CJK character as
    itself). Pure, never raises; the terms of recent texts are remembered (recall sees the same
    items again)."""
    terms: set[str] = set()
    for run in _CJK_RUN_RE.findall(text):
        if len(run) == 1:
            terms.add(run)
        terms.update(run[i : i + 2] for i in range(len(run) - 1))
    lowered = _CJK_RUN_RE.sub(" ", text.lower())
    joined = [token for token in _JOINED_RE.findall(lowered) if _HAS_LETTER.search(token) and _HAS_DIGIT.search(token)]
    if joined:
        terms.update(joined)
        lowered = _JOINED_RE.sub(lambda m: " " if m.group(0) in joined else m.group(0), lowered)
    for word in _WORD_RE.findall(lowered):
        if len(word) > 1 and word not in _STOP_WORDS:
            terms.add(_stem(word))
    return frozenset(terms)


def lexical_overlap(query_terms: frozenset[str], text: str) -> tuple[int, float]:
    """How much of a query ``text`` holds: ``(matched, share)``, the number of ``query_terms``
    (:func:`content_terms` of the query) among the content terms of ``text``, and that number
    over ``len(query_terms)`` (0.0 for a query without content terms)."""
    if not query_terms:
        return 0, 0.0
    matched = len(query_terms & content_terms(text))
    return matched, matched / len(query_terms)


def rarity_overlap(query_terms: frozenset[str], text: str, rarity: TermRarity) -> tuple[float, float]:
    """How much of a query ``text`` holds, by rarity: ``(mass, share)``, the sum of
    :meth:`TermRarity.weight` over the ``query_terms`` (:func:`content_terms` of the query) that
    ``text`` holds, and that sum over the weight of all of ``query_terms`` (0.0 when that is 0)."""
    if not query_terms:
        return 0.0, 0.0
    matched = query_terms & content_terms(text)
    mass = sum(rarity.weight(term) for term in matched)
    total = rarity.total_weight(query_terms)
    return mass, (mass / total if total > 0 else 0.0)


def admit(
    candidate: RecallCandidate,
    *,
    query_terms: frozenset[str],
    thresholds: RecallThresholds,
    rarity: TermRarity | None = None,
    best_mass: float = 0.0,
) -> tuple[bool, str]:
    """The admission gate for one candidate (docs/memory.md §12, "gate"; SPEC F-33): whether it
    may be recalled, and why, as a short text for the inspector.

    Refused first: a user or assistant item whose content terms are all in ``query_terms`` (it
    only repeats the question, e.g. the same question asked in another chat). Admitted, in this
    order: an exact identifier match; a cosine ≥ ``thresholds.high``; the
    lexical floor; a cosine ≥ ``moderate`` with a lexical hit (the full-text search found the
    item, ``lexical_rank`` not None, and it holds at least ``moderate_share`` of
    ``query_terms``; with ``rarity``, its matched weight also at least ``rarity_relative`` of
    ``best_mass``). The lexical floor is, with ``rarity`` (the owner's term frequencies), the
    rarity floor: the weight of the query terms the item holds (:func:`rarity_overlap`) at least
    ``rarity_mass``, at least ``rarity_share`` of the query's weight (``rarity_single_share``
    when it holds only one of them) and at least
    ``rarity_relative`` of ``best_mass`` (the best candidate's matched weight for this query);
    without ``rarity``, the count floor: at least ``lexical_terms`` of ``query_terms`` (or all
    of them when the query has fewer) and at least ``lexical_share`` of them. Cosines count only
    when ``thresholds`` has them (a calibrated model). Returning nothing is a valid answer:
    sharing a common word is never enough on its own. ``query_terms``: :func:`content_terms` of
    the query. Never raises.
    """
    if candidate.item.role != "tool" and content_terms(candidate.item.text) <= query_terms:
        # An earlier asking of the same question (or a bare restatement) tells the model nothing
        # new, and in the block it would crowd out what answers it.
        return False, "repeats the question: it holds nothing the question does not say"
    if candidate.identifier_match:
        return True, "identifier match"
    matched, share = lexical_overlap(query_terms, candidate.item.text)
    words = f"{matched}/{len(query_terms)} query terms"
    cosine = candidate.cosine
    dense = cosine is not None and thresholds.high is not None and thresholds.moderate is not None
    if dense and cosine is not None and thresholds.high is not None and cosine >= thresholds.high:
        return True, f"cosine {cosine:.3f} ≥ {thresholds.high:.2f}"
    # With rarity, a lexical hit must also be at least rarity_relative of the best one.
    strong_enough = True
    if rarity is not None:
        mass, mass_share = rarity_overlap(query_terms, candidate.item.text, rarity)
        strong_enough = mass >= thresholds.rarity_relative * best_mass
        weighed = f"{words}, rarity {mass:.2f} ({mass_share:.0%} of the query's)"
        needed_share = thresholds.rarity_share if matched > 1 else thresholds.rarity_single_share
        if matched > 0 and mass >= thresholds.rarity_mass and mass_share >= needed_share and strong_enough:
            return True, f"lexical: {weighed}"
        floor = (
            f"{weighed}, needs {thresholds.rarity_mass:.2f}, {needed_share:.0%} and "
            f"{thresholds.rarity_relative:.0%} of the best {best_mass:.2f}"
        )
    else:
        if matched >= min(thresholds.lexical_terms, len(query_terms)) > 0 and share >= thresholds.lexical_share:
            return True, f"lexical: {words}"
        floor = f"{words}, needs {thresholds.lexical_share:.0%}"
    if not dense or cosine is None or thresholds.moderate is None:
        return False, f"lexical: only {floor}"
    if cosine < thresholds.moderate:
        return False, f"cosine {cosine:.3f} < {thresholds.moderate:.2f}; {floor}"
    if candidate.lexical_rank is not None and matched > 0 and share >= thresholds.moderate_share:
        if strong_enough:
            return True, f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} and lexical hit ({words})"
        return False, f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} but a weak lexical hit ({floor})"
    return False, f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} but no lexical hit ({words})"
