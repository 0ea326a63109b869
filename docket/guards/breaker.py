"""The circuit breaker: one per upstream, closed -> open -> half-open -> closed.

Pure and clock-injected, like h11: the boundary asks `before_call(now)` before
forwarding, reports each forwarded call's outcome with `record(ticket, outcome,
now)` (or `abandon(ticket, now)` when the call was cancelled and has no
outcome), and turns what comes back into ledger events and HTTP answers. `now`
is a monotonic reading in seconds; one that steps backwards is taken as the
last one seen, so a clock step can neither shorten nor lengthen a cooldown.

- closed: calls go through. It opens (the reason in brackets, as recorded in
  breaker.state), checked in this order after each counted outcome:
  [consecutive_failures] after `threshold` consecutive failures, once the
  window holds at least `consecutive_min_calls` calls (default 1: at once);
  [failure_rate] when the failures among the last `window_calls` calls (a
  count-based window, default `min_calls` long) reach `failure_rate`, once the
  window holds at least `min_calls` calls;
  [slow_call_rate] when the slow calls among the window reach
  `slow_call_rate`, once the window holds at least `min_calls` calls. A call
  is slow when its duration (reported with its outcome) exceeds `slow_call_s`;
  a slow call is counted whether it succeeded or failed, as resilience4j's
  slowCallDurationThreshold / slowCallRateThreshold do. With `slow_call_s`
  None (the default) no call is slow: a model call's duration says as much
  about the tokens asked for as about the upstream's health, so no default
  threshold fits every run (see docs/resilience.md).
  A count window needs no clock, so a clock step cannot age calls out of it.
- open: every call is refused at once, with `retry_after_s` = the time left
  until the probes may go.
- half-open (reached lazily, by the first `before_call` after the cooldown):
  up to `half_open_probes` probes (default 1) go through; others are refused
  while they are in flight. The decision rule: the first probe that fails (or
  is slow, when slow calls are counted) reopens the breaker at once, with the
  cooldown doubled (up to `max_cooldown`), whatever the other probes still in
  flight say later (their outcomes are stale); `half_open_probes` successful
  probes close it, reset the cooldown and empty the window, so failures from
  before the outage cannot trip it again at once. Probes are counted per
  half-open episode: at most `half_open_probes` are let through in all, unless
  one is ignored or abandoned, which frees its place for the next caller.

Outcomes: "success"; "failure" (timeouts, connection failures, 5xx);
"ignored" (4xx and anything else that says nothing about the upstream's
health): neither counted nor breaking a run of failures (nor counted as slow).
An ignored or abandoned probe frees its probe place and the breaker stays
half-open, so the next call probes. Abandoning counts as nothing because a cancelled call says
something about the caller (it hung up), not about the upstream; a call that
timed out is a failure and must be recorded as one.

Each ticket carries the epoch (the number of transitions so far) it was issued
in. An outcome from an earlier epoch is stale and counts as nothing: a call let
through while closed that fails after the breaker opened must not stretch the
cooldown, nor one that succeeds late close it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

CLOSED = "closed"
HALF_OPEN = "half_open"
OPEN = "open"
STATE_CODES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}  # docket_breaker_state

SUCCESS = "success"
FAILURE = "failure"
IGNORED = "ignored"
OUTCOMES = (SUCCESS, FAILURE, IGNORED)

# Transition reasons, as recorded in breaker.state.
CONSECUTIVE_FAILURES = "consecutive_failures"
FAILURE_RATE = "failure_rate"
SLOW_CALL_RATE = "slow_call_rate"
COOLDOWN_ELAPSED = "cooldown_elapsed"
PROBE_FAILED = "probe_failed"
PROBE_SLOW = "probe_slow"
PROBE_SUCCEEDED = "probe_succeeded"

# While the probes are in flight nobody knows when it will answer; a refused
# caller is told to come back shortly rather than after a whole cooldown.
PROBE_PENDING_RETRY_S = 1.0


@dataclass(frozen=True)
class Permit:
    """A call the breaker let through; hand it back to record() or abandon()."""

    id: int
    epoch: int
    probe: bool


@dataclass(frozen=True)
class StateChange:
    """A `breaker.state` event value."""

    upstream: str
    from_state: str
    to_state: str
    reason: str
    cooldown_s: float  # the cooldown now in force (the next one, when closing)
    failures: int  # consecutive failures when it changed
    window_failures: int
    window_calls: int
    rate: float | None  # window_failures / window_calls; None with an empty window
    window_slow: int = 0  # slow calls in the window (0 unless slow_call_s is set)

    type = "breaker.state"

    def fields(self) -> dict:
        return {
            "upstream": self.upstream,
            "from": self.from_state,
            "to": self.to_state,
            "reason": self.reason,
            "cooldown_s": self.cooldown_s,
            "failures": self.failures,
            "window_failures": self.window_failures,
            "window_calls": self.window_calls,
            "rate": self.rate,
            "window_slow": self.window_slow,
        }


@dataclass(frozen=True)
class BreakerRefusal:
    """An `x-docket.breaker-open` event value; the boundary answers 503 + Retry-After."""

    upstream: str
    state: str  # open, or half_open with the probe in flight
    retry_after_s: float
    reason: str  # one line for the error body

    type = "x-docket.breaker-open"

    def fields(self) -> dict:
        return {
            "upstream": self.upstream,
            "state": self.state,
            "retry_after_s": self.retry_after_s,
        }


@dataclass(frozen=True)
class Verdict:
    """What before_call decided: a ticket, or a refusal; and any transition it made."""

    ticket: Permit | None
    refusal: BreakerRefusal | None
    events: tuple[StateChange, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.ticket is not None


@dataclass(frozen=True)
class BreakerStatus:
    """A reading for metrics and readiness; taking it changes nothing."""

    upstream: str
    state: str
    state_code: int  # 0 closed, 1 half-open, 2 open
    refusals: int
    transitions: int
    cooldown_s: float
    retry_after_s: float  # 0 unless open (time left until the probe may go)
    consecutive_failures: int
    window_failures: int
    window_calls: int
    in_flight: int
    probe_in_flight: bool  # at least one
    stale_outcomes: int
    window_slow: int = 0
    probes_in_flight: int = 0
    # transitions so far by the state moved to (docket_breaker_transitions_total)
    transitions_to: dict[str, int] = field(default_factory=dict)

    @property
    def ready_reason(self) -> str | None:
        """Why readiness is red because of this breaker, or None."""
        if self.state == CLOSED:
            return None
        if self.state == OPEN:
            return (
                f"breaker for {self.upstream} is open (probe in {self.retry_after_s:.3g} s, "
                f"cooldown {self.cooldown_s:g} s)"
            )
        return f"breaker for {self.upstream} is half-open (probing)"


class CircuitBreaker:
    def __init__(
        self,
        upstream: str,
        *,
        threshold: int = 5,
        cooldown: float = 30.0,
        max_cooldown: float = 300.0,
        failure_rate: float = 0.5,
        min_calls: int = 20,
        window_calls: int | None = None,
        consecutive_min_calls: int = 1,
        slow_call_s: float | None = None,
        slow_call_rate: float = 1.0,
        half_open_probes: int = 1,
    ) -> None:
        window_calls = min_calls if window_calls is None else window_calls
        if threshold < 1 or min_calls < 1 or half_open_probes < 1 or consecutive_min_calls < 1:
            raise ValueError(
                "threshold, min_calls, consecutive_min_calls and half_open_probes "
                "must be at least 1"
            )
        if window_calls < min_calls:
            raise ValueError(f"window_calls ({window_calls}) must be at least min_calls")
        if consecutive_min_calls > window_calls:
            # the window never holds more than window_calls: the run could never trip
            raise ValueError(
                f"consecutive_min_calls ({consecutive_min_calls}) must be at most "
                f"window_calls ({window_calls})"
            )
        if not (_finite(cooldown) and cooldown > 0 and _finite(max_cooldown)):
            raise ValueError("cooldown and max_cooldown must be finite and positive")
        if max_cooldown < cooldown:
            raise ValueError(f"max_cooldown ({max_cooldown}) must be at least cooldown")
        if not (_finite(failure_rate) and 0 < failure_rate <= 1):
            raise ValueError(f"failure_rate must be in (0, 1], got {failure_rate!r}")
        if not (_finite(slow_call_rate) and 0 < slow_call_rate <= 1):
            raise ValueError(f"slow_call_rate must be in (0, 1], got {slow_call_rate!r}")
        if slow_call_s is not None and not (_finite(slow_call_s) and slow_call_s > 0):
            raise ValueError(f"slow_call_s must be finite and positive, got {slow_call_s!r}")
        self.upstream = upstream
        self.threshold = threshold
        self.base_cooldown = float(cooldown)
        self.max_cooldown = float(max_cooldown)
        self.failure_rate = float(failure_rate)
        self.min_calls = min_calls
        self.window_calls = window_calls
        self.consecutive_min_calls = consecutive_min_calls
        self.slow_call_s = None if slow_call_s is None else float(slow_call_s)
        self.slow_call_rate = float(slow_call_rate)
        self.half_open_probes = half_open_probes
        self._state = CLOSED
        self._epoch = 0
        self._cooldown = self.base_cooldown
        self._probe_at = 0.0  # when open: the earliest reading at which probes may go
        self._consecutive = 0
        # One entry per counted call: (failed, slow).
        self._window: deque[tuple[bool, bool]] = deque(maxlen=window_calls)
        self._window_failures = 0
        self._window_slow = 0
        self._outstanding: dict[int, Permit] = {}
        self._probes: set[int] = set()  # ids of the probes in flight
        self._probes_issued = 0  # in this half-open episode, less the ignored and abandoned
        self._probes_passed = 0  # successful probes in this half-open episode
        self._next_id = 0
        self._last_now = -math.inf
        self._refusals = 0
        self._stale = 0
        self._transitions_to = {CLOSED: 0, HALF_OPEN: 0, OPEN: 0}

    # ------------------------------------------------------------ calls

    def before_call(self, now: float) -> Verdict:
        """May a call go to the upstream now? A ticket if so, else a refusal."""
        now = self._clamp(now)
        events: tuple[StateChange, ...] = ()
        if self._state == OPEN:
            if now < self._probe_at:
                # Never more than the cooldown in force: (opened + cooldown) - now can
                # exceed it by a rounding (30.000000000000114 after a 1.4058 s clock).
                return self._refuse(OPEN, min(self._probe_at - now, self._cooldown))
            events = (self._move(HALF_OPEN, COOLDOWN_ELAPSED),)
            self._probes_issued = self._probes_passed = 0
        if self._state == HALF_OPEN:
            if self._probes_issued >= self.half_open_probes:
                return self._refuse(HALF_OPEN, PROBE_PENDING_RETRY_S)
            ticket = self._issue(probe=True)
            self._probes.add(ticket.id)
            self._probes_issued += 1
            return Verdict(ticket=ticket, refusal=None, events=events)
        return Verdict(ticket=self._issue(probe=False), refusal=None)

    def record(
        self, ticket: Permit, outcome: str, now: float, duration: float | None = None
    ) -> tuple[StateChange, ...]:
        """A forwarded call's outcome, and how long it took (seconds; None: unknown,
        never slow); returns the transitions it caused (often none)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        if duration is not None and not (_finite(duration) and duration >= 0):
            raise ValueError(f"duration must be a finite number of seconds >= 0, got {duration!r}")
        now = self._clamp(now)
        self._settle(ticket)
        if ticket.epoch != self._epoch:
            self._stale += 1
            return ()
        slow = outcome != IGNORED and self._is_slow(duration)
        if ticket.probe:
            self._probes.discard(ticket.id)
            if outcome == IGNORED:
                self._probes_issued -= 1  # its place goes to the next caller
                return ()
            self._note(failed=outcome == FAILURE, slow=slow)
            if outcome == FAILURE or slow:
                reason = PROBE_FAILED if outcome == FAILURE else PROBE_SLOW
                return (self._open(now, reason, min(self._cooldown * 2, self.max_cooldown)),)
            self._probes_passed += 1
            if self._probes_passed >= self.half_open_probes:
                return (self._close(),)
            return ()
        if outcome == IGNORED:
            return ()
        self._note(failed=outcome == FAILURE, slow=slow)
        calls = len(self._window)
        if outcome == FAILURE:
            if self._consecutive >= self.threshold and calls >= self.consecutive_min_calls:
                return (self._open(now, CONSECUTIVE_FAILURES, self.base_cooldown),)
            if calls >= self.min_calls and self._window_failures / calls >= self.failure_rate:
                return (self._open(now, FAILURE_RATE, self.base_cooldown),)
        if slow and calls >= self.min_calls and self._window_slow / calls >= self.slow_call_rate:
            return (self._open(now, SLOW_CALL_RATE, self.base_cooldown),)
        return ()

    def abandon(self, ticket: Permit, now: float) -> tuple[StateChange, ...]:
        """A let-through call that will never report (cancelled): counts as nothing.

        An abandoned probe frees its probe place, so the breaker cannot wedge in
        half-open waiting for an answer that is not coming.
        """
        return self.record(ticket, IGNORED, now)

    # ------------------------------------------------------------ reading

    @property
    def state(self) -> str:
        return self._state

    def status(self, now: float) -> BreakerStatus:
        """State for metrics and readiness. `now` only measures the time left; it
        moves nothing (an elapsed cooldown turns half-open at the next call)."""
        now = max(_check_now(now), self._last_now)
        calls = len(self._window)
        return BreakerStatus(
            upstream=self.upstream,
            state=self._state,
            state_code=STATE_CODES[self._state],
            refusals=self._refusals,
            transitions=self._epoch,
            cooldown_s=self._cooldown,
            retry_after_s=(
                min(max(0.0, self._probe_at - now), self._cooldown) if self._state == OPEN else 0.0
            ),
            consecutive_failures=self._consecutive,
            window_failures=self._window_failures,
            window_calls=calls,
            in_flight=len(self._outstanding),
            probe_in_flight=bool(self._probes),
            stale_outcomes=self._stale,
            window_slow=self._window_slow,
            probes_in_flight=len(self._probes),
            transitions_to=dict(self._transitions_to),
        )

    # ------------------------------------------------------------ inside

    def _is_slow(self, duration: float | None) -> bool:
        return self.slow_call_s is not None and duration is not None and duration > self.slow_call_s

    def _clamp(self, now: float) -> float:
        now = _check_now(now)
        if now > self._last_now:
            self._last_now = now
        return self._last_now

    def _issue(self, *, probe: bool) -> Permit:
        ticket = Permit(id=self._next_id, epoch=self._epoch, probe=probe)
        self._next_id += 1
        self._outstanding[ticket.id] = ticket
        return ticket

    def _settle(self, ticket: Permit) -> None:
        held = self._outstanding.pop(ticket.id, None)
        if held is None or held != ticket:
            raise ValueError(f"breaker ticket {ticket.id} is not outstanding (reported twice?)")

    def _refuse(self, state: str, retry_after: float) -> Verdict:
        self._refusals += 1
        if state == OPEN:
            reason = (
                f"circuit breaker for {self.upstream} is open after upstream failures; "
                f"a probe may go in {retry_after:.3g} s"
            )
        else:
            reason = (
                f"circuit breaker for {self.upstream} is half-open and its probes are in flight"
            )
        refusal = BreakerRefusal(
            upstream=self.upstream, state=state, retry_after_s=retry_after, reason=reason
        )
        return Verdict(ticket=None, refusal=refusal)

    def _note(self, *, failed: bool, slow: bool) -> None:
        if len(self._window) == self._window.maxlen:
            old_failed, old_slow = self._window[0]
            self._window_failures -= old_failed
            self._window_slow -= old_slow
        self._window.append((failed, slow))
        self._window_failures += failed
        self._window_slow += slow
        self._consecutive = self._consecutive + 1 if failed else 0

    def _open(self, now: float, reason: str, cooldown: float) -> StateChange:
        self._cooldown = cooldown
        self._probe_at = now + cooldown
        self._probes.clear()  # any still in flight report stale outcomes
        return self._move(OPEN, reason)

    def _close(self) -> StateChange:
        self._cooldown = self.base_cooldown
        change = self._move(CLOSED, PROBE_SUCCEEDED)
        self._window.clear()
        self._window_failures = 0
        self._window_slow = 0
        self._consecutive = 0
        self._probes.clear()  # any still in flight report stale outcomes
        return change

    def _move(self, to: str, reason: str) -> StateChange:
        calls = len(self._window)
        change = StateChange(
            upstream=self.upstream,
            from_state=self._state,
            to_state=to,
            reason=reason,
            cooldown_s=self._cooldown,
            failures=self._consecutive,
            window_failures=self._window_failures,
            window_calls=calls,
            rate=self._window_failures / calls if calls else None,
            window_slow=self._window_slow,
        )
        self._state = to
        self._epoch += 1
        self._transitions_to[to] += 1
        return change


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _check_now(now: float) -> float:
    if not _finite(now):
        raise ValueError(f"now must be a finite monotonic reading in seconds, got {now!r}")
    return float(now)
