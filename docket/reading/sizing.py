"""Little's law over a run: how many calls were in flight to each provider, and the
bulkhead that would have held them, with the arithmetic shown.

L = lambda x W: the mean number of calls in flight is the arrival rate times the mean
time in the system. From a run's forwarded calls (arrivals: model.request; times:
to their closing event) this says, per provider, lambda, W (mean and p95), L, the
peak actually seen, and a suggested `max_concurrent_upstream` (lambda x p95 W, twice,
for bursts, and never below the peak seen) and `max_queue` (as many again). Pure:
calls in, numbers out; `docket explain` prints it after the findings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from docket.reading.calls import Call

HEADROOM = 2  # the suggestion's margin over lambda x p95 W, for bursts


@dataclass
class _Provider:
    arrivals: list[int] = field(default_factory=list)  # mono_ms of each model.request
    spans: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of closed calls


class Sizing:
    """Fed each call at its request and at its close; `advice()` per provider."""

    def __init__(self) -> None:
        self.providers: dict[str, _Provider] = {}

    def on_request(self, call: Call) -> None:
        self.providers.setdefault(call.provider, _Provider()).arrivals.append(call.mono_ms)

    def on_close(self, call: Call) -> None:
        if call.end_mono_ms is not None:
            seen = self.providers.setdefault(call.provider, _Provider())
            seen.spans.append((call.mono_ms, max(call.end_mono_ms, call.mono_ms)))

    def advice(self) -> dict[str, dict[str, object]]:
        """Per provider with at least two closed calls over a span of time."""
        out: dict[str, dict[str, object]] = {}
        for name, seen in sorted(self.providers.items()):
            figures = _figures(seen)
            if figures is not None:
                out[name] = figures
        return out


def _figures(seen: _Provider) -> dict[str, object] | None:
    arrivals = sorted(seen.arrivals)
    if len(seen.spans) < 2 or len(arrivals) < 2 or arrivals[-1] == arrivals[0]:
        return None
    window_s = (arrivals[-1] - arrivals[0]) / 1000
    rate = (len(arrivals) - 1) / window_s  # arrivals per second between the first and last
    times = sorted((end - start) / 1000 for start, end in seen.spans)
    mean_s = sum(times) / len(times)
    p95_s = times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)]
    in_flight = rate * mean_s
    peak = _peak(seen.spans)
    pool = max(peak, math.ceil(HEADROOM * rate * p95_s), 1)
    return {
        "calls": len(arrivals),
        "arrival_per_s": round(rate, 3),
        "mean_s": round(mean_s, 3),
        "p95_s": round(p95_s, 3),
        "mean_in_flight": round(in_flight, 2),
        "peak_in_flight": peak,
        "max_concurrent_upstream": pool,
        "max_queue": pool,
        "arithmetic": (
            f"lambda = {len(arrivals) - 1} arrivals / {window_s:.3g} s = {rate:.3g}/s; "
            f"W = {mean_s:.3g} s (p95 {p95_s:.3g} s); L = lambda x W = {in_flight:.3g} in flight "
            f"(peak seen {peak}); max_concurrent_upstream = max(peak, ceil({HEADROOM} x "
            f"{rate:.3g} x {p95_s:.3g})) = {pool}, max_queue as many again"
        ),
    }


def _peak(spans: list[tuple[int, int]]) -> int:
    """The most calls in flight at once (a call ending as another starts is not overlap)."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak
