"""How often a compression yields a summary (not the raw archive) when the model overruns the summary budget
(docs/memory.md §4 "Summaries that fit"). Each case folds a tau-bench conversation (../shared/data) into a
summary capped at ``--cap`` tokens through the engine's incremental summarizer and its degradation chain.

The model is either a real OpenAI-compatible server (``--base-url``, ``--model``), or, by default, a simulated
weak model: it writes ``factor`` times the budget its prompt states (factors drawn from ``--factors``, seeded),
in whole sentences taken from the conversation, and is cut at the request's output limit with
``finish_reason: "length"`` as a provider does. Last line:
``usable=<k>/<n> shortened=<s> raw=<r> attempts=<a> cut_attempts=<c>`` (``usable``: a summary within the cap,
not the raw archive; ``shortened``: cut at a sentence and marked; ``attempts``: summarizer requests in all).

    python bench/summary_fit.py [--cases 10] [--cap 200] [--factors 1.1,2.2] [--base-url URL --model NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")

import django  # noqa: E402

django.setup()

from chatapp.llm.clients import Endpoint  # noqa: E402
from chatapp.llm.summarizer import OpenAISummarizer  # noqa: E402
from memory.ports import Summarizer, SummaryReply, SummaryRequest  # noqa: E402
from memory.summary.chain import SummarizerChain  # noqa: E402
from memory.summary.incremental import IncrementalSummarizer  # noqa: E402
from memory.summary.store import Summary  # noqa: E402
from memory.tokens.counter import get_counter  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "tau-bench-airline" / "trajectories.json"
COUNTER = get_counter("gpt-4o")
# The budget line of the summary prompt, in any wording that names "At most N tokens".
BUDGET_RE = re.compile(r"At most (\d+) tokens")
SHORTENED_RE = re.compile(r"\[… summary shortened to fit the summary cap\]")


class OverrunningModel:
    """A simulated weak model: ``factor`` times the stated budget, whole sentences, cut at the output limit."""

    model = "simulated-weak"

    def __init__(self, factor: float, sentences: list[str]) -> None:
        self.factor, self.sentences, self.calls = factor, sentences, 0

    async def summarize(self, request: SummaryRequest) -> SummaryReply:
        self.calls += 1
        system = request.prompt[0]["content"]
        stated = int(found.group(1)) if (found := BUDGET_RE.search(system)) else request.max_tokens
        wanted, text = int(self.factor * stated), ""
        for sentence in self.sentences:
            if COUNTER.count_text(text) >= wanted:
                break
            text += sentence + " "
        limit = getattr(request, "reply_tokens", None) or request.max_tokens
        if COUNTER.count_text(text) > limit:
            return SummaryReply(text=COUNTER.truncate_text(text, limit), finish_reason="length")
        return SummaryReply(text=text.strip(), finish_reason="stop")


def conversations(cases: int) -> list[list[dict]]:
    """The first ``cases`` tau-bench conversations with 12 or more messages, system prompt left out, with ids."""
    found = []
    for item in json.loads(DATA.read_text(encoding="utf-8")):
        messages = [m for m in item["traj"] if m.get("role") != "system"]
        if len(messages) >= 12:
            found.append([{**m, "id": n} for n, m in enumerate(messages, 1)])
        if len(found) == cases:
            break
    return found


def sentences_of(messages: list[dict]) -> list[str]:
    """The conversation's sentences of up to 30 words (tool results are JSON), cycled long enough for any factor:
    the simulated model's material."""
    text = " ".join(m.get("content") or "" for m in messages if isinstance(m.get("content"), str))
    pieces = []
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        words = sentence.split()
        pieces += [" ".join(words[i : i + 30]).rstrip(".") + "." for i in range(0, len(words), 30) if len(words) > 1]
    return (pieces or ["The user and the agent talked."]) * 40


async def run(args: argparse.Namespace) -> dict[str, int]:
    low, high = (float(x) for x in args.factors.split(","))
    rng = random.Random(args.seed)
    figures = {"usable": 0, "shortened": 0, "raw": 0, "attempts": 0, "cut_attempts": 0, "cases": 0}
    for messages in conversations(args.cases):
        summarizer: Summarizer
        if args.base_url:
            endpoint = Endpoint(
                base_url=args.base_url, api_key="", model=args.model, context_window=args.window, timeout=args.timeout
            )
            summarizer = OpenAISummarizer(endpoint=endpoint, temperature=0.3)
            label = args.model
        else:
            factor = rng.uniform(low, high)
            summarizer = OverrunningModel(factor, sentences_of(messages))
            label = f"factor {factor:.2f}"
        chain = SummarizerChain(primary=summarizer, attempts=3, backoff=0, timeout=args.timeout)
        folder = IncrementalSummarizer(chain=chain, counter=COUNTER, ratio=0.3, window=args.window)
        outcome = await folder.fold(Summary(), messages, cap=args.cap)
        summary = outcome.summary
        fitted = summary.summary_type != "raw" and COUNTER.count_text(summary.content) <= args.cap
        figures["cases"] += 1
        figures["usable"] += int(fitted)
        figures["raw"] += int(summary.summary_type == "raw")
        figures["shortened"] += int(bool(SHORTENED_RE.search(summary.content)))
        figures["attempts"] += len(outcome.attempts)
        cut = sum(a.error.startswith("TruncatedSummaryError") for a in outcome.attempts)
        figures["cut_attempts"] += cut
        tokens = COUNTER.count_text(summary.content)
        print(f"{label}: {summary.summary_type} {tokens} tokens, {len(outcome.attempts)} attempts, {cut} cut off")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10)
    parser.add_argument("--cap", type=int, default=200, help="summary cap in tokens")
    parser.add_argument("--window", type=int, default=8192, help="tokens of one summarizer request")
    parser.add_argument("--factors", default="1.1,2.2", help="low,high overrun of the simulated model")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--base-url", default="", help="a real OpenAI-compatible server instead of the simulation")
    parser.add_argument("--model", default="local")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per summarizer attempt")
    args = parser.parse_args()
    if not DATA.exists():
        print(f"the shared data folder is absent ({DATA})")
        return 1
    f = asyncio.run(run(args))
    print(
        f"usable={f['usable']}/{f['cases']} shortened={f['shortened']} raw={f['raw']} "
        f"attempts={f['attempts']} cut_attempts={f['cut_attempts']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
