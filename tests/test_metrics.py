"""The metrics' own parts: histogram buckets against a plain count, and the text
format as prometheus_client's parser reads it, for one Boundary's private export."""

from __future__ import annotations

import types

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from docket.boundary.metrics import FSYNC_BUCKETS, Histogram, Metrics
from docket.guards.caps import CapsGuard
from docket.policy import CapsPolicy
from docket.pricing import default_price_table


@settings(deadline=None)
@given(
    bounds=st.lists(st.floats(0, 100), min_size=1, max_size=8, unique=True),
    values=st.lists(st.floats(0, 200), max_size=50),
)
def test_histogram_buckets_count_what_is_at_or_below_each_bound(bounds, values):
    histogram = Histogram(bounds)
    for v in values:
        histogram.observe(v)
    cumulative = histogram.cumulative()
    assert [le for le, _ in cumulative][-1] == "+Inf"
    for (le, n), bound in zip(cumulative, [*sorted(bounds), float("inf")], strict=True):
        assert n == sum(1 for v in values if v <= bound), (le, bound)
    assert histogram.count == len(values)


def boundary_without_guards():
    ledger = types.SimpleNamespace(count=7, stats=types.SimpleNamespace(unwritten_events=0))
    return types.SimpleNamespace(
        caps=CapsGuard(CapsPolicy(), default_price_table()), ledger=ledger, cache=None
    )


def test_each_metrics_object_exports_only_its_own_figures():
    one, other = Metrics(), Metrics()
    one.fsync_done(0.002)
    one.fsync_done(0.2)
    one.call_finished("openai", "ok", 0.03)
    text_one = one.render(boundary_without_guards())
    text_other = other.render(boundary_without_guards())
    fams = {f.name: f for f in text_string_to_metric_families(text_one)}
    fsync = {s.name: s for s in fams["docket_ledger_fsync_seconds"].samples if not s.labels}
    assert fsync["docket_ledger_fsync_seconds_count"].value == 2
    buckets = {
        s.labels["le"]: s.value
        for s in fams["docket_ledger_fsync_seconds"].samples
        if s.name.endswith("_bucket")
    }
    assert (
        len(buckets) == len(FSYNC_BUCKETS) + 1 and buckets["0.0025"] == 1 and buckets["+Inf"] == 2
    )
    others = {f.name: f for f in text_string_to_metric_families(text_other)}
    (count,) = [
        s for s in others["docket_ledger_fsync_seconds"].samples if s.name.endswith("_count")
    ]
    assert count.value == 0 and others["docket_upstream_latency_seconds"].samples == []
