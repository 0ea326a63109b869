"""What the reference agent says at the end: the running tally, its summary line, the verdict.

The Tally keeps totals only (the agent keeps no per-call history); `summary` is
the JSON line printed on stdout, and `verdict` says whether the run did what its
mode promises, which decides the exit code. All pure: facts in, a decision out.
"""

from __future__ import annotations

import signal
from collections import Counter
from dataclasses import dataclass, field

from docket.agent.budget import RetryBudget
from docket.agent.calls import Outcome
from docket.agent.config import AgentConfig

STOP_SIGNALS = {signal.SIGTERM: "sigterm", signal.SIGINT: "sigint"}  # -> Tally.stopped


@dataclass
class Tally:
    """Running totals for the summary line (the agent keeps no per-call history)."""

    calls: int = 0
    ok: int = 0
    answered: int = 0
    refused: Counter = field(default_factory=Counter)  # by status
    refused_types: Counter = field(default_factory=Counter)  # by error.type
    errors: Counter = field(default_factory=Counter)  # by reason
    first_error: str | None = None
    waited_s: float = 0.0
    retries: int = 0
    gave_up: Counter = field(default_factory=Counter)
    reports: Counter = field(default_factory=Counter)  # "sent" | "failed" | "unreported"
    stopped: str = "done"
    interrupted: int = 0  # calls whose request had been sent when a signal stopped the agent
    unsent: int = 0  # calls stopped by the signal before their request was sent in full
    budget: RetryBudget | None = None  # backoff mode's retry budget

    def record(self, outcome: Outcome) -> None:
        self.calls += 1
        self.answered += outcome.answered
        if outcome.kind == "ok":
            self.ok += 1
        elif outcome.kind == "refused":
            self.refused[str(outcome.status)] += 1
            if outcome.error_type:
                self.refused_types[outcome.error_type] += 1
        else:
            self.errors[outcome.reason or "unknown"] += 1
            if self.first_error is None:
                self.first_error = f"{outcome.reason}: {outcome.detail}"

    def summary(self, config: AgentConfig, elapsed_s: float) -> dict:
        out = {
            "mode": config.mode,
            "provider": config.provider,
            "model": config.model,
            "calls": self.calls,
            "answered": self.answered,
            "ok": self.ok,
            "refused": dict(self.refused),
            "refused_types": dict(self.refused_types),
            "errors": dict(self.errors),
            "waited_s": round(self.waited_s, 6),
            "elapsed_s": round(elapsed_s, 6),
            "stopped": self.stopped,
            "seed": config.seed,
        }
        if self.stopped in STOP_SIGNALS.values():
            out["interrupted"] = self.interrupted
            out["unsent"] = self.unsent
        if self.first_error is not None:
            out["first_error"] = self.first_error
        if config.mode == "backoff":
            out["retries"] = self.retries
            out["gave_up"] = dict(self.gave_up)
            out["reports"] = dict(self.reports)
            if self.budget is not None:
                out["retry_budget"] = self.budget.summary()
        if config.mode == "hammer":
            out["concurrency"] = config.concurrency
        return out


def verdict(config: AgentConfig, summary: dict) -> str | None:
    """Why the run did not do what its mode says, or None when it did."""
    if config.mode in ("once", "stream"):
        if summary["ok"] == 1:
            return None
        if summary["refused"]:
            (status,) = summary["refused"]
            kinds = ", ".join(summary["refused_types"]) or "no error type"
            return f"the call was refused: HTTP {status} ({kinds})"
        return f"the call failed: {summary.get('first_error')}"
    # A refusal is what loop, hammer and backoff exist to meet; never reaching
    # the server at all is not (a wrong port, a boundary that is not up).
    if summary["calls"] and not summary["answered"]:
        return f"no call got an HTTP answer ({summary.get('first_error')})"
    return None
