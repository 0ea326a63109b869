"""docket.reading.sizing: Little's law over a run's calls, and what explain says of it.

Pure (no ledger, no clock): calls built by hand, the peak checked against a brute
count at every millisecond, the suggestion against the peak and the arithmetic."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from docket.reading.calls import Call
from docket.reading.explain import Explainer
from docket.reading.sizing import HEADROOM, Sizing


def call(start: int, end: int | None, provider: str = "openai", seq: int = 0) -> Call:
    c = Call(seq, start, provider, "gpt-4o-mini", "chat.completions", 10, "ab", None)
    c.end_mono_ms = end
    return c


def fed(calls: list[Call]) -> Sizing:
    sizing = Sizing()
    for c in sorted(calls, key=lambda c: c.mono_ms):
        sizing.on_request(c)
    for c in calls:
        sizing.on_close(c)
    return sizing


def test_a_steady_run_gives_lambda_w_and_the_suggestion_with_its_arithmetic():
    # one call every 500 ms for 10 s, each taking 1,500 ms: 3 in flight in the steady state
    calls = [call(i * 500, i * 500 + 1500, seq=i) for i in range(21)]
    (name, size), *rest = fed(calls).advice().items()
    assert rest == [] and name == "openai"
    assert size["arrival_per_s"] == 2.0 and size["mean_s"] == 1.5 and size["p95_s"] == 1.5
    assert size["mean_in_flight"] == 3.0 and size["peak_in_flight"] == 3
    assert size["max_concurrent_upstream"] == size["max_queue"] == math.ceil(HEADROOM * 2 * 1.5)
    assert "lambda = 20 arrivals / 10 s = 2/s" in str(size["arithmetic"])


def test_too_little_to_size_says_nothing():
    assert fed([]).advice() == {}
    assert fed([call(0, 100)]).advice() == {}  # one call: no rate
    assert fed([call(0, None), call(50, None)]).advice() == {}  # nothing closed
    assert fed([call(7, 9), call(7, 12)]).advice() == {}  # no time between arrivals


@given(
    st.lists(st.tuples(st.integers(0, 2_000), st.integers(0, 500)), min_size=2, max_size=40).filter(
        lambda xs: len({s for s, _ in xs}) > 1
    )
)
def test_the_peak_is_the_most_calls_in_flight_and_the_suggestion_holds_it(spans):
    calls = [call(start, start + length, seq=i) for i, (start, length) in enumerate(spans)]
    size = fed(calls).advice()["openai"]
    # brute force: calls with start <= t < end at each millisecond
    brute = max(
        sum(1 for s, n in spans if s <= t < s + n)
        for t in range(0, max(s + n for s, n in spans) + 1)
    )
    assert size["peak_in_flight"] == brute
    assert size["max_concurrent_upstream"] >= max(brute, 1)
    assert size["max_queue"] == size["max_concurrent_upstream"]


def test_explain_reports_sizing_per_provider_from_the_ledgers_events():
    explainer = Explainer()
    seq = 0
    for i in range(6):
        for provider, took in (("openai", 300), ("anthropic", 900)):
            start = i * 200
            explainer.add(
                {"type": "model.request", "seq": seq, "mono_ms": start, "call_id": f"c{seq}",
                 "provider": provider, "model": "m", "endpoint": "chat.completions"}
            )  # fmt: skip
            explainer.add(
                {"type": "model.response", "seq": seq + 1, "mono_ms": start + took,
                 "call_id": f"c{seq}", "status": 200}
            )  # fmt: skip
            seq += 2
    sizing = explainer.report()["sizing"]
    assert set(sizing) == {"anthropic", "openai"}
    assert sizing["openai"]["mean_s"] == 0.3 and sizing["anthropic"]["mean_s"] == 0.9
    assert sizing["anthropic"]["mean_in_flight"] > sizing["openai"]["mean_in_flight"]


def test_a_window_under_a_tenth_of_a_second_is_not_shown_as_zero():
    # Two calls 28 ms apart: the window is printed as it is, never "0.0 s" beside 35.7/s.
    ((_, size),) = fed([call(0, 9), call(28, 37, seq=1)]).advice().items()
    assert "lambda = 1 arrivals / 0.028 s = 35.7/s" in str(size["arithmetic"])
