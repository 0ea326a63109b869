"""The caps guard: spend, token, call and wall-time caps, with no overshoot from concurrency.

Pure and clock-free: the boundary tells it what a call could cost before the
call is forwarded (reserve), what it did cost afterwards (settle), or that its
cost is unknown (fail), and the supervisor tells it how long the run has been
going (check_wall, a clamped monotonic reading). It answers with small frozen
values the boundary turns into ledger events and HTTP answers.

Reserve-then-settle (docs/adr/0002-caps-reservations.md): a call may go ahead
only if what is already spent, plus what calls in flight may still spend, plus
this call's worst case fits under every cap. The worst case is the declared
max output tokens at the output price plus an upper bound on the input: the
request body's byte count (a token is at least one byte of the text it
encodes), at the dearest price an input token can have. Settling releases the
reservation and charges the real usage; a call whose usage is unknown is
charged its whole reservation, never zero.

Events, once per cap each, both measured on the run's demand on the cap:
what is settled plus the worst case of the calls in flight (plus, for a call
being refused, its own worst case). Demand is what the guard controls and it
is known before the money is spent, which is when a warning is useful.
- cap.warning when demand first reaches warn_at of the cap (an admitted call,
  or a settled one whose usage overshot its reservation);
- cap.exceeded when a call is refused because its worst case would cross the
  cap, or when settled use goes past the cap (only possible when a reservation
  was not a true bound, e.g. an image URL that costs more tokens than bytes).
Exceeded means demand crossed the cap, which is past warn_at, so a warning
always comes first (in the same decision if need be). With on_breach = "kill",
cap.exceeded also says the run must stop (exit 42), and every later call is
refused; with "deny" only the call is refused and smaller ones may still fit.

Under "deny", a call whose worst case crosses a cap only because of what calls
in flight hold (settled + its worst case still fits) is deferred, not denied:
its CapRefusal says `deferred` (the boundary answers 429 with Retry-After), and
no cap.exceeded is raised, since nothing was crossed. Every refusal of a
crossing says `would_fit_after_settle` (docs/adr/0002-caps-reservations.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from types import MappingProxyType
from typing import Protocol

from docket.pricing import ModelPrice, PriceTable, Usage, format_nusd

MAX_USD = "max_usd"
MAX_TOKENS = "max_tokens"
MAX_MODEL_CALLS = "max_model_calls"
MAX_WALL_SECONDS = "max_wall_seconds"
UNITS = {
    MAX_USD: "nusd",
    MAX_TOKENS: "tokens",
    MAX_MODEL_CALLS: "calls",
    MAX_WALL_SECONDS: "seconds",
}

# The order reserve checks caps in; a refusal names the first that would be crossed.
_COUNTED_CAPS = (MAX_MODEL_CALLS, MAX_TOKENS, MAX_USD)


@dataclass(frozen=True)
class CapEvent:
    type: str  # "cap.warning" | "cap.exceeded"
    cap: str  # max_usd | max_tokens | max_model_calls | max_wall_seconds
    limit: int | float  # in `unit`: nano-USD, tokens, calls or seconds
    observed: int | float
    unit: str

    def fields(self) -> dict:
        """The event's own fields for the ledger."""
        out = {"cap": self.cap, "limit": self.limit, "observed": self.observed, "unit": self.unit}
        if self.unit == "nusd":
            out["limit_usd"] = format_nusd(int(self.limit))
            out["observed_usd"] = format_nusd(int(self.observed))
        return out


@dataclass(frozen=True)
class CapRefusal:
    rule: str  # the policy key that refused: "caps.max_usd", "caps.on_unpriced", ...
    cap: str  # the cap concerned
    reason: str  # one line, for the error body and the policy.denied event
    limit: int | float | None = None
    committed: int | float = 0  # settled use of the cap
    reserved: int = 0  # held by calls in flight
    requested: int = 0  # this call's worst case
    unit: str = ""
    # For a cap the call's worst case would cross: whether it would fit once the calls
    # in flight settle (under "deny" such a call is deferred, 429, not denied); None
    # for a refusal that is not about room under a cap (on_unpriced, wall, stopping).
    would_fit_after_settle: bool | None = None
    deferred: bool = False  # refused for now only (deny, and it fits after settling): a 429


@dataclass(frozen=True)
class Reservation:
    id: int
    model: str
    price: ModelPrice | None  # None: unpriced (let through by on_unpriced = "allow" or no max_usd)
    nusd: int  # worst-case cost held
    tokens: int  # worst-case tokens held
    input_tokens_bound: int  # the request body's byte count
    output_tokens_bound: int
    output_declared: bool  # False: the policy's default_max_output_tokens was used

    @property
    def priced(self) -> bool:
        return self.price is not None


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reservation: Reservation | None
    refusal: CapRefusal | None
    events: tuple[CapEvent, ...] = ()
    stop_run: bool = False


@dataclass(frozen=True)
class Settlement:
    """What settling a call (or checking the wall clock) charged and set off."""

    charged_nusd: int = 0
    charged_tokens: int = 0
    events: tuple[CapEvent, ...] = ()
    stop_run: bool = False


@dataclass(frozen=True)
class ModelTotals:
    priced: bool
    calls: int = 0  # settled with known usage, or failed
    failed_calls: int = 0  # usage unknown: charged the reservation
    input_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    estimated_tokens: int = 0  # charged for failed calls (reservations)
    nusd: int = 0


@dataclass(frozen=True)
class Totals:
    calls: int
    tokens: int
    nusd: int
    unpriced_calls: int
    refused_calls: int
    in_flight: int
    reserved_nusd: int
    reserved_tokens: int
    warned: tuple[str, ...]
    exceeded: tuple[str, ...]
    stopped_by: str | None
    by_model: Mapping[str, ModelTotals]


class CapLimits(Protocol):
    """The caps a CapsGuard enforces: what it reads of docket.policy.CapsPolicy.

    Named here, not imported, so the guard takes plain values and the policy
    module, which uses the guards' parsers, is never imported back."""

    @property
    def max_nusd(self) -> int | None: ...  # max_usd in nano-USD
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def max_model_calls(self) -> int | None: ...
    @property
    def max_wall_seconds(self) -> float | None: ...
    @property
    def warn_at(self) -> float: ...
    @property
    def on_breach(self) -> str: ...  # "deny" | "kill"
    @property
    def on_unpriced(self) -> str: ...  # "deny" | "allow"
    @property
    def budget_mode(self) -> str: ...  # "usd" | "quota"
    @property
    def default_max_output_tokens(self) -> int: ...


class CapsGuard:
    def __init__(self, caps: CapLimits, prices: PriceTable) -> None:
        self.caps = caps
        self.prices = prices
        self._usd_enforced = caps.budget_mode == "usd" and caps.max_nusd is not None
        self._limits: dict[str, int] = {}
        if caps.budget_mode == "usd" and caps.max_nusd is not None:
            self._limits[MAX_USD] = caps.max_nusd
        if caps.max_tokens is not None:
            self._limits[MAX_TOKENS] = caps.max_tokens
        if caps.max_model_calls is not None:
            self._limits[MAX_MODEL_CALLS] = caps.max_model_calls
        self._warn_at = Fraction(str(caps.warn_at))
        self._committed = dict.fromkeys(_COUNTED_CAPS, 0)
        self._reserved = dict.fromkeys(_COUNTED_CAPS, 0)
        self._outstanding: dict[int, Reservation] = {}
        self._next_id = 0
        self._warned: set[str] = set()
        self._exceeded: list[str] = []
        self._stopped_by: str | None = None
        self._wall_elapsed = 0.0
        self._unpriced_calls = 0
        self._refused_calls = 0
        self._by_model: dict[str, ModelTotals] = {}

    # ------------------------------------------------------------ calls

    def reserve(self, *, model: str, request_bytes: int, max_output_tokens: int | None) -> Decision:
        """Before forwarding: hold the call's worst case, or refuse it."""
        if not isinstance(model, str):
            raise ValueError(f"model must be a string, got {model!r}")
        _check_count("request_bytes", request_bytes)
        if max_output_tokens is not None:
            _check_count("max_output_tokens", max_output_tokens)
        if self._stopped_by is not None:
            return self._refuse(
                CapRefusal(
                    rule=f"caps.{self._stopped_by}",
                    cap=self._stopped_by,
                    reason=f'the run is stopping: {self._stopped_by} was breached (on_breach = "kill")',
                ),
                stop_run=True,
            )
        if MAX_WALL_SECONDS in self._exceeded:
            return self._refuse(
                CapRefusal(
                    rule="caps.max_wall_seconds",
                    cap=MAX_WALL_SECONDS,
                    reason=f"the run's wall time cap of {self.caps.max_wall_seconds:g} s is spent",
                    limit=self.caps.max_wall_seconds,
                    committed=self._wall_elapsed,
                    unit="seconds",
                )
            )
        price = self.prices.lookup(model)
        if price is None and self._usd_enforced and self.caps.on_unpriced == "deny":
            return self._refuse(
                CapRefusal(
                    rule="caps.on_unpriced",
                    cap=MAX_USD,
                    reason=f"model {model!r} is not in the price table, so its cost cannot be "
                    'bounded under max_usd (on_unpriced = "deny"; see `docket prices`)',
                )
            )
        declared = max_output_tokens is not None
        out_bound = (
            self.caps.default_max_output_tokens if max_output_tokens is None else max_output_tokens
        )
        nusd = 0
        if price is not None:
            nusd = (
                request_bytes * price.max_input_nusd_per_token
                + out_bound * price.output_nusd_per_token
            )
        requested = {MAX_MODEL_CALLS: 1, MAX_TOKENS: request_bytes + out_bound, MAX_USD: nusd}
        crossing = self._crossing(requested)
        if crossing is not None:
            return self._refuse_crossing(crossing, requested)
        events = []
        for cap in _COUNTED_CAPS:
            self._reserved[cap] += requested[cap]
            limit = self._limits.get(cap)
            if limit is not None:
                demand = self._committed[cap] + self._reserved[cap]
                warning = self._maybe_warn(cap, limit, demand)
                if warning is not None:
                    events.append(warning)
        reservation = Reservation(
            id=self._next_id,
            model=model,
            price=price,
            nusd=nusd,
            tokens=requested[MAX_TOKENS],
            input_tokens_bound=request_bytes,
            output_tokens_bound=out_bound,
            output_declared=declared,
        )
        self._next_id += 1
        self._outstanding[reservation.id] = reservation
        return Decision(allowed=True, reservation=reservation, refusal=None, events=tuple(events))

    def settle(self, reservation: Reservation, usage: Usage) -> Settlement:
        """After the call: release its reservation and charge what it really used."""
        r = self._release(reservation)
        nusd = r.price.cost_of(usage) if r.price is not None else 0
        tokens = usage.total_tokens
        m = self._model(r)
        # Built field by field rather than with dataclasses.replace: this runs once per
        # call, and replace's introspection cost more than the rest of settle.
        self._by_model[r.model] = ModelTotals(
            priced=m.priced,
            calls=m.calls + 1,
            failed_calls=m.failed_calls,
            input_tokens=m.input_tokens + usage.input_tokens,
            cached_tokens=m.cached_tokens + usage.cached_tokens,
            cache_write_tokens=m.cache_write_tokens
            + usage.cache_write_5m_tokens
            + usage.cache_write_1h_tokens,
            output_tokens=m.output_tokens + usage.output_tokens,
            estimated_tokens=m.estimated_tokens,
            nusd=m.nusd + nusd,
        )
        return self._commit(r, nusd, tokens)

    def fail(self, reservation: Reservation) -> Settlement:
        """The call was forwarded but its usage is unknown: charge its whole reservation."""
        r = self._release(reservation)
        m = self._model(r)
        self._by_model[r.model] = replace(
            m,
            calls=m.calls + 1,
            failed_calls=m.failed_calls + 1,
            estimated_tokens=m.estimated_tokens + r.tokens,
            nusd=m.nusd + r.nusd,
        )
        return self._commit(r, r.nusd, r.tokens)

    def outstanding(self, reservation: Reservation | None) -> bool:
        """Whether `reservation` is still held (neither settled, failed nor cancelled):
        a path that closes a call after an unexpected error charges it once, not twice."""
        return reservation is not None and self._outstanding.get(reservation.id) == reservation

    def cancel(self, reservation: Reservation) -> None:
        """The call was never forwarded (a later guard refused it): release, charge nothing.

        Only for a call that certainly never left: if any byte may have reached
        the upstream, use fail().
        """
        self._release(reservation)

    # ------------------------------------------------------------ wall time

    def check_wall(self, elapsed_mono_seconds: float) -> Settlement:
        """The run has been going this long (monotonic, clamped by the caller)."""
        e = elapsed_mono_seconds
        if isinstance(e, bool) or not isinstance(e, int | float) or not math.isfinite(e) or e < 0:
            raise ValueError(f"elapsed_mono_seconds must be a finite number >= 0, got {e!r}")
        # Readings that repeat or go back change nothing: only the furthest one counts.
        self._wall_elapsed = max(self._wall_elapsed, float(e))
        limit = self.caps.max_wall_seconds
        if limit is None:
            return Settlement()
        events = []
        if MAX_WALL_SECONDS not in self._exceeded:
            warned_now = self._maybe_warn(MAX_WALL_SECONDS, limit, self._wall_elapsed)
            if warned_now is not None:
                events.append(warned_now)
            if self._wall_elapsed >= limit:
                events.extend(self._exceed(MAX_WALL_SECONDS, limit, self._wall_elapsed))
        stop = self._stop_if_kill(MAX_WALL_SECONDS, events)
        return Settlement(events=tuple(events), stop_run=stop)

    def next_wall_threshold(self) -> float | None:
        """The elapsed seconds at which check_wall will next have something to say."""
        limit = self.caps.max_wall_seconds
        if limit is None or MAX_WALL_SECONDS in self._exceeded:
            return None
        if MAX_WALL_SECONDS not in self._warned:
            return float(self._warn_at * Fraction(limit))
        return limit

    # ------------------------------------------------------------ reading

    @property
    def stopped_by(self) -> str | None:
        return self._stopped_by

    def totals(self) -> Totals:
        return Totals(
            calls=self._committed[MAX_MODEL_CALLS],
            tokens=self._committed[MAX_TOKENS],
            nusd=self._committed[MAX_USD],
            unpriced_calls=self._unpriced_calls,
            refused_calls=self._refused_calls,
            in_flight=len(self._outstanding),
            reserved_nusd=self._reserved[MAX_USD],
            reserved_tokens=self._reserved[MAX_TOKENS],
            warned=tuple(c for c in (*_COUNTED_CAPS, MAX_WALL_SECONDS) if c in self._warned),
            exceeded=tuple(self._exceeded),
            stopped_by=self._stopped_by,
            by_model=MappingProxyType(dict(self._by_model)),
        )

    # ------------------------------------------------------------ inside

    def _crossing(self, requested: Mapping[str, int]) -> tuple[str, bool] | None:
        """The cap this call's worst case would cross, in _COUNTED_CAPS order, and
        whether it would fit once the calls in flight settle; None if it fits now.

        Under "deny", a cap the call cannot fit under even when every call in flight
        has settled comes first: that refusal is final (403), so it must not be
        hidden behind one that a retry lifts (429). Under "kill" the first crossing
        decides, as it always has: demand crossing the cap stops the run.
        """
        first: tuple[str, bool] | None = None
        for cap in _COUNTED_CAPS:
            limit = self._limits.get(cap)
            if limit is None:
                continue
            if self._committed[cap] + self._reserved[cap] + requested[cap] <= limit:
                continue
            fits_later = self._committed[cap] + requested[cap] <= limit
            if self.caps.on_breach == "kill":
                return cap, fits_later
            if not fits_later:
                return cap, False
            if first is None:
                first = (cap, True)
        return first

    def _refuse_crossing(
        self, crossing: tuple[str, bool], requested: Mapping[str, int]
    ) -> Decision:
        """Refuse a call whose worst case would cross `cap`. Under "deny", a call that
        fits once the calls in flight settle is only deferred: not a breach (no
        cap.exceeded; the boundary answers 429 with Retry-After, which SDKs retry),
        the warning aside, since demand did reach warn_at. Otherwise the cap is
        exceeded, and under "kill" the run stops."""
        cap, fits_later = crossing
        limit = self._limits[cap]
        committed, reserved = self._committed[cap], self._reserved[cap]
        demand = committed + reserved + requested[cap]
        warning = self._maybe_warn(cap, limit, demand)
        events: tuple[CapEvent, ...] = (warning,) if warning is not None else ()
        deferred = fits_later and self.caps.on_breach == "deny"
        if not deferred:
            events += self._exceed(cap, limit, demand)
        stop = self._stop_if_kill(cap, events)
        reason = _crossing_reason(cap, limit, committed, reserved, requested[cap])
        if deferred:
            reason += "; it fits once the calls in flight settle: retry"
        return self._refuse(
            CapRefusal(
                rule=f"caps.{cap}",
                cap=cap,
                reason=reason,
                limit=limit,
                committed=committed,
                reserved=reserved,
                requested=requested[cap],
                unit=UNITS[cap],
                would_fit_after_settle=fits_later,
                deferred=deferred,
            ),
            events=events,
            stop_run=stop,
        )

    def _refuse(
        self, refusal: CapRefusal, events: tuple[CapEvent, ...] = (), stop_run: bool = False
    ) -> Decision:
        self._refused_calls += 1
        return Decision(
            allowed=False, reservation=None, refusal=refusal, events=events, stop_run=stop_run
        )

    def _release(self, reservation: Reservation) -> Reservation:
        r = self._outstanding.pop(reservation.id, None)
        if r is None or r != reservation:
            raise ValueError(f"reservation {reservation.id} is not outstanding (settled twice?)")
        self._reserved[MAX_MODEL_CALLS] -= 1
        self._reserved[MAX_TOKENS] -= r.tokens
        self._reserved[MAX_USD] -= r.nusd
        return r

    def _model(self, r: Reservation) -> ModelTotals:
        return self._by_model.get(r.model) or ModelTotals(priced=r.priced)

    def _commit(self, r: Reservation, nusd: int, tokens: int) -> Settlement:
        if not r.priced:
            self._unpriced_calls += 1
        self._committed[MAX_MODEL_CALLS] += 1
        self._committed[MAX_TOKENS] += tokens
        self._committed[MAX_USD] += nusd
        events: list[CapEvent] = []
        for cap in _COUNTED_CAPS:
            limit = self._limits.get(cap)
            if limit is None:
                continue
            # Within its reservation a settlement only lowers demand; past it, it can cross.
            demand = self._committed[cap] + self._reserved[cap]
            warning = self._maybe_warn(cap, limit, demand)
            if warning is not None:
                events.append(warning)
            if self._committed[cap] > limit:
                events.extend(self._exceed(cap, limit, self._committed[cap]))
        breached = [e.cap for e in events if e.type == "cap.exceeded"]
        stop = self._stop_if_kill(breached[0], events) if breached else False
        return Settlement(
            charged_nusd=nusd, charged_tokens=tokens, events=tuple(events), stop_run=stop
        )

    def _maybe_warn(self, cap: str, limit: int | float, observed: int | float) -> CapEvent | None:
        if cap in self._warned or Fraction(observed) < self._warn_at * Fraction(limit):
            return None
        self._warned.add(cap)
        return CapEvent("cap.warning", cap, limit, observed, UNITS[cap])

    def _exceed(self, cap: str, limit: int | float, observed: int | float) -> tuple[CapEvent, ...]:
        if cap in self._exceeded:
            return ()
        self._exceeded.append(cap)
        return (CapEvent("cap.exceeded", cap, limit, observed, UNITS[cap]),)

    def _stop_if_kill(self, cap: str, events) -> bool:
        breached = any(e.type == "cap.exceeded" for e in events)
        if breached and self.caps.on_breach == "kill":
            if self._stopped_by is None:
                self._stopped_by = cap
            return True
        return False


def _check_count(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")


def _crossing_reason(cap: str, limit: int, committed: int, reserved: int, requested: int) -> str:
    if cap == MAX_USD:
        return (
            f"max_usd: this call could cost up to {format_nusd(requested)}; "
            f"{format_nusd(committed)} is spent and {format_nusd(reserved)} is held by calls in "
            f"flight, of a cap of {format_nusd(limit)}"
        )
    if cap == MAX_TOKENS:
        return (
            f"max_tokens: this call could use up to {requested} tokens; {committed} are used and "
            f"{reserved} are held by calls in flight, of a cap of {limit}"
        )
    return (
        f"max_model_calls: {committed} calls are made and {reserved} are in flight, "
        f"of a cap of {limit}"
    )
