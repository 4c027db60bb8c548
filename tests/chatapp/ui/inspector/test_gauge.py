"""The gauge's figures the request panel's template reads (``used_percent``, ``target_percent``, ``trigger_percent``)."""

from __future__ import annotations

from chatapp.ui.inspector.gauge import Gauge


def test_gauge_percents_are_shares_of_the_window_and_the_bar_is_capped():
    gauge = Gauge(used=1500, context_window=1000, trigger_tokens=800, target_tokens=500)
    assert (gauge.used_percent, gauge.trigger_percent, gauge.target_percent) == (100.0, 80.0, 50.0)
    assert (gauge.level, gauge.level_label) == ("over", "over the context window")
