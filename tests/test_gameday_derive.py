"""chaos.gameday.derive: the facts assertions query, computed from hand-built evidence."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.gameday.derive import (
    backoffs,
    breaker,
    counts,
    derive,
    first_seq,
    in_flight,
    latency,
    max_in_window,
    mono,
    percentile,
    stub_match,
    stub_match_all,
    stub_rate,
    stub_rate_all,
)


def ts(ms: int) -> str:
    return f"2026-01-01T00:00:{ms // 1000:02d}.{ms % 1000:03d}Z"


def ev(seq: int, ms: int, type: str, **fields) -> dict:
    return {"seq": seq, "mono_ms": ms, "ts": ts(ms), "type": type, **fields}


def stub(ms: int, method: str = "POST") -> dict:
    return {"ts": ts(ms), "mono_ms": float(ms), "method": method}


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [50, 90, 99, 100]
    assert percentile([7], 99) == 7
    assert percentile([], 50) is None


@settings(deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=50), st.floats(0.1, 100))
def test_percentile_is_an_observed_value_with_enough_below_it(values, p):
    got = percentile(values, p)
    assert got in values
    assert sum(v <= got for v in values) >= p / 100 * len(values)


def test_latency_per_provider_from_closing_events():
    events = [
        ev(0, 0, "model.request", provider="a"),
        ev(1, 5, "model.response", provider="a", duration_ms=5),
        ev(2, 9, "model.error", provider="b", duration_ms=300),
        ev(3, 9, "model.request", provider="b"),
    ]
    out = latency(events)
    assert out["all"] == {
        "count": 2, "p50_ms": 5, "p90_ms": 300, "p95_ms": 300, "p99_ms": 300, "p999_ms": 300,
        "max_ms": 300,
    }  # fmt: skip
    assert out["by_provider"]["b"]["max_ms"] == 300
    assert latency([])["all"]["p99_ms"] is None  # no calls: an assertion on it is unknown


def test_counts_first_seq_and_mono():
    events = [ev(0, 0, "a"), ev(1, 4, "b"), ev(2, 4, "a"), ev(3, 10, "c")]
    assert counts(events) == {"a": 2, "b": 1, "c": 1}
    assert first_seq(events) == {"a": 0, "b": 1, "c": 3}
    assert mono(events) == {"non_decreasing": True, "span_ms": 10, "wall_span_ms": 10}
    stepped = [ev(0, 0, "a"), {**ev(1, 5, "b"), "ts": "2026-01-01T00:30:00.005Z"}, ev(2, 3, "c")]
    assert mono(stepped) == {"non_decreasing": False, "span_ms": 3, "wall_span_ms": 1800005}


def test_max_in_window():
    assert max_in_window([], 1000) == 0
    assert max_in_window([0, 999, 1000, 1500, 1999], 1000) == 3  # [1000, 2000) holds 3
    assert max_in_window([0, 1, 2], 1) == 1


@settings(deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(1, 2000))
def test_max_in_window_matches_brute_force(stamps, window):
    brute = max((sum(t <= s < t + window for s in stamps) for t in stamps), default=0)
    assert max_in_window(stamps, window) == brute


def test_stub_rate_counts_only_model_calls():
    logs = {"openai": [stub(0), stub(100), stub(200, "GET"), stub(1500)]}
    assert stub_rate(logs) == {"openai": {"calls": 3, "max_in_1s": 2, "max_in_60s": 3}}


def _cycle(stub_calls_ms: list[int]) -> tuple[list[dict], dict]:
    events = [
        ev(0, 0, "model.request", provider="openai"),
        ev(1, 10, "model.error", provider="openai"),
        ev(2, 11, "breaker.state", upstream="openai", to="open", **{"from": "closed"}),
        ev(3, 20, "x-docket.breaker-open", upstream="openai"),
        ev(4, 300, "breaker.state", upstream="openai", to="half_open", **{"from": "open"}),
        ev(5, 301, "model.request", provider="openai"),
        ev(6, 305, "model.response", provider="openai"),
        ev(7, 306, "breaker.state", upstream="openai", to="closed", **{"from": "half_open"}),
    ]
    return events, {"openai": [stub(ms) for ms in stub_calls_ms]}


def test_breaker_cycle_with_a_quiet_stub():
    events, logs = _cycle([5, 302])
    out = breaker(events, logs)
    assert out["sequence"] == {"openai": "closed>open>half_open>closed"}
    assert out["opened"] == 1
    assert (out["requests_while_open"], out["refusals_while_open"]) == (0, 1)
    assert out["stub_calls_while_open"] == 0
    (window,) = out["open_windows"]
    assert (window["opened_seq"], window["closed_seq"], window["ended"]) == (2, 4, "half_open")


def test_a_stub_call_inside_an_open_window_is_counted():
    events, logs = _cycle([5, 150, 302])
    assert breaker(events, logs)["stub_calls_while_open"] == 1
    # and a request the ledger forwarded while open is counted too
    events.insert(4, ev(3, 25, "model.request", provider="openai"))
    assert breaker(events, logs)["requests_while_open"] == 1


def test_a_call_forwarded_before_the_opening_may_reach_the_stub_after_it():
    # A fan-out agent: two calls in flight when the third failure opens the breaker.
    # The one still in flight was forwarded before the opening (the ledger's order says
    # so) and reaches the stub a millisecond after it by the stub's clock: not a leak.
    # A stub call no in-flight call explains is still one.
    events = [
        ev(0, 0, "model.request", provider="openai", call_id="a", request_sha256="A"),
        ev(1, 0, "model.request", provider="openai", call_id="b", request_sha256="B"),
        ev(2, 10, "model.error", provider="openai", call_id="a"),
        ev(3, 11, "breaker.state", upstream="openai", to="open", **{"from": "closed"}),
        ev(4, 15, "model.response", provider="openai", call_id="b"),
        ev(5, 300, "breaker.state", upstream="openai", to="half_open", **{"from": "open"}),
    ]
    late = {**stub(13), "body_sha256": "B"}
    out = breaker(events, {"openai": [{**stub(1), "body_sha256": "A"}, late]})
    assert out["stub_calls_while_open"] == 0
    assert out["open_windows"][0]["in_flight_at_open"] == 1
    leak = {**stub(20), "body_sha256": "C"}
    assert breaker(events, {"openai": [late, leak]})["stub_calls_while_open"] == 1
    twice = breaker(events, {"openai": [late, {**stub(21), "body_sha256": "B"}]})
    assert twice["stub_calls_while_open"] == 1  # one in-flight call explains one arrival


def test_a_breaker_open_at_the_end_runs_to_the_last_event():
    events, logs = _cycle([5, 250])
    out = breaker(events[:4], logs)
    assert out["open_windows"][0]["ended"] == "end of ledger"
    assert out["stub_calls_while_open"] == 0  # 250 ms is after the last event (20 ms)
    assert breaker(events[:4], {"openai": [{"method": "POST"}]})["stub_calls_while_open"] is None


def test_derive_names():
    out = derive({"events": [ev(0, 0, "session.start")], "stubs": {}})
    assert set(out) == {
        "counts",
        "first_seq",
        "latency",
        "mono",
        "stub_calls",
        "stub_rate",
        "stub_rate_all",
        "stub_match",
        "stub_match_all",
        "in_flight",
        "backoffs",
        "breaker",
    }
    assert out["breaker"]["stub_calls_while_open"] == 0 and out["breaker"]["opened"] == 0


def test_stub_rate_all_meets_the_stubs_on_the_wall_clock():
    # each stub's mono_ms starts at its own zero: only `ts` puts them on one axis
    logs = {
        "a": [{**stub(0), "mono_ms": 0.0}, {**stub(600), "mono_ms": 600.0}],
        "b": [{**stub(300), "mono_ms": 0.0}, {**stub(2500), "mono_ms": 2200.0}],
    }
    assert stub_rate_all(logs) == {"calls": 4, "max_in_1s": 3, "max_in_60s": 4}
    assert stub_rate_all({"a": [{"method": "POST"}]}) is None  # no time: unknown, not 0


def req(seq: int, provider: str, body: str, call: str = "") -> dict:
    call = call or f"call-{seq}"
    return ev(seq, seq, "model.request", provider=provider, request_sha256=body, call_id=call)


def answered(events: list[dict], reason: str | None = None) -> list[dict]:
    """The requests, each closed: answered, or failed with `reason`."""
    out = list(events)
    for e in events:
        if e["type"] == "model.request":
            kind = "model.response" if reason is None else "model.error"
            fields = {} if reason is None else {"reason": reason}
            out.append(ev(1000 + e["seq"], 1000, kind, call_id=e["call_id"], **fields))
    return out


def test_stub_match_pairs_bodies_as_multisets():
    events = answered([req(0, "a", "x"), req(1, "a", "x"), req(2, "a", "y"), req(3, "b", "z")])
    logs = {
        "a": [{"method": "POST", "body_sha256": h} for h in ("x", "y", "w")]
        + [{"method": "GET", "body_sha256": "q"}],  # not a model call
        "b": [],
    }
    assert stub_match(events, logs) == {
        "a": {"forwarded": 3, "seen": 3, "only_in_ledger": 1, "only_in_stub": 1, "unsure_unseen": 0},
        "b": {"forwarded": 1, "seen": 0, "only_in_ledger": 1, "only_in_stub": 0, "unsure_unseen": 0},
    }  # fmt: skip
    assert stub_match([req(0, "a", "x")], {"a": [{"method": "POST"}]}) == {"a": None}


@settings(deadline=None)
@given(st.lists(st.sampled_from("abc"), max_size=20), st.randoms(use_true_random=False))
def test_stub_match_of_a_shuffled_copy_is_exact(bodies, rng):
    events = answered([req(i, "p", b) for i, b in enumerate(bodies)])
    seen = [{"method": "POST", "body_sha256": b} for b in bodies]
    rng.shuffle(seen)
    out = stub_match(events, {"p": seen})
    expected = {"forwarded": len(bodies), "seen": len(bodies), "only_in_ledger": 0,
                "unsure_unseen": 0}  # fmt: skip
    assert out.get("p", expected | {"only_in_stub": 0}) == expected | {"only_in_stub": 0}
    if bodies:  # drop one arrival: exactly one forwarded call is missing from the stub
        out = stub_match(events, {"p": seen[1:]})
        assert (out["p"]["only_in_ledger"], out["p"]["only_in_stub"]) == (1, 0)


def test_in_flight_counts_open_calls_by_call_id():
    events = [
        req(0, "a", "x", "c1"),
        req(1, "a", "x", "c2"),
        ev(2, 2, "model.response", call_id="c1"),
        req(3, "a", "x", "c3"),
        req(4, "a", "x", "c4"),
        ev(5, 5, "model.error", call_id="c3"),
    ]
    assert in_flight(events) == {"max": 3, "open_at_end": 2, "by_provider": {"a": 3}}
    assert in_flight([]) == {"max": 0, "open_at_end": 0, "by_provider": {}}
    two = [req(0, "a", "x", "c1"), req(1, "b", "x", "c2"), req(2, "b", "y", "c3")]
    assert in_flight(two)["by_provider"] == {"a": 1, "b": 2}
    # a configured upstream with no call at all is an observation (0), not a null
    assert in_flight([], ["openai"])["by_provider"] == {"openai": 0}


def test_backoffs_measure_the_wait_by_the_next_attempt_per_provider():
    events = [
        ev(0, 100, "x-docket.rate-limited", provider="polite"),
        ev(1, 105, "agent.backoff", attempt=1, status=429, wait_s=1.0, retry_after=1.0),
        ev(2, 400, "model.request", provider="hammer"),
        ev(3, 900, "x-docket.breaker-open", upstream="other"),
        ev(4, 1105, "model.request", provider="polite"),
        ev(5, 1200, "agent.backoff", attempt=1, status=503, wait_s=0.2, retry_after=None),
    ]
    first, last = backoffs(events)
    assert first["next_attempt_s"] == {"hammer": 0.295, "other": 0.795, "polite": 1.0}
    assert (first["seq"], first["wait_s"], first["retry_after"]) == (1, 1.0, 1.0)
    assert last["next_attempt_s"] == {}  # nothing after it: an assertion on it finds null


def test_stub_match_compares_the_stub_with_the_bytes_forwarded_when_they_differ():
    # A streaming call without stream_options: the boundary adds include_usage, so the
    # stub sees other bytes than the agent sent; model.request then carries the digest
    # of what was forwarded (forwarded_sha256), and that is what the stub must match.
    events = answered([
        req(0, "a", "sent-1") | {"forwarded_sha256": "wire-1"},
        req(1, "a", "same"),  # forwarded unchanged: no forwarded_sha256
    ])  # fmt: skip
    logs = {"a": [{"method": "POST", "body_sha256": h} for h in ("wire-1", "same")]}
    assert stub_match(events, logs)["a"] == {
        "forwarded": 2, "seen": 2, "only_in_ledger": 0, "only_in_stub": 0, "unsure_unseen": 0,
    }  # fmt: skip
    # and over every provider at once (an invariant that reads every route)
    assert stub_match_all(stub_match(events, logs)) == {
        "forwarded": 2, "seen": 2, "only_in_ledger": 0, "only_in_stub": 0, "unsure_unseen": 0,
    }  # fmt: skip
    assert stub_match_all({"a": None, "b": {"forwarded": 1}}) is None


def test_a_forwarded_call_that_may_never_have_left_is_not_missing_from_the_stub():
    # The agent left mid-call (client_abort), the connection was never made, or the
    # run ended under the call: its absence from the stub's log is no discrepancy. An
    # answered call missing from the stub, or an arrival with no record, still is.
    events = answered([req(0, "a", "x")], "client_abort") + answered([req(1, "a", "y")], "connect")
    events += [req(2, "a", "z")]  # never closed
    assert stub_match(events, {"a": []})["a"] == {
        "forwarded": 3, "seen": 0, "only_in_ledger": 0, "only_in_stub": 0, "unsure_unseen": 3,
    }  # fmt: skip
    lost = answered([req(0, "a", "x")])
    assert stub_match(lost, {"a": []})["a"]["only_in_ledger"] == 1
    leaked = answered([req(0, "a", "x")], "client_abort")
    arrivals = [{"method": "POST", "body_sha256": h} for h in ("x", "w")]
    assert stub_match(leaked, {"a": arrivals})["a"]["only_in_stub"] == 1
