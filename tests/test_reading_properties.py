"""Properties of explain's pure core (the Explainer fold, fed decoded events directly)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.reading.explain import Explainer
from docket.reading.thresholds import DEFAULTS

MODELS = [
    ("openai", "gpt-4o-mini"),
    ("openai", "gpt-4o"),
    ("anthropic", "claude-3-5-haiku-20241022"),
]
REFUSALS = ["x-docket.rate-limited", "x-docket.breaker-open", "load.shed", "policy.denied"]

call = st.tuples(
    st.just("call"),
    st.integers(0, len(MODELS) - 1),  # model
    st.integers(0, 3),  # body: few distinct, so repeats happen
    st.booleans(),  # answered (else failed)
    st.integers(0, 400),  # ms before it
    st.integers(0, 30000),  # input tokens
    st.integers(0, 300),  # output tokens
    st.sampled_from([None, 0, 1, 2]),  # the client's attempt marker
)
refusal = st.tuples(st.just("refusal"), st.sampled_from(REFUSALS), st.integers(0, 400))
runs = st.lists(st.one_of(call, refusal), max_size=80)


def events(ops: list) -> list[dict]:
    out: list[dict] = []
    mono = 0

    def add(type: str, **fields: object) -> None:
        out.append({"seq": len(out), "mono_ms": mono, "ts": "t", "type": type, **fields})

    for i, op in enumerate(ops):
        if op[0] == "call":
            _, m, body, ok, gap, tin, tout, attempt = op
            provider, model = MODELS[m]
            mono += gap
            fields = {"provider": provider, "model": model, "call_id": f"c{i}"}
            request = {
                "endpoint": "chat",
                "request_bytes": 100 + body,
                "request_sha256": f"{body:064x}",
            }
            if attempt is not None:
                request["client_attempt"] = attempt
            add("model.request", **fields, **request)
            usage = {"input_tokens": tin, "output_tokens": tout}
            cost = tin * 150 + tout * 600
            if ok:
                add(
                    "model.response",
                    **fields,
                    status=200,
                    usage=usage,
                    cost_nusd=cost,
                    unit_prices={"input": "0.15", "output": "0.60", "cached_input": "0.075"},
                )
            else:
                add("model.error", **fields, status=503, usage={}, cost_nusd=0, retry_after="1")
        else:
            _, kind, gap = op
            mono += gap
            add(
                kind, provider="openai", model="gpt-4o-mini", rule="caps.max_usd", retry_after_s=0.5
            )
    return out


def explain(evs: list[dict], limits=DEFAULTS) -> tuple[Explainer, list]:
    x = Explainer(limits)
    for e in evs:
        x.add(e)
    return x, x.findings()


@settings(deadline=None)
@given(runs)
def test_findings_are_costliest_first_and_never_cost_more_than_the_run(ops):
    x, findings = explain(events(ops))
    costs = [f.cost_nusd for f in findings]
    assert costs == sorted(costs, reverse=True)
    for f in findings:
        assert 0 <= f.cost_nusd <= x.cost_nusd
        assert f.calls >= 0 and f.wall_ms >= 0
        assert "seq" in f.evidence or f.pattern == "concentration"


@settings(deadline=None)
@given(runs, st.integers(1, 40))
def test_a_higher_threshold_never_names_more(ops, more):
    evs = events(ops)
    base = {f.pattern for f in explain(evs)[1]}
    stricter = dataclasses.replace(
        DEFAULTS,
        retry_min_recalls=DEFAULTS.retry_min_recalls + more,
        loop_min_calls=DEFAULTS.loop_min_calls + more,
        loop_min_calls_uncapped=DEFAULTS.loop_min_calls_uncapped + more,
        cache_min_repeats=DEFAULTS.cache_min_repeats + more,
        denial_min_repeats=DEFAULTS.denial_min_repeats + more,
    )
    assert {f.pattern for f in explain(evs, stricter)[1]} <= base


@given(st.integers(0, 10**12), st.integers(0, 10**12))
def test_seq_ranges_read_back(a, b):
    from docket.errors import InputError
    from docket.reading.show import parse_seq_range

    assert parse_seq_range(f"{a}..") == (a, None)
    assert parse_seq_range(f"..{b}") == (None, b)
    assert parse_seq_range(str(a)) == (a, a)
    if a <= b:
        assert parse_seq_range(f"{a}..{b}") == (a, b)
    else:
        with pytest.raises(InputError, match="ends before it starts"):
            parse_seq_range(f"{a}..{b}")
