"""What the boundary exports at /docket/metrics, in the Prometheus text format 0.0.4.

The hot path only adds to plain counters and histogram buckets; the text is
built at scrape time by prometheus_client, from a registry of one Boundary's
own (never the library's global one: a process, a test run say, may hold many
boundaries). Guard states (breakers, limiter, bulkheads), spend and the
ledger's counters are read from their owners when scraped, so the export and
the thing it describes cannot drift apart.

Label sets are bounded: providers and upstreams are the policy's, outcomes and
refusal types are the boundary's own words (a refusal for an unknown route is
counted under one label, never under the name the client sent).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from docket.boundary.guarded import Guards
from docket.boundary.ports import MetricsSource
from docket.guards import breaker as brk

if TYPE_CHECKING:  # prometheus_client is imported when a scrape needs it
    from prometheus_client.metrics_core import Metric

# An upstream call takes from milliseconds (a cached stub) to minutes (a long stream).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# One write + fdatasync of a batch: sub-millisecond on a fast SSD, tens of ms on a busy disk.
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Counts per bucket (upper bound inclusive, as Prometheus's `le`), a sum and a count."""

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class Metrics:
    """The boundary's counters. `guards`: the breakers, limiter and bulkheads whose state
    a scrape reads (None in a boundary built without them, as some tests do)."""

    def __init__(self, guards: Guards | None = None) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()  # (provider, outcome)
        self.refusals: Counter[tuple[str, str]] = Counter()  # (provider, docket error type)
        self.shed: Counter[str] = Counter()  # upstream -> load.shed refusals
        self.latency_sum = 0.0
        self.latency_count = 0
        self.upstream_latency: dict[str, Histogram] = {}
        self.fsync = Histogram(FSYNC_BUCKETS)
        self.guards = guards
        # The response cache (docs/cache.md), when [cache] is on: per provider what became
        # of each call it was asked about: hit, stored, or the reason an answer was not
        # stored (decide.REASONS: bounded). Its size is read from the boundary when scraped.
        self.cache_outcomes: Counter[tuple[str, str]] = Counter()
        self.cache_saved_nusd = 0

    # ------------------------------------------------------------------ the hot path

    def call_finished(self, provider: str, outcome: str, seconds: float) -> None:
        """A forwarded call closed: `seconds` from forwarding to its closing event."""
        self.calls[provider, outcome] += 1
        self.latency_sum += seconds
        self.latency_count += 1
        histogram = self.upstream_latency.get(provider)
        if histogram is None:
            histogram = self.upstream_latency[provider] = Histogram(LATENCY_BUCKETS)
        histogram.observe(seconds)

    def refused(self, provider: str, error_type: str) -> None:
        self.refusals[provider, error_type] += 1

    def load_shed(self, upstream: str) -> None:
        self.shed[upstream] += 1

    def cache_outcome(self, provider: str, outcome: str, saved_nusd: int = 0) -> None:
        self.cache_outcomes[provider, outcome] += 1
        self.cache_saved_nusd += saved_nusd

    def fsync_done(self, seconds: float) -> None:
        """The ledger made a batch durable in `seconds` (its on_sync hook)."""
        self.fsync.observe(seconds)

    # ------------------------------------------------------------------ scraping

    def render(self, boundary: MetricsSource) -> str:
        """The text format, for `boundary` (its caps' totals and its ledger's counters
        are read now)."""
        # Imported here: it costs ~70 ms, which every `docket` start would pay otherwise.
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Scrape(self, boundary))
        return generate_latest(registry).decode("utf-8")


class _Scrape:
    """A collector for one scrape (prometheus_client calls collect() once)."""

    def __init__(self, metrics: Metrics, boundary: MetricsSource) -> None:
        self.m = metrics
        self.b = boundary

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (  # at scrape time: see render
            CounterMetricFamily,
            HistogramMetricFamily,
            SummaryMetricFamily,
        )

        m = self.m
        calls = CounterMetricFamily(
            "docket_model_calls", "Model calls forwarded, by provider and outcome.",
            labels=["provider", "outcome"],
        )  # fmt: skip
        for (provider, outcome), n in sorted(m.calls.items()):
            calls.add_metric([provider, outcome], n)
        yield calls
        refusals = CounterMetricFamily(
            "docket_refusals", "Requests the boundary refused, by provider and docket error type.",
            labels=["provider", "type"],
        )  # fmt: skip
        for (provider, kind), n in sorted(m.refusals.items()):
            refusals.add_metric([provider, kind], n)
        yield refusals
        yield SummaryMetricFamily(
            "docket_model_call_seconds",
            "Time from forwarding a call to its closing event.",
            count_value=m.latency_count,
            sum_value=m.latency_sum,
        )
        latency = HistogramMetricFamily(
            "docket_upstream_latency_seconds",
            "Time from forwarding a call to its closing event, by provider.",
            labels=["provider"],
        )
        for provider, histogram in sorted(m.upstream_latency.items()):
            latency.add_metric([provider], histogram.cumulative(), histogram.sum)
        yield latency
        fsync = HistogramMetricFamily(
            "docket_ledger_fsync_seconds", "Write and fdatasync of one batch of ledger lines."
        )
        fsync.add_metric([], m.fsync.cumulative(), m.fsync.sum)
        yield fsync
        yield from self._money_and_ledger()
        if m.guards is not None:
            yield from self._guards(m.guards)
        if self.b.cache is not None:
            yield from self._cache(m, len(self.b.cache.store))

    def _cache(self, m: Metrics, entries: int) -> Iterator[Metric]:
        from prometheus_client.core import (  # at scrape time: see render
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        outcomes = CounterMetricFamily(
            "docket_cache_calls",
            "Calls the response cache was asked about, by provider and outcome "
            "(hit, stored, or why the answer was not stored).",
            labels=["provider", "outcome"],
        )
        for (provider, outcome), n in sorted(m.cache_outcomes.items()):
            outcomes.add_metric([provider, outcome], n)
        yield outcomes
        yield CounterMetricFamily(
            "docket_cache_saved_usd",
            "What the answers served from the cache cost when first paid, in USD.",
            value=m.cache_saved_nusd / 1e9,
        )
        yield GaugeMetricFamily(
            "docket_cache_entries", "Answers held by the response cache.", value=entries
        )

    def _money_and_ledger(self) -> Iterator[Metric]:
        from prometheus_client.core import (  # at scrape time: see render
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        totals = self.b.caps.totals()
        ledger = self.b.ledger
        yield CounterMetricFamily(
            "docket_spend_usd", "Spend settled so far, in USD.", value=totals.nusd / 1e9
        )
        yield GaugeMetricFamily(
            "docket_calls_in_flight", "Calls forwarded and not yet settled.", value=totals.in_flight
        )
        yield CounterMetricFamily(
            "docket_ledger_events", "Events durable in the ledger.", value=ledger.count
        )
        yield CounterMetricFamily(
            "docket_ledger_unwritten_events",
            "Events the ledger could not write.",
            value=ledger.stats.unwritten_events,
        )

    def _guards(self, guards: Guards) -> Iterator[Metric]:
        from prometheus_client.core import (  # at scrape time: see render
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        now = guards.now()
        state = GaugeMetricFamily(
            "docket_breaker_state",
            "Circuit breaker state per upstream: 0 closed, 1 half-open, 2 open.",
            labels=["upstream"],
        )
        refused = CounterMetricFamily(
            "docket_breaker_refusals",
            "Calls the circuit breaker refused, per upstream.",
            labels=["upstream"],
        )
        # The gauge alone can miss a whole open -> half-open -> closed cycle between two
        # scrapes; the counters cannot: an increase of `to="open"` is an opening seen.
        moved = CounterMetricFamily(
            "docket_breaker_transitions",
            "Circuit breaker transitions per upstream, by the state moved to.",
            labels=["upstream", "to"],
        )
        for name, breaker in sorted(guards.breakers.items()):
            status = breaker.status(now)
            state.add_metric([name], status.state_code)
            refused.add_metric([name], status.refusals)
            for to_state in sorted(brk.STATE_CODES):
                moved.add_metric([name, to_state], status.transitions_to.get(to_state, 0))
        yield state
        yield refused
        yield moved
        limited = 0 if guards.limiter is None else guards.limiter.status(now).refused
        yield CounterMetricFamily(
            "docket_rate_limited", "Calls the rate limiter refused.", value=limited
        )
        shed = CounterMetricFamily(
            "docket_load_shed", "Calls the bulkhead shed, per upstream.", labels=["upstream"]
        )
        in_flight = GaugeMetricFamily(
            "docket_bulkhead_in_flight", "Upstream slots in use, per upstream.", labels=["upstream"]
        )
        queued = GaugeMetricFamily(
            "docket_bulkhead_queued", "Calls waiting for a slot, per upstream.", labels=["upstream"]
        )
        for name in sorted(guards.breakers):
            shed.add_metric([name], self.m.shed[name])
            bulkhead = guards.bulkheads.get(name)
            if bulkhead is not None:
                slots = bulkhead.core.status()
                in_flight.add_metric([name], slots.in_flight)
                queued.add_metric([name], slots.queued)
        yield shed
        yield in_flight
        yield queued
