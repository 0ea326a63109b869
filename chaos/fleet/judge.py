"""The fleet scenario's verdict, from what the run left behind: each boundary's ledger
and receipt (and `docket verify`'s word on it), each agent's report, the budget's row
in the database, and when the harness opened and closed each fault window.

Pure: evidence in, checks out (each one line, held or not, with its figures). Nothing
here is taken from the harness's own belief about what happened, except the windows'
times; every claim about spending and failures is read from the ledgers and the
database.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from chaos.fleet.scenario import FleetScenario, Window

NANO = 10**9
# A failed exchange is recorded when it fails: up to the [fleet] timeout, its abandon
# margin (docket/fleet/lease.py) and some scheduling after the window closed.
RECORD_MARGIN_S = 1.5
TS_SLACK_S = 0.01  # ledger stamps are whole milliseconds
COUNTED_ONCE = "counted once"


@dataclass(frozen=True)
class WindowSeen:
    """A window as the harness performed it, in wall-clock seconds (time.time())."""

    window: Window
    started: float
    ended: float
    error: str | None = None  # the harness could not perform or lift the fault


@dataclass(frozen=True)
class BoundarySeen:
    name: str
    returncode: int | None  # None: it had to be killed
    events: Sequence[dict]  # its ledger, in order
    receipt: dict | None
    verified: bool  # `docket verify` exited 0 on its receipt
    verify_said: str  # its last line
    reports: Sequence[dict | None]  # each caller's JSON report (None: it printed none)


@dataclass(frozen=True)
class Evidence:
    scenario: FleetScenario
    windows: Sequence[WindowSeen]
    boundaries: Sequence[BoundarySeen]
    status: dict  # FleetStore.status(budget) once every run has ended
    wall_s: float


@dataclass(frozen=True)
class Check:
    name: str
    held: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.held else 'FAIL'} {self.name}: {self.detail}"


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return bool(self.checks) and all(c.held for c in self.checks)

    def lines(self) -> list[str]:
        failed = sum(not c.held for c in self.checks)
        tail = (
            "verdict: held"
            if self.held
            else f"verdict: NOT held ({failed} of {len(self.checks)} checks failed)"
        )
        return [c.line() for c in self.checks] + [tail]


def stamp(event: dict) -> float:
    """A ledger event's wall-clock time (its `ts`, UTC, milliseconds) in epoch seconds."""
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


def of_type(events: Iterable[dict], *types: str) -> list[dict]:
    return [e for e in events if e.get("type") in types]


def between(events: Iterable[dict], start: float, end: float) -> list[dict]:
    return [e for e in events if start - TS_SLACK_S <= stamp(e) <= end + TS_SLACK_S]


def judge(ev: Evidence) -> Verdict:
    s = ev.scenario
    cap = round(s.cap_usd * NANO)
    v = Verdict()
    every = [e for b in ev.boundaries for e in b.events]
    receipts = [b.receipt for b in ev.boundaries if b.receipt is not None]
    spent = sum(int(r["totals"]["cost_nusd"]) for r in receipts)
    db = ev.status
    db_held = sum(db[k]["nusd"] for k in ("spent", "leased", "lapsed"))
    refused = [e for e in of_type(every, "policy.denied") if str(e.get("rule")).startswith("fleet")]
    failures = of_type(every, "fleet.store")
    v.checks.append(
        Check(
            "cap",
            len(receipts) == len(ev.boundaries) and spent <= cap and db_held <= cap,
            f"the receipts spent {spent:,} nusd of a cap of {cap:,} ({spent / cap:.1%}); the "
            f"database holds {db_held:,} spent, leased or lapsed; {len(refused)} call(s) "
            "refused by the fleet rule",
        )
    )
    v.checks.append(
        Check(
            "database",
            db["spent"]["nusd"] >= spent
            and db["leased"]["nusd"] == 0
            and db["lapsed"]["nusd"] == 0,
            f"the database counts {db['spent']['nusd']:,} nusd spent, the receipts "
            f"{spent:,} (never less: what the cap rests on); {db['leased']['nusd']:,} still "
            f"leased, {db['lapsed']['nusd']:,} lapsed",
        )
    )
    over = db["spent"]["nusd"] - spent
    v.checks.append(
        Check(
            COUNTED_ONCE,
            over == 0,
            "the database counts each charge once"
            if over == 0
            else f"the database counts {over:,} nusd more than the receipts charged: a "
            "report counted twice (an exchange whose COMMIT landed but whose answer was "
            "lost, sent again)",
        )
    )
    v.checks.append(_receipts(ev.boundaries))
    horizons = _horizons(ev.windows, s.timeout)
    for seen, horizon in zip(ev.windows, horizons, strict=True):
        v.checks.append(_window(seen, ev.boundaries, horizon))
    deadline, longest_ms = _deadline(ev.boundaries, s.call_deadline)
    v.checks.append(deadline)
    v.figures = {
        "wall_s": round(ev.wall_s, 3),
        "boundaries": s.boundaries,
        "callers": s.callers,
        "cap_nusd": cap,
        "spent_nusd": spent,
        "spent_share": round(spent / cap, 4),
        "database_spent_nusd": db["spent"]["nusd"],
        "refused": len(refused),
        "refused_by_code": dict(sorted(Counter(str(e.get("code")) for e in refused).items())),
        "served": len(of_type(every, "model.response")),
        "store_failures": len(failures),
        "longest_served_call_ms": longest_ms,
        "windows": {
            w.window.name: {
                "fault": w.window.what,
                "store_failures": len(between(failures, w.started, horizon)),
                "served": len(between(of_type(every, "model.response"), w.started, w.ended)),
                "lasted_s": round(w.ended - w.started, 3),
            }
            for w, horizon in zip(ev.windows, horizons, strict=True)
        },
    }
    return v


def _horizons(windows: Sequence[WindowSeen], timeout: float) -> list[float]:
    """Until when a window's failed exchanges may still be recorded: its end plus the
    exchange's timeout and margin, but never into the next window."""
    out = []
    for i, w in enumerate(windows):
        horizon = w.ended + timeout + RECORD_MARGIN_S
        if i + 1 < len(windows):
            horizon = min(horizon, windows[i + 1].started)
        out.append(horizon)
    return out


def _receipts(boundaries: Sequence[BoundarySeen]) -> Check:
    problems = []
    for b in boundaries:
        if b.receipt is None:
            problems.append(f"{b.name} left no receipt (exit {b.returncode})")
            continue
        if not b.verified:
            problems.append(f"{b.name}: docket verify: {b.verify_said}")
        fleet = b.receipt.get("fleet") or {}
        counted = len(of_type(b.events, "fleet.store"))
        if fleet.get("store_failures") != counted:
            problems.append(
                f"{b.name}: the receipt says {fleet.get('store_failures')} store failure(s), "
                f"its ledger holds {counted}"
            )
        if b.returncode is None:
            problems.append(f"{b.name} did not stop when asked and was killed")
    return Check(
        "receipts",
        not problems,
        "; ".join(problems)
        or f"all {len(boundaries)} verify (docket verify), and each one's "
        "fleet.store_failures is its ledger's count of fleet.store",
    )


def _window(seen: WindowSeen, boundaries: Sequence[BoundarySeen], horizon: float) -> Check:
    w = seen.window
    name = f"window {w.name} ({w.what}, {seen.ended - seen.started:.1f} s)"
    if seen.error is not None:
        return Check(name, False, f"the harness could not perform it: {seen.error}")
    every = [e for b in boundaries for e in b.events]
    failed = between(of_type(every, "fleet.store"), seen.started, horizon)
    if w.expect == "served":
        served = between(of_type(every, "model.response"), seen.started, seen.ended)
        inside = between(of_type(every, "fleet.store"), seen.started, seen.ended)
        return Check(
            name,
            bool(served) and not inside,
            f"{len(served)} call(s) served in it, {len(inside)} failed exchange(s) with the "
            "database (a slow database still in time: none expected)",
        )
    late = []
    back_after = 0.0
    for b in boundaries:
        exchanged = [
            e
            for e in of_type(b.events, "fleet.lease")
            if e.get("change") in ("drawn", "renewed") and stamp(e) > seen.ended
        ]
        if not exchanged:
            late.append(b.name)
        else:
            back_after = max(back_after, stamp(exchanged[0]) - seen.ended)
    return Check(
        name,
        bool(failed) and not late,
        f"{len(failed)} fleet.store event(s) in it"
        + (
            f"; every boundary back at the database within {back_after:.1f} s of its end"
            if not late
            else f"; never back at the database after it: {', '.join(late)}"
        ),
    )


def _deadline(boundaries: Sequence[BoundarySeen], call_deadline: float) -> tuple[Check, int]:
    """No call waited past its deadline: each caller's timeout is the deadline, so a call
    that took longer is a *Timeout error in its report (the boundary sends no byte of a
    non-streamed answer before it has the whole answer, refusals included)."""
    silent, late = [], 0
    calls = 0
    for b in boundaries:
        for i, report in enumerate(b.reports):
            if report is None:
                silent.append(f"{b.name}/caller-{i}")
                continue
            calls += int(report.get("calls", 0))
            late += sum(n for why, n in report.get("errors", {}).items() if "Timeout" in why)
    longest = max(
        (int(e.get("duration_ms", 0)) for b in boundaries for e in b.events
         if e.get("type") == "model.response"),
        default=0,
    )  # fmt: skip
    detail = (
        f"{calls:,} attempt(s) by the agents, {late} past the deadline of {call_deadline:g} s; "
        f"longest served call {longest} ms at the provider"
    )
    if silent:
        detail += f"; no report from {', '.join(silent)}"
    return Check("deadline", not silent and late == 0 and calls > 0, detail), longest
