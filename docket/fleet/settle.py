"""What a dead run spent, read back from its ledger: to settle its lapsed leases.

A run that died (SIGKILL, a lost machine) never reports what it used of its lease,
so the lease lapses whole and stays counted as spent (docs/fleet.md). Its ledger
says more: the boundary makes every model.request durable before the call is
forwarded, so each call that could have cost anything is on disk. Closed calls are
charged what their closing event says; a call open at the end (in flight when the
run died) is charged its worst case, as the caps guard reserved it. The sum is an
upper bound of what the run spent, and `docket fleet settle` gives the rest of its
lapsed leases back to the budget. Pure: events in, amounts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from docket.fleet.amounts import Amounts
from docket.pricing import PriceTable

DEFAULT_MAX_OUTPUT_TOKENS = 32768  # docket.policy.CapsPolicy's default_max_output_tokens


class LedgerSpend:
    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self.run_id: str | None = None
        self.spent = Amounts()
        self._open: dict[str, Amounts] = {}  # call_id -> its worst case

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "session.start":
            self.run_id = event.get("run_id")
        elif kind == "model.request":
            self._open[str(event["call_id"])] = self._worst_case(event)
        elif kind in ("model.response", "model.error"):
            worst = self._open.pop(str(event["call_id"]), None)
            usage = event.get("usage") or {}
            tokens = usage.get("input_tokens", 0) + usage.get("output_tokens", 0) if usage else None
            if tokens is None:
                tokens = worst.tokens if worst is not None else 0
            self.spent += Amounts(int(event.get("cost_nusd") or 0), tokens, 1)

    def total(self) -> Amounts:
        """What the run spent: its closed calls, and each call still open at its worst case."""
        total = self.spent
        for worst in self._open.values():
            total += worst
        return total

    def _worst_case(self, event: Mapping[str, Any]) -> Amounts:
        size = int(event.get("request_bytes") or 0)
        declared = event.get("max_output_tokens")
        # undeclared: the caps guard reserved the policy's default; the default default
        # is the bound here (a run whose policy raised it: settle reads too little)
        out = int(declared) if declared is not None else DEFAULT_MAX_OUTPUT_TOKENS
        price = self.prices.lookup(str(event.get("model") or ""))
        nusd = 0
        if price is not None:
            nusd = size * price.max_input_nusd_per_token + out * price.output_nusd_per_token
        return Amounts(nusd, size + out, 1)


def ledger_spend(
    events: Iterable[Mapping[str, Any]], prices: PriceTable
) -> tuple[str | None, Amounts]:
    fold = LedgerSpend(prices)
    for event in events:
        fold.feed(event)
    return fold.run_id, fold.total()
