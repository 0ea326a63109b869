"""Counters the boundary keeps for /docket/metrics (Prometheus text format).

Running totals only, updated on the hot path by plain integer increments.
"""

from __future__ import annotations

from collections import Counter


class Metrics:
    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()  # (provider, outcome)
        self.refusals: Counter[tuple[str, str]] = Counter()  # (provider, docket error type)
        self.latency_sum = 0.0

    def call_finished(self, provider: str, outcome: str, seconds: float) -> None:
        self.calls[provider, outcome] += 1
        self.latency_sum += seconds

    def refused(self, provider: str, error_type: str) -> None:
        self.refusals[provider, error_type] += 1

    def render(self, boundary) -> str:
        lines = [
            "# HELP docket_model_calls_total Model calls forwarded, by provider and outcome.",
            "# TYPE docket_model_calls_total counter",
        ]
        for (provider, outcome), n in sorted(self.calls.items()):
            lines.append(
                f'docket_model_calls_total{{provider="{provider}",outcome="{outcome}"}} {n}'
            )
        lines += [
            "# HELP docket_refusals_total Requests the boundary refused, by provider and type.",
            "# TYPE docket_refusals_total counter",
        ]
        for (provider, kind), n in sorted(self.refusals.items()):
            lines.append(f'docket_refusals_total{{provider="{provider}",type="{kind}"}} {n}')
        totals = boundary.caps.totals()
        lines += [
            "# HELP docket_spend_usd_total Spend settled so far, in USD.",
            "# TYPE docket_spend_usd_total counter",
            f"docket_spend_usd_total {totals.nusd / 1e9:.9f}",
            "# HELP docket_ledger_events_total Events durable in the ledger.",
            "# TYPE docket_ledger_events_total counter",
            f"docket_ledger_events_total {boundary.ledger.count}",
        ]
        return "\n".join(lines) + "\n"
