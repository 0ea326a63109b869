"""The caps guard: reserve-then-settle, once-only events, kill, wall time; stateful properties."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from docket.clock import FakeClock
from docket.guards.caps import (
    MAX_MODEL_CALLS,
    MAX_TOKENS,
    MAX_USD,
    MAX_WALL_SECONDS,
    CapsGuard,
)
from docket.policy import CapsPolicy, policy_from_dict
from docket.pricing import Usage, parse_price_table

TABLE = parse_price_table(
    json.dumps(
        {
            "format": "docket-prices-1",
            "as_of": "2026-01-01",
            "provenance": "made up for a test",
            "models": {
                "cheap": {
                    "provider": "openai",
                    "input": "0.15",
                    "cached_input": "0.075",
                    "output": "0.60",
                },
                "dear": {
                    "provider": "anthropic",
                    "input": "15.00",
                    "cached_input": "1.50",
                    "output": "75.00",
                    "cache_write_5m": "18.75",
                    "cache_write_1h": "30.00",
                },
            },
        }
    ).encode(),
    source="test",
)


def caps(**kw) -> CapsPolicy:
    section = {k: v for k, v in kw.items() if v is not None}
    return policy_from_dict({"caps": section}).caps


def guard(**kw) -> CapsGuard:
    return CapsGuard(caps(**kw), TABLE)


# ---------------------------------------------------------------- reserve and settle


def test_the_reservation_is_the_worst_case():
    g = guard(max_usd=10)
    d = g.reserve(model="dear", request_bytes=1000, max_output_tokens=200)
    assert d.allowed and d.refusal is None and d.events == ()
    r = d.reservation
    # Input: 1000 bytes bound 1000 tokens, at the dearest input price (1h cache write, 30.00);
    # output: 200 tokens at 75.00. Per million tokens -> nano-USD per token is * 1000.
    assert r.nusd == 1000 * 30_000 + 200 * 75_000
    assert r.tokens == 1200 and r.output_declared
    t = g.totals()
    assert (t.reserved_nusd, t.reserved_tokens, t.in_flight, t.nusd) == (r.nusd, 1200, 1, 0)


def test_settling_releases_the_reservation_and_charges_the_actual():
    g = guard(max_usd=10)
    r = g.reserve(model="cheap", request_bytes=4000, max_output_tokens=500).reservation
    out = g.settle(r, Usage.openai(prompt_tokens=900, completion_tokens=120, cached_tokens=100))
    expected = 800 * 150 + 100 * 75 + 120 * 600
    assert (out.charged_nusd, out.charged_tokens) == (expected, 1020)
    t = g.totals()
    assert (t.nusd, t.tokens, t.calls, t.reserved_nusd, t.in_flight) == (expected, 1020, 1, 0, 0)
    m = t.by_model["cheap"]
    assert (m.calls, m.input_tokens, m.cached_tokens, m.output_tokens, m.nusd) == (
        1,
        800,
        100,
        120,
        expected,
    )


def test_a_failed_call_is_charged_its_reservation_never_zero():
    g = guard(max_tokens=10_000)
    r = g.reserve(model="cheap", request_bytes=300, max_output_tokens=100).reservation
    out = g.fail(r)
    assert out.charged_nusd == r.nusd > 0 and out.charged_tokens == r.tokens == 400
    t = g.totals()
    assert (t.calls, t.tokens, t.nusd) == (1, 400, r.nusd)
    assert t.by_model["cheap"].failed_calls == 1 and t.by_model["cheap"].estimated_tokens == 400


def test_a_cancelled_call_costs_nothing():
    g = guard(max_model_calls=1)
    r = g.reserve(model="cheap", request_bytes=10, max_output_tokens=10).reservation
    assert not g.reserve(model="cheap", request_bytes=10, max_output_tokens=10).allowed
    g.cancel(r)
    t = g.totals()
    assert (t.calls, t.tokens, t.nusd, t.in_flight, t.reserved_tokens) == (0, 0, 0, 0, 0)
    assert g.reserve(model="cheap", request_bytes=10, max_output_tokens=10).allowed


def test_a_reservation_settles_once():
    g = guard()
    r = g.reserve(model="cheap", request_bytes=10, max_output_tokens=10).reservation
    g.settle(r, Usage(1, 1))
    for again in (lambda: g.settle(r, Usage(1, 1)), lambda: g.fail(r), lambda: g.cancel(r)):
        with pytest.raises(ValueError, match="not outstanding"):
            again()
    forged = replace(r, id=99)
    with pytest.raises(ValueError, match="not outstanding"):
        g.fail(forged)


def test_the_default_output_bound_is_used_when_none_is_declared():
    g = guard(default_max_output_tokens=777)
    r = g.reserve(model="cheap", request_bytes=3, max_output_tokens=None).reservation
    assert r.output_tokens_bound == 777 and not r.output_declared and r.tokens == 780


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_nonsense_request_facts_are_a_bug_not_a_decision(bad):
    with pytest.raises(ValueError):
        guard().reserve(model="cheap", request_bytes=bad, max_output_tokens=1)
    with pytest.raises(ValueError):
        guard().reserve(model="cheap", request_bytes=1, max_output_tokens=bad or -1)
    with pytest.raises(ValueError):
        guard().reserve(model=bad, request_bytes=1, max_output_tokens=1)


# ---------------------------------------------------------------- refusals and events


def test_a_call_that_would_cross_the_cap_is_refused_and_reserves_nothing():
    g = guard(max_tokens=1000)
    held = g.reserve(model="cheap", request_bytes=400, max_output_tokens=100).reservation
    before = g.totals()
    # 1001 > 1000 on its own: it cannot fit even once the call in flight settles.
    d = g.reserve(model="cheap", request_bytes=400, max_output_tokens=601)
    assert not d.allowed and d.reservation is None
    assert d.refusal.rule == "caps.max_tokens" and d.refusal.cap == MAX_TOKENS
    assert (d.refusal.limit, d.refusal.committed, d.refusal.reserved, d.refusal.requested) == (
        1000,
        0,
        500,
        1001,
    )
    assert "max_tokens" in d.refusal.reason
    assert d.refusal.would_fit_after_settle is False and not d.refusal.deferred
    # Demand crossed the cap, so it passed warn_at too: the warning comes first.
    assert [(e.type, e.cap, e.limit, e.observed) for e in d.events] == [
        ("cap.warning", MAX_TOKENS, 1000, 1501),
        ("cap.exceeded", MAX_TOKENS, 1000, 1501),
    ]
    after = g.totals()
    # Only the record of the refusal changes: nothing is held or charged for it.
    assert replace(after, refused_calls=before.refused_calls, warned=(), exceeded=()) == before
    assert after.refused_calls == before.refused_calls + 1
    # A call that fits still goes: "deny" refuses the call, not the run.
    assert g.reserve(model="cheap", request_bytes=400, max_output_tokens=100).allowed
    # ...and the cap is exceeded once, whatever the number of refusals.
    again = g.reserve(model="cheap", request_bytes=1, max_output_tokens=1)
    assert not again.allowed and again.events == () and not again.stop_run
    g.settle(held, Usage(1, 1))


def test_deny_defers_a_call_that_fits_once_calls_in_flight_settle():
    g = guard(max_tokens=1000, warn_at=0.9)
    held = g.reserve(model="cheap", request_bytes=400, max_output_tokens=100).reservation  # 500
    d = g.reserve(model="cheap", request_bytes=400, max_output_tokens=101)  # 500 + 501 > 1000
    assert not d.allowed and d.reservation is None
    assert d.refusal.would_fit_after_settle is True and d.refusal.deferred
    assert d.refusal.rule == "caps.max_tokens" and "retry" in d.refusal.reason
    # Not a breach: demand reached warn_at (a warning), but nothing was exceeded.
    assert [(e.type, e.observed) for e in d.events] == [("cap.warning", 1001)]
    assert g.totals().exceeded == () and g.totals().refused_calls == 1
    g.settle(held, Usage(400, 100))  # 500 spent: now the same call fits
    assert g.reserve(model="cheap", request_bytes=400, max_output_tokens=100).allowed
    # Spent 500 + held 500: a call of 1 more is deferred; one past 500 alone is final.
    assert g.reserve(model="cheap", request_bytes=1, max_output_tokens=0).refusal.deferred
    final = g.reserve(model="cheap", request_bytes=1, max_output_tokens=500).refusal
    assert (final.would_fit_after_settle, final.deferred) == (False, False)
    assert g.totals().exceeded == (MAX_TOKENS,)


def test_a_final_refusal_comes_before_a_deferred_one():
    # Calls fit after settling (max_model_calls) but tokens never will: the 403 wins,
    # though max_model_calls comes first in the order caps are checked.
    g = guard(max_model_calls=1, max_tokens=1000)
    held = g.reserve(model="cheap", request_bytes=1, max_output_tokens=1).reservation
    d = g.reserve(model="cheap", request_bytes=1, max_output_tokens=1000)
    assert d.refusal.cap == MAX_TOKENS and not d.refusal.deferred
    # Both fit after settling: the first in order is named, deferred.
    d = g.reserve(model="cheap", request_bytes=1, max_output_tokens=1)
    assert d.refusal.cap == MAX_MODEL_CALLS and d.refusal.deferred
    g.cancel(held)


def test_kill_never_defers_a_crossing_stops_the_run():
    g = guard(max_tokens=1000, on_breach="kill")
    g.reserve(model="cheap", request_bytes=400, max_output_tokens=100)
    d = g.reserve(model="cheap", request_bytes=400, max_output_tokens=101)
    assert d.refusal.would_fit_after_settle is True and not d.refusal.deferred
    assert d.stop_run and [e.type for e in d.events] == ["cap.warning", "cap.exceeded"]


def test_warning_then_exceeded_once_each():
    g = guard(max_model_calls=5, warn_at=0.6)
    seen = []
    for _ in range(8):
        d = g.reserve(model="cheap", request_bytes=1, max_output_tokens=1)
        seen += [e.type for e in d.events]
        if d.allowed:
            seen += [e.type for e in g.settle(d.reservation, Usage(1, 1)).events]
    assert seen == ["cap.warning", "cap.exceeded"]
    assert g.totals().calls == 5 and g.totals().warned == (MAX_MODEL_CALLS,)


def test_the_warning_comes_when_demand_reaches_warn_at_before_the_money_is_spent():
    g = guard(max_usd=0.001, warn_at=0.5)
    first = g.reserve(model="cheap", request_bytes=300, max_output_tokens=300)  # 225_000 nUSD
    assert first.allowed and first.events == ()
    d = g.reserve(model="cheap", request_bytes=400, max_output_tokens=400)  # + 300_000 nUSD
    assert d.allowed
    (warning,) = d.events
    assert warning.type == "cap.warning" and warning.unit == "nusd"
    assert warning.fields() == {
        "cap": "max_usd",
        "limit": 1_000_000,
        "observed": 525_000,
        "unit": "nusd",
        "limit_usd": "$0.001",
        "observed_usd": "$0.000525",
    }
    assert g.settle(d.reservation, Usage(400, 400)).events == ()  # once


def test_usd_events_carry_exact_dollars():
    g = guard(max_usd=0.001, warn_at=0.5)
    d = g.reserve(model="cheap", request_bytes=1000, max_output_tokens=1000)
    assert g.settle(d.reservation, Usage(1000, 1000)).events == ()
    (warning,) = d.events  # 150_000 + 600_000 nUSD: 75% of $0.001
    assert warning.type == "cap.warning" and warning.unit == "nusd"
    assert warning.fields() == {
        "cap": "max_usd",
        "limit": 1_000_000,
        "observed": 750_000,
        "unit": "nusd",
        "limit_usd": "$0.001",
        "observed_usd": "$0.00075",
    }


def test_an_overshoot_is_recorded_not_hidden():
    # Usage above the reservation (an image URL costs more tokens than its bytes) is charged as is.
    g = guard(max_tokens=100)
    r = g.reserve(model="cheap", request_bytes=10, max_output_tokens=10).reservation
    out = g.settle(r, Usage(150, 5))
    assert [(e.type, e.observed) for e in out.events] == [
        ("cap.warning", 155),
        ("cap.exceeded", 155),
    ]
    assert g.totals().tokens == 155


def test_kill_stops_the_run_and_refuses_everything_after():
    g = guard(max_model_calls=1, on_breach="kill")
    r = g.reserve(model="cheap", request_bytes=1, max_output_tokens=1).reservation
    d = g.reserve(model="cheap", request_bytes=1, max_output_tokens=1)
    assert not d.allowed and d.stop_run and d.refusal.cap == MAX_MODEL_CALLS
    assert [e.type for e in d.events] == ["cap.exceeded"]
    assert g.stopped_by == MAX_MODEL_CALLS
    later = g.reserve(model="dear", request_bytes=1, max_output_tokens=1)
    assert not later.allowed and later.stop_run and later.events == ()
    assert "on_breach" in later.refusal.reason
    g.settle(r, Usage(1, 1))  # a call in flight still settles
    assert g.totals().calls == 1


def test_an_unpriced_model_is_refused_under_max_usd():
    g = guard(max_usd=5)
    d = g.reserve(model="mystery-1", request_bytes=10, max_output_tokens=10)
    assert not d.allowed and d.refusal.rule == "caps.on_unpriced" and d.refusal.cap == MAX_USD
    assert "mystery-1" in d.refusal.reason and d.events == () and not d.stop_run


def test_an_unpriced_model_goes_through_with_allow_and_is_counted():
    g = guard(max_usd=5, max_tokens=100, on_unpriced="allow")
    d = g.reserve(model="mystery-1", request_bytes=10, max_output_tokens=10)
    assert d.allowed and not d.reservation.priced and d.reservation.nusd == 0
    g.settle(d.reservation, Usage(8, 9))
    t = g.totals()
    assert (t.unpriced_calls, t.nusd, t.tokens) == (1, 0, 17)
    assert not t.by_model["mystery-1"].priced
    # The token cap still holds for it.
    assert not g.reserve(model="mystery-1", request_bytes=80, max_output_tokens=10).allowed


def test_without_max_usd_an_unpriced_model_is_not_refused():
    g = guard()
    assert g.reserve(model="mystery-1", request_bytes=1, max_output_tokens=1).allowed


def test_quota_mode_applies_no_usd_cap():
    # The policy refuses max_usd in quota mode; even handed one, the guard does not apply it.
    quota = CapsPolicy(budget_mode="quota", max_tokens=50)
    g = CapsGuard(replace(quota, max_usd=caps(max_usd=0.000001).max_usd), TABLE)
    d = g.reserve(model="dear", request_bytes=10, max_output_tokens=10)
    assert d.allowed
    assert g.reserve(model="mystery", request_bytes=10, max_output_tokens=10).allowed
    assert not g.reserve(model="dear", request_bytes=20, max_output_tokens=10).allowed  # tokens


# ---------------------------------------------------------------- wall time


def test_wall_warning_and_exceeded_once_each():
    g = guard(max_wall_seconds=100, warn_at=0.8)
    assert g.next_wall_threshold() == 80.0
    assert g.check_wall(79.9).events == ()
    (w,) = g.check_wall(80).events
    assert (w.type, w.cap, w.limit, w.observed) == ("cap.warning", MAX_WALL_SECONDS, 100.0, 80.0)
    assert g.next_wall_threshold() == 100.0
    assert g.check_wall(80).events == ()  # a repeated reading says nothing new
    (x,) = g.check_wall(100).events
    assert x.type == "cap.exceeded" and not g.check_wall(100).stop_run
    assert g.check_wall(500).events == () and g.next_wall_threshold() is None
    d = g.reserve(model="cheap", request_bytes=1, max_output_tokens=1)
    assert not d.allowed and d.refusal.cap == MAX_WALL_SECONDS


def test_wall_kill_says_stop():
    g = guard(max_wall_seconds=10, on_breach="kill")
    out = g.check_wall(11)
    assert [e.type for e in out.events] == ["cap.warning", "cap.exceeded"] and out.stop_run
    assert g.stopped_by == MAX_WALL_SECONDS


def test_readings_that_go_back_change_nothing():
    g = guard(max_wall_seconds=10)
    g.check_wall(9)
    assert g.check_wall(3).events == ()
    assert g.check_wall(9).events == ()
    assert [e.type for e in g.check_wall(10).events] == ["cap.exceeded"]


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, "5", True])
def test_a_nonsense_reading_is_a_bug(bad):
    with pytest.raises(ValueError):
        guard(max_wall_seconds=10).check_wall(bad)


@settings(deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=5, allow_nan=False),  # real time passing
            st.floats(min_value=-60, max_value=0, allow_nan=False),  # a clock fault stepping back
        ),
        max_size=40,
    ),
    limit=st.floats(min_value=1, max_value=60, allow_nan=False),
)
def test_a_clock_stepping_back_cannot_manufacture_a_breach(steps, limit):
    clock = FakeClock(mono=500.0)
    start = clock.mono()
    g = guard(max_wall_seconds=limit)
    real_elapsed = 0.0
    for passing, fault in steps:
        clock.advance(passing)
        real_elapsed += passing
        clock.advance(fault)  # the raw monotonic reading jumps back; Clock.mono() clamps it
        elapsed = clock.mono() - start
        assert elapsed <= real_elapsed + 1e-9
        for e in g.check_wall(elapsed).events:
            if e.type == "cap.exceeded":
                assert real_elapsed + 1e-9 >= limit


# ---------------------------------------------------------------- the stateful property

MODELS = ("cheap", "dear", "unlisted")


class ConcurrentCalls(RuleBasedStateMachine):
    """Many calls in flight at once, settled, failed or cancelled in any order."""

    calls = Bundle("calls")

    @initialize(
        max_usd=st.none() | st.decimals(min_value="0.002", max_value="0.05", places=4),
        max_tokens=st.none() | st.integers(min_value=500, max_value=60_000),
        max_model_calls=st.none() | st.integers(min_value=1, max_value=25),
        warn_at=st.sampled_from([0.5, 0.8, 1.0]),
        on_breach=st.sampled_from(["deny", "kill"]),
        on_unpriced=st.sampled_from(["deny", "allow"]),
    )
    def start(self, max_usd, max_tokens, max_model_calls, warn_at, on_breach, on_unpriced):
        self.policy = caps(
            max_usd=float(max_usd) if max_usd is not None else None,
            max_tokens=max_tokens,
            max_model_calls=max_model_calls,
            warn_at=warn_at,
            on_breach=on_breach,
            on_unpriced=on_unpriced,
            default_max_output_tokens=1000,
        )
        self.guard = CapsGuard(self.policy, TABLE)
        self.limits = {
            MAX_USD: self.policy.max_nusd,
            MAX_TOKENS: max_tokens,
            MAX_MODEL_CALLS: max_model_calls,
        }
        self.events = []  # (event, where it came from)
        self.expected = {MAX_USD: 0, MAX_TOKENS: 0, MAX_MODEL_CALLS: 0}
        self.stopped = False

    @rule(
        target=calls,
        model=st.sampled_from(MODELS),
        request_bytes=st.integers(min_value=0, max_value=2000),
        max_output=st.none() | st.integers(min_value=0, max_value=2000),
    )
    def reserve(self, model, request_bytes, max_output):
        before = self.guard.totals()
        d = self.guard.reserve(
            model=model, request_bytes=request_bytes, max_output_tokens=max_output
        )
        self.events += [(e, "reserve") for e in d.events]
        if d.stop_run:
            assert self.policy.on_breach == "kill"
            self.stopped = True
        if not d.allowed:
            after = self.guard.totals()
            unheld = dict(refused_calls=0, warned=(), exceeded=(), stopped_by=None)
            assert replace(after, **unheld) == replace(before, **unheld), (
                "a refused call reserved something"
            )
            assert d.reservation is None and d.refusal is not None
            r = d.refusal
            if r.would_fit_after_settle is not None:  # a cap's room: which of 429 and 403
                fits = r.committed + r.requested <= r.limit
                assert r.would_fit_after_settle == fits
                assert r.deferred == (fits and self.policy.on_breach == "deny")
            if r.deferred:  # not a breach: nothing exceeded, nothing stopped
                assert not d.stop_run and all(e.type != "cap.exceeded" for e in d.events)
            return multiple()
        assert not self.stopped, "a call went through after the run was told to stop"
        assert d.reservation.model == model
        return d.reservation

    @rule(r=consumes(calls), data=st.data())
    def settle(self, r, data):
        # Real usage within what the call declared: input at most its byte count, output at
        # most its max output tokens, split among the ways input can be billed.
        # Often the whole of it: the worst case is where a cap is tested.
        whole = data.draw(st.booleans())
        input_total = (
            r.input_tokens_bound if whole else data.draw(st.integers(0, r.input_tokens_bound))
        )
        output = (
            r.output_tokens_bound if whole else data.draw(st.integers(0, r.output_tokens_bound))
        )
        parts = data.draw(
            st.lists(st.integers(min_value=0, max_value=input_total), min_size=3, max_size=3)
        )
        cut = sorted(parts)
        usage = Usage(
            input_tokens=cut[0],
            cached_tokens=cut[1] - cut[0],
            cache_write_5m_tokens=cut[2] - cut[1],
            cache_write_1h_tokens=input_total - cut[2],
            output_tokens=output,
        )
        out = self.guard.settle(r, usage)
        cost = r.price.cost_of(usage) if r.priced else 0
        assert cost <= r.nusd and usage.total_tokens <= r.tokens
        assert (out.charged_nusd, out.charged_tokens) == (cost, usage.total_tokens)
        self._charged(out, cost, usage.total_tokens)

    @rule(r=consumes(calls))
    def fail(self, r):
        out = self.guard.fail(r)
        assert (out.charged_nusd, out.charged_tokens) == (r.nusd, r.tokens)
        self._charged(out, r.nusd, r.tokens)

    @rule(r=consumes(calls))
    def cancel(self, r):
        self.guard.cancel(r)

    def _charged(self, out, nusd, tokens):
        self.expected[MAX_USD] += nusd
        self.expected[MAX_TOKENS] += tokens
        self.expected[MAX_MODEL_CALLS] += 1
        self.events += [(e, "settle") for e in out.events]
        if out.stop_run:
            self.stopped = True

    @invariant()
    def spend_never_crosses_a_cap(self):
        t = self.guard.totals()
        committed = {MAX_USD: t.nusd, MAX_TOKENS: t.tokens, MAX_MODEL_CALLS: t.calls}
        assert committed == self.expected
        reserved = {
            MAX_USD: t.reserved_nusd,
            MAX_TOKENS: t.reserved_tokens,
            MAX_MODEL_CALLS: t.in_flight,
        }
        for cap, limit in self.limits.items():
            if limit is not None:
                assert committed[cap] <= limit, cap
                assert committed[cap] + reserved[cap] <= limit, cap

    @invariant()
    def events_come_once_and_in_order(self):
        for cap in self.limits:
            kinds = [e.type for e, _ in self.events if e.cap == cap]
            assert kinds in ([], ["cap.warning"], ["cap.exceeded"], ["cap.warning", "cap.exceeded"])
        for e, where in self.events:
            if e.type == "cap.exceeded":
                # Usage within its declared bounds never overshoots: only a refusal breaches.
                assert where == "reserve"
                assert e.observed > e.limit
            else:
                assert e.observed >= self.policy.warn_at * e.limit


ConcurrentCalls.TestCase.settings = settings(
    max_examples=io_examples(), stateful_step_count=40, deadline=None
)
TestConcurrentCalls = ConcurrentCalls.TestCase
