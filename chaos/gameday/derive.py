"""Named conveniences computed from the evidence, so assertions stay one query and one comparison.

Each is a small pure function of the events and the stubs' request logs; the
runner adds their results to the evidence under the names in `derive()`. They
compute facts (a percentile, the breaker's states in order, calls per second),
never verdicts: whether a fact is good is written in the phase file.
A fact that cannot be computed from the evidence is null, so an assertion on it
is unknown, never a pass.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TypeGuard, TypeVar

from docket.ledger.chain import EVENT_TYPES

_T = TypeVar("_T")

CLOSING = ("model.response", "model.error")
OPEN = "open"
# A call as the boundary met it: forwarded (model.request) or refused by a guard.
ATTEMPTS = ("model.request", "policy.denied", "x-docket.rate-limited", "x-docket.breaker-open",
            "load.shed")  # fmt: skip


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile: a value that was observed, never an interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _summary(durations: list[float]) -> dict:
    return {
        "count": len(durations),
        "p50_ms": percentile(durations, 50),
        "p90_ms": percentile(durations, 90),
        "p95_ms": percentile(durations, 95),
        "p99_ms": percentile(durations, 99),
        "p999_ms": percentile(durations, 99.9),
        "max_ms": max(durations) if durations else None,
    }


def latency(events: Iterable[Mapping], upstreams: Iterable[str] = ()) -> dict:
    """Per-call time from forwarding to the closing event (the ledger's `duration_ms`),
    over every closed call and per provider; every configured upstream is there, with
    count 0 (and null percentiles) when none of its calls closed."""
    every: list[float] = []
    by_provider: dict[str, list[float]] = {str(name): [] for name in upstreams}
    for e in events:
        if e.get("type") in CLOSING and _number(e.get("duration_ms")):
            every.append(e["duration_ms"])
            by_provider.setdefault(str(e.get("provider")), []).append(e["duration_ms"])
    return {
        "all": _summary(every),
        "by_provider": {name: _summary(d) for name, d in sorted(by_provider.items())},
    }


def counts(events: Iterable[Mapping], known: Iterable[str] = ()) -> dict[str, int]:
    """Events per type; every type in `known` (the ledger's event types) is there, 0 when
    none was written: "no cap.exceeded" is an observation (0), not a missing value."""
    out = dict.fromkeys(sorted(known), 0)
    out.update(Counter(str(e.get("type")) for e in events))
    return out


def first_seq(events: Iterable[Mapping]) -> dict[str, int | None]:
    """The seq of the first event of each type (to assert one kind of event comes first);
    None for an event without one (a ledger's events all have one)."""
    out: dict[str, int | None] = {}
    for e in events:
        out.setdefault(str(e.get("type")), e.get("seq"))
    return out


def mono(events: Sequence[Mapping]) -> dict:
    """Whether the ledger's monotonic clock never went back, the span it covers, and the
    span its wall-clock stamps (`ts`) cover: the two differ when the clock was stepped."""
    stamps = [e.get("mono_ms") for e in events]
    walls = [wall_ms(e.get("ts")) for e in events]
    wall_span = None if not walls or not _none_free(walls) else round(max(walls) - min(walls))
    if not stamps or not _numbers(stamps):
        return {"non_decreasing": None, "span_ms": None, "wall_span_ms": wall_span}
    ordered = all(a <= b for a, b in zip(stamps, stamps[1:], strict=False))
    return {"non_decreasing": ordered, "span_ms": stamps[-1] - stamps[0], "wall_span_ms": wall_span}


def model_calls(entries: Iterable[Mapping]) -> list[Mapping]:
    """The stub log entries that are model calls (POSTs), not the harness's own requests."""
    return [e for e in entries if e.get("method") == "POST"]


def stub_calls(stub_logs: Mapping[str, Sequence[Mapping]]) -> dict[str, int]:
    """Model calls each stub provider received: what the dependency really saw."""
    return {name: len(model_calls(entries)) for name, entries in sorted(stub_logs.items())}


def max_in_window(stamps_ms: Sequence[float], window_ms: float) -> int:
    """The most stamps inside any half-open window [t, t + window_ms)."""
    ordered = sorted(stamps_ms)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window_ms:
            start += 1
        best = max(best, end - start + 1)
    return best


def stub_rate(stub_logs: Mapping[str, Sequence[Mapping]]) -> dict[str, dict]:
    """Per stub provider, the most calls it received in any 1 s and any 60 s window
    (by its own monotonic clock): what a rate limit in front of it let through."""
    out = {}
    for name, entries in sorted(stub_logs.items()):
        stamps = [e["mono_ms"] for e in model_calls(entries) if _number(e.get("mono_ms"))]
        out[name] = {
            "calls": len(stamps),
            "max_in_1s": max_in_window(stamps, 1000),
            "max_in_60s": max_in_window(stamps, 60000),
        }
    return out


def stub_rate_all(stub_logs: Mapping[str, Sequence[Mapping]]) -> dict | None:
    """The same over every stub together, for a limit that spans upstreams. The stubs'
    monotonic clocks start apart, so their calls meet on the wall clock (`ts`, 1 ms)."""
    stamps = [wall_ms(e.get("ts")) for entries in stub_logs.values() for e in model_calls(entries)]
    if not _none_free(stamps):
        return None
    return {
        "calls": len(stamps),
        "max_in_1s": max_in_window(stamps, 1000),
        "max_in_60s": max_in_window(stamps, 60000),
    }


# A forwarded call whose bytes may never have reached the upstream: the connection was
# never made (connect, pool_timeout), or the agent left and the exchange was cancelled
# (client_abort), or it never closed (the run ended under it). Its absence from the
# stub's log is no discrepancy; an arrival the ledger does not explain always is.
UNSURE_DELIVERY = ("connect", "pool_timeout", "client_abort")


def stub_match(events: Iterable[Mapping], stub_logs: Mapping[str, Sequence[Mapping]]) -> dict:
    """Per provider, the ledger's forwarded calls against the calls its stub logged,
    matched by the SHA-256 of the request body as multisets: the stub's `body_sha256`
    against the digest of the bytes the boundary forwarded, which is the ledger's
    `forwarded_sha256` when the boundary changed the body on the way (a stream without
    `stream_options` gets `include_usage`), else `request_sha256` (the agent's bytes,
    forwarded as they came): `only_in_stub` arrived without a record (a refused call
    that leaked, or a retry); `only_in_ledger` were recorded as forwarded but never
    arrived, less the `unsure` ones (UNSURE_DELIVERY, or never closed), which may
    not have. Null for a provider whose records lack the hashes."""
    forwarded: dict[str, list] = {}
    digest_of: dict[object, tuple[str, object]] = {}
    unsure_ids: set = set()
    closed: set = set()
    for e in events:
        kind = e.get("type")
        if kind == "model.request":
            digest = e.get("forwarded_sha256") or e.get("request_sha256")
            forwarded.setdefault(str(e.get("provider")), []).append(digest)
            digest_of[e.get("call_id")] = (str(e.get("provider")), digest)
        elif kind in CLOSING:
            closed.add(e.get("call_id"))
            if kind == "model.error" and e.get("reason") in UNSURE_DELIVERY:
                unsure_ids.add(e.get("call_id"))
    unsure: dict[str, Counter] = {}
    for call_id, (provider, digest) in digest_of.items():
        if call_id in unsure_ids or call_id not in closed:
            unsure.setdefault(provider, Counter())[digest] += 1
    seen = {
        name: [e.get("body_sha256") for e in model_calls(entries)]
        for name, entries in stub_logs.items()
    }
    out: dict[str, dict | None] = {}
    for name in sorted(set(forwarded) | set(seen)):
        sent, got = forwarded.get(name, []), seen.get(name, [])
        if not all(isinstance(h, str) for h in (*sent, *got)):
            out[name] = None
            continue
        sent_n, got_n = Counter(sent), Counter(got)
        missing = sent_n - got_n
        excused = Counter({d: min(n, unsure.get(name, Counter())[d]) for d, n in missing.items()})
        out[name] = {
            "forwarded": len(sent),
            "seen": len(got),
            "only_in_ledger": sum((missing - excused).values()),
            "only_in_stub": sum((got_n - sent_n).values()),
            "unsure_unseen": sum(excused.values()),
        }
    return out


def stub_match_all(by_provider: Mapping[str, Mapping | None]) -> dict | None:
    """stub_match added up over every provider: "each stub request matches exactly one
    forwarded call, body for body" as one invariant over all the routes of a run,
    whoever made the calls. Null when a provider's records lack the digests."""
    keys = ("forwarded", "seen", "only_in_ledger", "only_in_stub", "unsure_unseen")
    out = dict.fromkeys(keys, 0)
    for match in by_provider.values():
        if match is None or not all(_number(match.get(k)) for k in keys):
            return None
        for k in keys:
            out[k] += match[k]
    return out


def in_flight(events: Iterable[Mapping], upstreams: Iterable[str] = ()) -> dict:
    """How many forwarded calls were open at once (a model.request whose closing event,
    by call_id, had not come yet), at most, in the ledger's order, over every route and
    per route (`by_provider`: one agent's calls, when each agent has routes of its own;
    every configured upstream is there, 0 when it had no call); and how many never
    closed (calls cut off by the end of the run)."""
    open_calls: dict = {}
    most = 0
    by_provider: dict[str, int] = dict.fromkeys((str(u) for u in upstreams), 0)
    for e in events:
        kind = e.get("type")
        if kind == "model.request":
            provider = str(e.get("provider"))
            open_calls[e.get("call_id")] = provider
            most = max(most, len(open_calls))
            mine = sum(1 for p in open_calls.values() if p == provider)
            by_provider[provider] = max(by_provider.get(provider, 0), mine)
        elif kind in CLOSING:
            open_calls.pop(e.get("call_id"), None)
    return {"max": most, "open_at_end": len(open_calls), "by_provider": by_provider}


def backoffs(events: Sequence[Mapping]) -> list[dict]:
    """Each `agent.backoff` (an agent's report, written before it sleeps) with the time
    from it to the next call attempt of each provider, by the ledger's monotonic clock:
    whether the agent really waited is read from when its next call arrived, not from
    what it said. `next_attempt_s[P]` is absent when P had no later attempt."""
    attempts = [
        (i, str(e.get("provider") or e.get("upstream")), e["mono_ms"])
        for i, e in enumerate(events)
        if e.get("type") in ATTEMPTS
        and (e.get("provider") or e.get("upstream")) is not None
        and _number(e.get("mono_ms"))
    ]
    providers = {provider for _, provider, _ in attempts}
    out = []
    for i, e in enumerate(events):
        if e.get("type") != "agent.backoff" or not _number(e.get("mono_ms")):
            continue
        gaps: dict[str, float] = {}
        for j, provider, mono_ms in attempts:
            if j > i and provider not in gaps:
                gaps[provider] = round((mono_ms - e["mono_ms"]) / 1000, 3)
                if len(gaps) == len(providers):
                    break
        out.append(
            {
                "seq": e.get("seq"),
                "attempt": e.get("attempt"),
                "status": e.get("status"),
                "wait_s": e.get("wait_s"),
                "retry_after": e.get("retry_after"),
                "next_attempt_s": gaps,
            }
        )
    return out


def wall_ms(ts: object) -> float | None:
    """Milliseconds since the epoch from an RFC 3339 time (the ledger's and the stub's `ts`)."""
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000
    except ValueError:
        return None


def breaker(
    events: Sequence[Mapping],
    stub_logs: Mapping[str, Sequence[Mapping]],
    upstreams: Iterable[str] = (),
) -> dict:
    """The breakers' lives as the ledger tells them, and what the stubs saw meanwhile.

    `sequence[upstream]` is the states it went through, joined by `>`, for every
    configured upstream (`upstreams`, and any the ledger or the stubs name) from its
    first state: a breaker starts closed, so one that never moved reads `closed`
    (an observation a check can fail on), never a missing key. `opened[upstream]`
    counts its openings (0 when it never
    opened), `opened` all of them. An open window runs from a `breaker.state` to open until the next
    `breaker.state` of that upstream (half-open, once the cooldown is over) or
    the end of the ledger. In each window, `requests` counts `model.request`
    events for that upstream (by seq: the ledger's own order), `refusals` the
    `x-docket.breaker-open` events, and `stub_calls` the model calls its stub
    logged between the two events' wall times (`ts`: the stub is another
    clock's process, so the two records meet on the wall clock, at millisecond
    resolution, which is why a call at the very instant of opening is not counted),
    less the arrivals explained by calls forwarded before the opening and still in
    flight then (`in_flight_at_open`, matched by the forwarded body's digest): with
    several calls at once, one forwarded a moment before the third failure opens the
    breaker reaches the stub a moment after it, and was never a leak.
    """
    sequence: dict[str, list[str]] = {str(name): ["closed"] for name in upstreams}
    for name in stub_logs:
        sequence.setdefault(str(name), ["closed"])
    windows: list[dict] = []
    current: dict[str, dict] = {}
    flying: dict[object, tuple[str, object]] = {}  # call_id -> (provider, forwarded digest)
    for e in events:
        kind = e.get("type")
        if kind == "model.request":
            digest = e.get("forwarded_sha256") or e.get("request_sha256")
            flying[e.get("call_id")] = (str(e.get("provider")), digest)
        elif kind in CLOSING:
            flying.pop(e.get("call_id"), None)
        if kind == "breaker.state":
            upstream = str(e.get("upstream"))
            states = sequence.setdefault(upstream, [str(e.get("from", "closed"))])
            if len(states) == 1 and states[0] != str(e.get("from", states[0])):
                states[0] = str(e.get("from"))  # the ledger knows better than the default
            states.append(str(e.get("to")))
            window = current.pop(upstream, None)
            if window is not None:
                window.update(closed_seq=e.get("seq"), closed_ts=e.get("ts"), ended=e.get("to"))
            if e.get("to") == OPEN:
                window = {
                    "upstream": upstream,
                    "opened_seq": e.get("seq"),
                    "opened_ts": e.get("ts"),
                    "closed_seq": None,
                    "closed_ts": None,
                    "ended": "end of ledger",
                    "requests": 0,
                    "refusals": 0,
                    "flying": [d for p, d in flying.values() if p == upstream],
                }
                current[upstream] = window
                windows.append(window)
        elif kind == "model.request":
            window = current.get(str(e.get("provider")))
            if window is not None:
                window["requests"] += 1
        elif kind == "x-docket.breaker-open":
            window = current.get(str(e.get("upstream")))
            if window is not None:
                window["refusals"] += 1
    last_ts = events[-1].get("ts") if events else None
    for window in windows:
        flying_then = window.pop("flying")
        window["in_flight_at_open"] = len(flying_then)
        window["stub_calls"] = _stub_calls_between(
            stub_logs.get(window["upstream"], ()),
            wall_ms(window["opened_ts"]),
            wall_ms(window["closed_ts"] if window["closed_ts"] is not None else last_ts),
            flying_then,
        )
    return {
        "sequence": {name: ">".join(states) for name, states in sorted(sequence.items())},
        "opened": len(windows),
        "opens": {
            name: sum(1 for w in windows if w["upstream"] == name) for name in sorted(sequence)
        },
        "open_windows": windows,
        "requests_while_open": sum(w["requests"] for w in windows),
        "refusals_while_open": sum(w["refusals"] for w in windows),
        "stub_calls_while_open": _total(w["stub_calls"] for w in windows),
    }


def _stub_calls_between(
    entries: Sequence[Mapping], start: float | None, end: float | None, flying: Sequence = ()
):
    """Model calls the stub logged strictly between two wall times, less those that a
    call in flight at `start` explains (one arrival per in-flight call, same digest)."""
    if start is None or end is None:
        return None
    calls = model_calls(entries)
    stamps = [wall_ms(e.get("ts")) for e in calls]
    if not _none_free(stamps):
        return None
    explained = Counter(d for d in flying if isinstance(d, str))
    count = 0
    for entry, stamp in zip(calls, stamps, strict=True):
        if not start < stamp < end:
            continue
        digest = entry.get("body_sha256")
        if isinstance(digest, str) and explained.get(digest, 0) > 0:
            explained[digest] -= 1
            continue
        count += 1
    return count


def _total(values: Iterable[int | None]) -> int | None:
    known = list(values)
    return sum(known) if _none_free(known) else None


def _none_free(values: Sequence[_T | None]) -> TypeGuard[Sequence[_T]]:
    """Whether no value is None (null: unknown), so the values can be computed with."""
    return all(v is not None for v in values)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numbers(values: Sequence[object]) -> TypeGuard[Sequence[float]]:
    """Whether every value is a number (_number: a bool is not one)."""
    return all(_number(v) for v in values)


def derive(evidence: Mapping, upstreams: Iterable[str] = ()) -> dict:
    """The derived fields, by the name an assertion queries them by; `upstreams` are
    the configured providers' names, so a fact about each exists from its first state."""
    events = evidence.get("events") or []
    stubs = evidence.get("stubs") or {}
    return {
        "counts": counts(events, EVENT_TYPES),
        "first_seq": first_seq(events),
        "latency": latency(events, upstreams),
        "mono": mono(events),
        "stub_calls": stub_calls(stubs),
        "stub_rate": stub_rate(stubs),
        "stub_rate_all": stub_rate_all(stubs),
        "stub_match": (matched := stub_match(events, stubs)),
        "stub_match_all": stub_match_all(matched),
        "in_flight": in_flight(events, upstreams),
        "backoffs": backoffs(events),
        "breaker": breaker(events, stubs, upstreams),
    }
