"""Token-estimate calibration (docs/memory.md §5, "Calibration"): the pure rule, the budget that
applies the factor, the engine's requests under it, and the stored calibration per model."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from memory.context.budget import MemoryBudget, Mode
from memory.context.request import ContextRequest, MemoryContext
from memory.models import TokenCalibration
from memory.storage import calibration as services
from memory.summary.store import InMemorySummaryStore
from memory.tokens.calibration import (
    MAX_FACTOR,
    MIN_FACTOR,
    MIN_SAMPLE_TOKENS,
    Calibration,
    calibration_observe,
    sample_ratio,
)
from tests.memory.builders import COUNTER, ScriptedSummarizer, Store, asst, tool, user
from tests.memory.conftest import make_engine
from tests.memory.invariants import check_context

SYSTEM = "You are a helpful assistant."


def observed(ratio: float, calls: int, *, estimate: int = 1000, start: float = 1.0) -> list[float]:
    """The factor after each of ``calls`` calls whose provider figure is ``ratio`` × ``estimate``."""
    current = Calibration(model="m", factor=start)
    factors = []
    for _ in range(calls):
        current = calibration_observe(current, estimated_tokens=estimate, prompt_tokens=round(estimate * ratio))
        factors.append(current.factor)
    return factors


# --- the rule ---------------------------------------------------------------------------------


def test_a_provider_counting_20_percent_more_raises_the_factor_fast_to_1_2():
    factors = observed(1.2, 8)
    assert factors[0] == pytest.approx(1.1)  # half of the way at once
    assert factors == sorted(factors) and all(f <= 1.2 for f in factors)  # monotonic, never past the samples
    assert factors[-1] == pytest.approx(1.2, abs=0.001)


def test_a_provider_counting_20_percent_less_lowers_the_factor_slowly_to_0_8():
    factors = observed(0.8, 25)
    assert factors[0] == pytest.approx(0.96)  # a fifth of the way: lowering only wastes less room
    assert factors == sorted(factors, reverse=True) and all(f >= 0.8 for f in factors)
    assert factors[-1] == pytest.approx(0.8, abs=0.002)


def test_the_factor_stays_within_its_bounds_and_outliers_are_ignored():
    up, down = observed(3.0, 30), observed(0.3, 60)
    assert all(MIN_FACTOR <= factor <= MAX_FACTOR for factor in [*up, *down])
    assert up[-1] == MAX_FACTOR and down[-1] == pytest.approx(MIN_FACTOR, abs=0.001)
    # Five times our estimate does not measure the same request: no sample at all.
    assert sample_ratio(estimated_tokens=1000, prompt_tokens=5000) is None
    assert observed(5.0, 3) == [1.0, 1.0, 1.0]


def test_no_figure_or_a_tiny_request_leaves_the_factor_unchanged():
    current = Calibration(model="m", factor=1.3, samples=4)
    assert calibration_observe(current, estimated_tokens=2000, prompt_tokens=None) is current
    assert calibration_observe(current, estimated_tokens=MIN_SAMPLE_TOKENS - 1, prompt_tokens=400) is current
    assert calibration_observe(current, estimated_tokens=MIN_SAMPLE_TOKENS, prompt_tokens=400).samples == 5


# --- the budget applies it --------------------------------------------------------------------


def test_the_budget_divides_window_trigger_target_and_request_limit_by_the_factor():
    plain, calibrated = MemoryBudget(context_window=2048), MemoryBudget(context_window=2048, token_factor=1.2)
    assert (plain.window_tokens, plain.trigger_tokens, plain.target_tokens) == (2048, 1024, 614)
    assert (calibrated.window_tokens, calibrated.trigger_tokens, calibrated.target_tokens) == (1706, 853, 511)
    assert calibrated.request_limit_tokens == int((2048 - 256) / 1.2)
    assert MemoryBudget(context_window=2048, token_factor=0.8).window_tokens == 2560
    for bad in (0.4, 2.1):
        with pytest.raises(ValueError, match="token_factor"):
            MemoryBudget(context_window=2048, token_factor=bad)


def build(factor: float, store: Store, *, mode: Mode = "quick-answer") -> MemoryContext:
    engine = make_engine(window=2048, token_factor=factor, store=InMemorySummaryStore(), primary=ScriptedSummarizer())
    request = ContextRequest(
        memory_key="calibrated", system_prompt=SYSTEM, load_increment=store.load_increment, mode=mode
    )
    context = async_to_sync(engine.build_context)(request)
    check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)
    return context


def provider_tokens(context: MemoryContext, scale: float) -> int:
    """What a provider whose tokenizer yields ``scale`` times our count sees of ``context``."""
    return round(COUNTER.count_request(context.messages) * scale)


def test_with_factor_1_2_the_request_stays_within_the_window_where_uncalibrated_it_would_not():
    store = Store()
    store.add(user("what does the big document say?"), asst(None, tc=["search"]), tool("search", "token " * 5_000))

    uncalibrated, calibrated = build(1.0, store, mode="agent"), build(1.2, store, mode="agent")

    # Both are elided to their request limit; only the calibrated one fits the provider's count.
    assert provider_tokens(uncalibrated, 1.2) > 2048
    assert provider_tokens(calibrated, 1.2) <= 2048 - 256  # the reply reserve is kept as well
    assert calibrated.tokens == COUNTER.count_request(calibrated.messages)  # the estimate is of what is sent
    assert (calibrated.token_factor, calibrated.window_tokens, calibrated.context_window) == (1.2, 1706, 2048)
    assert calibrated.as_dict()["window_tokens"] == 1706 and uncalibrated.as_dict()["token_factor"] == 1.0


def test_with_factor_0_8_more_history_stays_and_the_provider_still_sees_the_target():
    def conversation() -> Store:
        store = Store()
        for i in range(14):
            store.add(user(f"Question {i}: " + "lorem " * 40), asst(f"Answer {i}: " + "ipsum " * 40))
        store.add(user("final question"))
        return store

    plain, roomy = build(1.0, conversation()), build(0.8, conversation())

    def retained(context: MemoryContext) -> int:
        return sum(1 for source in context.sources if source["kind"] == "history")

    assert plain.path == roomy.path == "compressed"
    assert retained(roomy) > retained(plain) and roomy.sections["retained"] > plain.sections["retained"]
    # In the provider's own count the request is still at or under the real target (614).
    assert provider_tokens(roomy, 0.8) <= 614 + 1


# --- stored per model -------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_calibration_is_stored_per_model_and_a_tiny_call_writes_nothing():
    assert services.token_calibration_get(model="gpt-x") == Calibration(model="gpt-x")
    services.token_calibration_record(model="gpt-x", estimated_tokens=100, prompt_tokens=120)
    assert not TokenCalibration.objects.exists()

    for _ in range(10):
        services.token_calibration_record(model="gpt-x", estimated_tokens=1000, prompt_tokens=1200)
    services.token_calibration_record(model="local", estimated_tokens=1000, prompt_tokens=800)

    stored = services.token_calibration_get(model="gpt-x")
    assert stored.samples == 10 and stored.factor == pytest.approx(1.2, abs=0.001)
    assert services.token_calibration_get(model="local") == Calibration(model="local", factor=0.96, samples=1)
    assert TokenCalibration.objects.count() == 2
