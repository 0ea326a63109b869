"""The upstream fault family, performed by the stub provider.

`plan(schedule, arrival)` is pure: it asks the seeded schedule which upstream
faults fire at the request's `call` ordinal and folds them into one stub
Behaviour. `chooser(schedule)` wraps it as the stub's `choose` function.

Ordinals: the stub's log seq counts every request that reaches the provider
API from 0; the grammar's `call` counter is 1-based, so call = seq + 1. Faults
are performed only on a valid model call (a request the stub would answer with
200); a fault that fires on another request (a model list, a 400) is not
performed and not recorded.

Precedence, when several fire on one call (each rule keeps the answer a thing a
real provider could send, and every recorded fault really shaped it):
1. Delays always combine: latency and slow_first_byte add to the wait before the
   first byte; slow_tokens sets the gap between streamed tokens.
2. An error answer (status, rate_limited, overloaded) beats every body fault:
   the first of them in schedule order is performed; the others are not.
3. Otherwise one body-breaking fault (malformed_json, truncate, cut_stream),
   the first in schedule order that applies to this answer, is performed.
   cut_stream and slow_tokens apply only to streamed answers.
4. missing_usage combines with a broken body but not with an error answer.
A fault that is not performed on a call is not in that call's `injected`.
One exception, not knowable before the answer is built: a truncate or cut_stream
whose `after` lies past the end of the answer is recorded, and the answer goes
out whole.

`truncate(after=N)` with a whole number counts stream events on a stream (as
cut_stream does) and bytes on a whole answer (which has no events); with a size
(`after=64B`) it counts bytes on both. A whole answer cut short promises its
full content-length, so the client sees a body that ends early.
"""

from __future__ import annotations

from collections.abc import Callable

from chaos.faults.grammar import Fault
from chaos.faults.schedule import FaultSchedule
from chaos.faults.values import Duration, HttpDate, Size
from chaos.stub.server import Arrival, Behaviour, Chooser

TARGET = "upstream"
ERROR_KINDS = ("status", "rate_limited", "overloaded")
BODY_KINDS = ("malformed_json", "truncate", "cut_stream")
STREAM_ONLY = ("cut_stream", "slow_tokens")


def retry_after_value(value: Duration | HttpDate | None) -> str | None:
    """The Retry-After header for a fault's `retry_after`: whole seconds (rounded
    up, as the header has no fractions) or the HTTP date as written."""
    if value is None:
        return None
    if isinstance(value, HttpDate):
        return value.value
    return str(-(-value.ms // 1000))


def _seconds(value: Duration | None) -> float:
    return 0.0 if value is None else value.ms / 1000


def _applies(fault: Fault, arrival: Arrival) -> bool:
    return arrival.stream or fault.kind not in STREAM_ONLY


def plan(schedule: FaultSchedule, arrival: Arrival, *, elapsed_s: float | None = None) -> Behaviour:
    """The Behaviour that performs every upstream fault firing at this request."""
    if arrival.model is None:
        return Behaviour()
    call = arrival.ordinal + 1
    firing = [
        f
        for f in schedule.faults
        if f.target == TARGET and schedule.decide(f, call, elapsed_s=elapsed_s)
    ]
    error = next((f for f in firing if f.kind in ERROR_KINDS), None)
    performed: list[Fault] = []
    fields: dict = {"first_byte_delay": 0.0}
    for fault in firing:
        if not _applies(fault, arrival):
            continue
        if fault.kind in ("latency", "slow_first_byte"):
            delay = _seconds(fault.arg("delay"))  # type: ignore[arg-type]
            if fault.kind == "latency":
                jitter = _seconds(fault.arg("jitter"))  # type: ignore[arg-type]
                delay += jitter * schedule.draw(fault, call, "jitter")
            fields["first_byte_delay"] += delay
        elif fault.kind == "slow_tokens":
            fields["token_delay"] = _seconds(fault.arg("delay"))  # type: ignore[arg-type]
        elif fault is error:
            fields["error"] = fault.kind
            fields["status"] = fault.arg("code") if fault.kind == "status" else None
            fields["retry_after"] = retry_after_value(fault.arg("retry_after"))  # type: ignore[arg-type]
        elif error is not None:
            continue  # an error answer has no body to break and no usage to omit
        elif fault.kind in BODY_KINDS:
            if any(p.kind in BODY_KINDS for p in performed):
                continue
            if fault.kind == "malformed_json":
                fields["malformed_json"] = True
            elif fault.kind == "cut_stream":
                fields["cut_after_events"] = fault.arg("after")
            else:
                after = fault.arg("after")
                if isinstance(after, Size):
                    fields["truncate_bytes"] = after.bytes
                elif arrival.stream:
                    fields["cut_after_events"] = after  # an int counts stream events
                else:
                    fields["truncate_bytes"] = after  # a whole body has no events: bytes
        elif fault.kind == "missing_usage":
            fields["omit_usage"] = True
        else:
            continue
        performed.append(fault)
    injected = tuple(schedule.injection_event(f, call) for f in performed)
    return Behaviour(**fields, injected=injected)


def chooser(
    schedule: FaultSchedule,
    *,
    elapsed: Callable[[], float] | None = None,
    on_inject: Callable[[dict], None] | None = None,
) -> Chooser:
    """The stub's `choose` for this schedule's upstream faults.

    `elapsed()` (seconds since the run started) is required when an upstream
    fault has a `@t` trigger. `on_inject` receives the `fault.injected` fields
    of each performed fault, for the harness to put in the ledger.
    """
    timed = [f.text for f in schedule.faults if f.target == TARGET and f.trigger.timed]
    if timed and elapsed is None:
        raise ValueError(f"{timed[0]} is time-triggered: chooser() needs elapsed")

    def choose(arrival: Arrival) -> Behaviour:
        behaviour = plan(schedule, arrival, elapsed_s=elapsed() if elapsed else None)
        if on_inject is not None:
            for event in behaviour.injected:
                on_inject(event)
        return behaviour

    return choose
