"""Counters the boundary keeps for /docket/metrics (Prometheus text format 0.0.4).

Running totals only, updated on the hot path by plain integer increments. Label
sets are bounded: providers are the policy's, outcomes and refusal types are the
boundary's own words (a refusal for an unknown route is counted under one label,
never under the name the client sent).
"""

from __future__ import annotations

from collections import Counter


def label(value: str) -> str:
    """A label value escaped as the text format requires (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()  # (provider, outcome)
        self.refusals: Counter[tuple[str, str]] = Counter()  # (provider, docket error type)
        self.latency_sum = 0.0
        self.latency_count = 0

    def call_finished(self, provider: str, outcome: str, seconds: float) -> None:
        self.calls[provider, outcome] += 1
        self.latency_sum += seconds
        self.latency_count += 1

    def refused(self, provider: str, error_type: str) -> None:
        self.refusals[provider, error_type] += 1

    def render(self, boundary) -> str:
        lines = [
            "# HELP docket_model_calls_total Model calls forwarded, by provider and outcome.",
            "# TYPE docket_model_calls_total counter",
        ]
        for (provider, outcome), n in sorted(self.calls.items()):
            lines.append(
                f'docket_model_calls_total{{provider="{label(provider)}",'
                f'outcome="{label(outcome)}"}} {n}'
            )
        lines += [
            "# HELP docket_refusals_total Requests the boundary refused, by provider and type.",
            "# TYPE docket_refusals_total counter",
        ]
        for (provider, kind), n in sorted(self.refusals.items()):
            lines.append(
                f'docket_refusals_total{{provider="{label(provider)}",type="{label(kind)}"}} {n}'
            )
        totals = boundary.caps.totals()
        evidence = boundary.ledger.stats
        lines += [
            "# HELP docket_model_call_seconds Time from a call's arrival to its closing event.",
            "# TYPE docket_model_call_seconds summary",
            f"docket_model_call_seconds_sum {self.latency_sum:.6f}",
            f"docket_model_call_seconds_count {self.latency_count}",
            "# HELP docket_spend_usd_total Spend settled so far, in USD.",
            "# TYPE docket_spend_usd_total counter",
            f"docket_spend_usd_total {totals.nusd / 1e9:.9f}",
            "# HELP docket_calls_in_flight Calls forwarded and not yet settled.",
            "# TYPE docket_calls_in_flight gauge",
            f"docket_calls_in_flight {totals.in_flight}",
            "# HELP docket_ledger_events_total Events durable in the ledger.",
            "# TYPE docket_ledger_events_total counter",
            f"docket_ledger_events_total {boundary.ledger.count}",
            "# HELP docket_ledger_unwritten_events_total Events the ledger could not write.",
            "# TYPE docket_ledger_unwritten_events_total counter",
            f"docket_ledger_unwritten_events_total {evidence.unwritten_events}",
        ]
        return "\n".join(lines) + "\n"
