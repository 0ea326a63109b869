"""One boundary's escrow of a fleet budget: pure, facts and a clock reading in.

The shared budget (pool.py, store.py) leases a boundary a slice of its caps; the
boundary spends the slice locally, each call drawing its worst case (the caps
guard's reservation) before it is forwarded and settling to what it really used
after, and reports what it used at its next exchange with the budget. The escrow
decides, from what it holds and the monotonic clock:

- draw: whether a call's worst case fits in the slice now (Short says why not);
- ask: whether to go to the budget now (no lease; below the low-water mark; the
  lease half gone), for how much (up to one slice free), reporting what was used;
- exchanged / lapsed / failed: what the budget answered;
- release: when a call is refused and the budget has no room (its last grant fell
  short), the free part of the slice goes back to the room, so that the boundary
  whose call comes next gathers what four boundaries each held too little of to use
  (fragmentation at a budget's end). Only a refused call releases, and a release asks
  for nothing in the same exchange: the amount goes to whoever is refused next.

The lease's expiry is the budget's (server time), never this clock; the escrow
counts its lease as valid until `sent_at + lease_seconds`, where sent_at is when
the exchange was sent: the server read its now() after that, so its expiry is
never earlier. A call may draw only while it would end before that expiry (now +
horizon_seconds, the longest a call may run), so when a lease lapses nothing
drawn from it is still being spent. Dimensions the budget does not cap are not
drawn (their need is masked to zero).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from docket.fleet.amounts import ZERO, Amounts, Caps

DEFAULT_SLICES = 20  # a dimension with a cap but no slice of its own: cap / 20 a slice

NO_LEASE = "no_lease"  # nothing leased yet, or the last lease lapsed
EXPIRING = "lease_expiring"  # a call drawn now could outlive the lease
SLICE_SHORT = "slice_short"  # the slice's free part cannot cover the call's worst case


@dataclass(frozen=True)
class EscrowConfig:
    slice: Amounts  # per exchange, at most this much free; 0 in a dimension: cap / 20
    low_water: Fraction  # ask for more once free < low_water * slice in any capped dimension
    lease_seconds: float
    horizon_seconds: float  # the longest a call may run: it must end before the lease does

    def __post_init__(self) -> None:
        if not 0 <= self.low_water <= 1:
            raise ValueError(f"low_water must be within 0..1, got {self.low_water}")
        if not 0 < self.horizon_seconds < self.lease_seconds:
            raise ValueError(
                f"horizon_seconds ({self.horizon_seconds}) must be above 0 and below "
                f"lease_seconds ({self.lease_seconds})"
            )


@dataclass(frozen=True)
class Short:
    """A call the escrow cannot cover now."""

    code: str  # NO_LEASE | EXPIRING | SLICE_SHORT
    need: Amounts
    free: Amounts


@dataclass(frozen=True)
class Ask:
    """Go to the budget: report `report` used, ask for `want` more (either may be zero).

    The budget is sent `used`, the lease's whole use (what earlier exchanges it
    answered took, plus `report`), never `report` alone: an exchange that committed
    but whose answer was lost is sent again with the same use, and the budget counts
    only what it has not yet recorded (schema.fleet_report), so nothing is spent twice.
    """

    reason: str  # "first" | "low_water" | "renew" | "lapsed" | "short" | "release" | "return"
    lease_id: str | None  # the lease to report on and extend; None: a new lease
    report: Amounts  # used since the last exchange the budget answered
    want: Amounts
    release: Amounts = ZERO  # free amount given back to the budget's room (taken at sent)
    short: bool = False  # asked because a call was refused
    used: Amounts = ZERO  # the lease's whole use: what is sent


@dataclass(frozen=True)
class Grant:
    """The budget's answer to an exchange."""

    lease_id: str
    granted: Amounts  # added to the lease (after the report was taken off it)
    caps: Caps
    lapsed: bool = False  # the lease asked about had expired: its remainder was folded back


class Escrow:
    def __init__(self, config: EscrowConfig) -> None:
        self.config = config
        self.caps: Caps | None = None  # the budget's, once an exchange has answered
        self.lease_id: str | None = None
        self.held = ZERO  # the lease's amount at the budget, as this escrow knows it
        self.drawn = ZERO  # worst cases in flight + used and not yet reported
        self.unreported = ZERO  # used by settled calls, not yet reported
        self.lease_used = ZERO  # reported on the lease and answered (the budget has it)
        self.valid_until: float | None = None  # monotonic: draws must end by then
        self.sending: Ask | None = None  # the exchange in flight
        self._sent_at = 0.0
        self._last_grant_short = False  # the budget gave less than asked: it is nearly spent
        # The first exchange asked before the caps were known, so a slice derived from
        # them (cap / 20) was not asked for: ask again at once.
        self._resize = False
        # The largest worst case refused since the last exchange: a call larger than a
        # slice is asked for whole, or it could never be covered.
        self.short_need = ZERO
        # Released the free part of its slice: ask for nothing more (no low-water ask,
        # renewals for nothing) until one of its own calls is refused, or it would take
        # back at once what it gave the boundary refused next.
        self._released = False

    # ------------------------------------------------------------ calls

    @property
    def free(self) -> Amounts:
        return self.held - self.drawn

    def mask(self, need: Amounts) -> Amounts:
        """`need` in the dimensions the budget caps (others are never drawn)."""
        c = self.caps
        if c is None:
            return need
        return Amounts(
            need.nusd if c.nusd is not None else 0,
            need.tokens if c.tokens is not None else 0,
            need.calls if c.calls is not None else 0,
        )

    def draw(self, need: Amounts, now: float) -> Short | None:
        """Hold `need` (a call's worst case) out of the slice, or say why it cannot."""
        need = self.mask(need)
        if self.valid_until is None or self.caps is None:
            self.short_need = _most(self.short_need, need)
            return Short(NO_LEASE, need, ZERO)
        if now + self.config.horizon_seconds > self.valid_until:
            return Short(EXPIRING, need, self.free)
        if not self.free.covers(need):
            self.short_need = _most(self.short_need, need)
            return Short(SLICE_SHORT, need, self.free)
        self.drawn += need
        return None

    def settle(self, need: Amounts, used: Amounts) -> None:
        """A drawn call is over: it used `used` (its whole need when unknown)."""
        need, used = self.mask(need), self.mask(used)
        self.drawn = self.drawn - need + used
        self.unreported += used

    # ------------------------------------------------------------ the budget

    def slice_size(self) -> Amounts:
        s, c = self.config.slice, self.caps
        if c is None:
            return s
        return self.mask(
            Amounts(
                s.nusd or _default_slice(c.nusd),
                s.tokens or _default_slice(c.tokens),
                s.calls or _default_slice(c.calls),
            )
        )

    def ask(self, now: float, *, short: bool = False) -> Ask | None:
        """Whether to go to the budget now, and with what; None while an exchange is
        in flight or nothing calls for one. `short`: a call could not be covered, so
        ask even when the last grant said the budget is nearly spent."""
        if self.sending is not None:
            return None
        size = _most(self.slice_size(), self.mask(self.short_need))
        want = Amounts(
            max(0, size.nusd - max(0, self.free.nusd)),
            max(0, size.tokens - max(0, self.free.tokens)),
            max(0, size.calls - max(0, self.free.calls)),
        )
        if self._released and not short:
            want = ZERO
        if self.valid_until is None:
            reason = "first" if self.lease_id is None else "lapsed"
            return Ask(reason, self.lease_id, self.unreported, want, short=short, used=self._used())
        if now >= self.valid_until:
            return Ask(
                "lapsed", self.lease_id, self.unreported, want, short=short, used=self._used()
            )
        if now >= self.valid_until - self.config.lease_seconds / 2:
            return Ask(
                "renew", self.lease_id, self.unreported, want, short=short, used=self._used()
            )
        if short and self._last_grant_short and not self.free.covers(self.mask(self.short_need)):
            release = _at_least_zero(self.free)
            if release != ZERO:
                return Ask(
                    "release", self.lease_id, self.unreported, ZERO, release, True, self._used()
                )
        if short and not self._below_low_water(size):
            return Ask("short", self.lease_id, self.unreported, want, short=True, used=self._used())
        quiet = self._last_grant_short or self._released  # no room, or gave it back
        if (short or not quiet) and self._below_low_water(size):
            return Ask(
                "low_water", self.lease_id, self.unreported, want, short=short, used=self._used()
            )
        return None

    def sent(self, ask: Ask, now: float) -> None:
        self.sending, self._sent_at = ask, now
        # Released the moment it is sent: nothing may draw it while the budget takes
        # it back. Should the exchange fail, it stays on the lease unknown here (held,
        # never spent), as a grant the boundary never heard of does.
        self.held -= ask.release
        if ask.release != ZERO:
            self._released = True
        elif ask.short:
            self._released = False

    def exchanged(self, ask: Ask, grant: Grant) -> None:
        """The budget took the report and added `grant.granted` to the lease."""
        self.sending = None
        self.short_need = ZERO
        learned = self.caps is None
        self.caps = grant.caps
        self._resize = learned and self.slice_size() != self.mask(self.config.slice)
        self.drawn -= ask.report
        self.unreported -= ask.report
        if grant.lapsed or grant.lease_id != ask.lease_id:
            # The old lease lapsed and this report settled it at the budget: what is
            # still drawn (calls in flight, should any outlive it) is held against the new one.
            self.held = grant.granted
            self.lease_used = ZERO
        else:
            self.held = _at_least_zero(self.held - ask.report) + grant.granted
            self.lease_used += ask.report
        self.lease_id = grant.lease_id
        self.valid_until = self._sent_at + self.config.lease_seconds
        self._last_grant_short = not grant.granted.covers(self.mask(ask.want))

    def failed(self, now: float) -> None:
        """The exchange did not answer (unreachable, late, refused): keep what is held
        until it lapses."""
        self.sending = None
        self.lapse_if_due(now)

    def lapse_if_due(self, now: float) -> bool:
        """Past the lease's expiry: nothing of it may be drawn any more."""
        if self.valid_until is not None and now >= self.valid_until:
            self.valid_until = None
            self.held = ZERO
            return True
        return False

    def closing(self) -> Ask | None:
        """The run is over: report what was used, give back the rest (None: no lease)."""
        if self.lease_id is None:
            return None
        return Ask("return", self.lease_id, self.unreported, ZERO, used=self._used())

    def _used(self) -> Amounts:
        """The lease's whole use as this escrow knows it (Ask.used)."""
        return self.lease_used + self.unreported

    def _below_low_water(self, size: Amounts) -> bool:
        lw, free = self.config.low_water, self.free
        return any(
            s > 0 and f < lw * s
            for s, f in (
                (size.nusd, free.nusd),
                (size.tokens, free.tokens),
                (size.calls, free.calls),
            )
        )


def _at_least_zero(a: Amounts) -> Amounts:
    """What the budget keeps of a lease after a report: use over the lease (a call past
    its reservation) is spent, but takes the lease no lower than zero."""
    return Amounts(max(0, a.nusd), max(0, a.tokens), max(0, a.calls))


def _most(a: Amounts, b: Amounts) -> Amounts:
    return Amounts(max(a.nusd, b.nusd), max(a.tokens, b.tokens), max(a.calls, b.calls))


def _default_slice(cap: int | None) -> int:
    return 0 if cap is None else max(1, cap // DEFAULT_SLICES)
