"""The admission gate of recall (docs/memory.md §12 "Admission gate", F-33): is a candidate relevant at all. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

from memory.recall.values import CosineBackground, RecallCandidate, TermRarity

DENSE_WEIGHT = 0.5


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


_CJK_RUN_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")


_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)


# An identifier such as ``LN-4050`` is one term when it holds a letter and a digit (docs/memory.md §12).
_JOINED_RE = re.compile(r"[^\W_]+(?:[-./:][^\W_]+)+", re.UNICODE)


_HAS_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)


_HAS_DIGIT = re.compile(r"\d")


@dataclass(frozen=True, kw_only=True)
class RecallThresholds:
    """The gate's thresholds for one embedding model (docs/memory.md §12 "Admission gate"): a cosine from ``high``
    admits alone, from ``moderate`` with a lexical hit (both None: cosines only rank); ``lexical_*`` is the count floor,
    ``rarity_*`` the rarity floor; ``dense_weight`` weighs the dense rank in :func:`rrf`; a cosine ``margin`` above the
    owner's background admits alone (None: no such rule)."""

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
    margin: float | None = None


# Without an embedder, or for an uncalibrated model: the conservative lexical floor (bench/recall_calibrate.py).
LEXICAL_THRESHOLDS = RecallThresholds(
    model="", high=None, moderate=None, moderate_share=1.0, lexical_share=0.4, lexical_terms=2
)


# e5 cosines are compressed (docs/benchmarks.md): a cosine alone admits only above every foreign turn seen on
# LoCoMo; a moderate one admits lexical hits too thin for the floor; the margin above the owner's median cosine is
# the smallest that adds no foreign admission there (bench/recall_calibrate.py).
RECALL_THRESHOLDS: dict[str, RecallThresholds] = {
    "multilingual-e5-small": RecallThresholds(
        model="multilingual-e5-small",
        high=0.88,
        moderate=0.82,
        moderate_share=0.25,
        lexical_share=0.4,
        lexical_terms=2,
        margin=0.11,
    ),
    # USE spreads its cosines wider: unrelated turns near 0.2, a paraphrase of the question near 0.4-0.6; the same
    # rule chose these (the most evidence within 1.25 times the lexical floor's foreign admissions).
    "use-multilingual-3": RecallThresholds(
        model="use-multilingual-3",
        high=0.48,
        moderate=0.24,
        moderate_share=0.34,
        lexical_share=0.4,
        lexical_terms=2,
        margin=0.404,
    ),
}


def thresholds_for(model: str | None) -> RecallThresholds:
    """The calibrated thresholds of ``model``; :data:`LEXICAL_THRESHOLDS` for None or an uncalibrated model."""
    if model and model in RECALL_THRESHOLDS:
        return RECALL_THRESHOLDS[model]
    return replace(LEXICAL_THRESHOLDS, model=model or "")


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    """A light English suffix strip (``'s ies ing ed es s``, a final ``e`` or ``y``), the same on both sides."""
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
    """The terms a lexical match is measured on (docs/memory.md §12): identifier-like tokens whole, other words
    lower-cased, stop words dropped and stemmed, CJK runs as character pairs. Cached, never raises."""
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
    """``(matched, share)``: how many of ``query_terms`` ``text`` holds, and that over their number."""
    if not query_terms:
        return 0, 0.0
    matched = len(query_terms & content_terms(text))
    return matched, matched / len(query_terms)


def rarity_overlap(query_terms: frozenset[str], text: str, rarity: TermRarity) -> tuple[float, float]:
    """``(mass, share)``: the rarity weight of the ``query_terms`` ``text`` holds, and that over theirs."""
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
    background: CosineBackground | None = None,
) -> tuple[bool, str]:
    """``(admitted, reason for the inspector)`` (docs/memory.md §12 "Admission gate", F-33): a repeat of the question
    is refused; an identifier, a high cosine, the lexical floor (the rarity floor with ``rarity``, else the count
    floor), a moderate cosine with a lexical hit, or a cosine the model's margin above the owner's ``background``
    admit. Never raises."""
    if candidate.item.role != "tool" and content_terms(candidate.item.text) <= query_terms:
        return False, "repeats the question: it holds nothing the question does not say"
    if candidate.identifier_match:
        return True, "identifier match"
    matched, share = lexical_overlap(query_terms, candidate.item.text)
    words = f"{matched}/{len(query_terms)} query terms"
    cosine = candidate.cosine
    dense = cosine is not None and thresholds.high is not None and thresholds.moderate is not None
    if dense and cosine is not None and thresholds.high is not None and cosine >= thresholds.high:
        return True, f"cosine {cosine:.3f} ≥ {thresholds.high:.2f}"
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
        refused = f"cosine {cosine:.3f} < {thresholds.moderate:.2f}; {floor}"
    elif candidate.lexical_rank is not None and matched > 0 and share >= thresholds.moderate_share:
        if strong_enough:
            return True, f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} and lexical hit ({words})"
        refused = f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} but a weak lexical hit ({floor})"
    else:
        refused = f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} but no lexical hit ({words})"
    if thresholds.margin is None or background is None or not background.usable:
        return False, refused
    above = cosine - background.median
    measured = (
        f"{above:.3f} above this owner's background (needs {thresholds.margin:.2f}; "
        f"median {background.median:.3f} of {background.items} items)"
    )
    if above >= thresholds.margin:
        return True, f"cosine {cosine:.3f}, {measured}"
    return False, f"{refused}; {measured}"
