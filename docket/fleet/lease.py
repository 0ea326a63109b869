"""One boundary's share of a fleet budget: its escrow (pure) against the store.

The boundary asks `cover` before forwarding a call (the call's worst case, the caps
guard's reservation) and `settle` after; `run` is the background task that goes
to the budget when the escrow asks (the first lease, below the low-water mark,
renewal halfway through the lease), and `close` gives the rest back at the end.
Every exchange runs in a worker thread (psycopg is synchronous) under a deadline:
a database that does not answer in `timeout` seconds is a failed exchange, and
the slice already held keeps serving until its lease runs out; after that, a call
the slice cannot cover is refused (fail closed). Every change to the lease and
every failed exchange is a ledger event (`fleet.lease`, `fleet.store`).

Each exchange names the run's folder and pins its ledger (line count and head
hash). When an exchange answers that dead runs' lapsed leases wait on this host
(whoever folded them, this run's first exchange included), the task settles each
from its ledger (dead.py decides; `settled` or `unsettled`, either way a
`fleet.lease` event of this run), in a child task, so a renewal never waits on it.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import trio

from docket.errors import InputError
from docket.fleet.amounts import ZERO, Amounts
from docket.fleet.dead import Refuse, decide, read_facts
from docket.fleet.escrow import Ask, Escrow, EscrowConfig, Grant, Short
from docket.fleet.store import (
    DeadCandidate,
    Exchanged,
    FleetStore,
    FleetStoreError,
    NoSuchBudget,
)
from docket.ledger.limits import EvidenceLost, LedgerFull
from docket.pricing import PriceTable, default_price_table, format_nusd
from docket.values import nano_usd

log = logging.getLogger("docket.fleet")

Record = Callable[..., Awaitable[Any]]

# How long a refused call is told to wait: a slice may be on its way (one exchange).
RETRY_AFTER_S = 1.0


class LedgerHead(Protocol):
    """The run's ledger as the pin reads it (docket.ledger.writer.Ledger)."""

    @property
    def count(self) -> int: ...
    @property
    def head(self) -> str: ...


class FleetLease:
    def __init__(
        self, policy: Any, store: FleetStore, *, run_id: str, host: str, horizon_s: float
    ) -> None:
        self.policy = policy  # docket.policy.FleetPolicy
        self.store = store
        self.budget: str = policy.budget
        self.run_id, self.host = run_id, host
        slice_ = Amounts(
            nano_usd(policy.slice_usd) if policy.slice_usd is not None else 0,
            policy.slice_tokens or 0,
            policy.slice_calls or 0,
        )
        horizon = min(horizon_s, policy.lease_seconds / 4)
        self.escrow = Escrow(
            EscrowConfig(slice_, Fraction(str(policy.low_water)), policy.lease_seconds, horizon)
        )
        self.record: Record | None = None  # the boundary's recorder, set when it is built
        self._wake = trio.Event()  # the background task has something to ask
        self._answered = trio.Event()  # set after each exchange, then replaced
        self._drawn: dict[int, Amounts] = {}  # caps reservation id -> what it drew
        self._short = False  # a call could not be covered: ask even if the budget is near its end
        self.last_failure: str | None = None
        # The run's folder (absolute) and its ledger, once the supervisor has opened it:
        # each exchange names the folder and pins the ledger's position.
        self.folder: str | None = None
        self.ledger: LedgerHead | None = None
        self.prices: PriceTable = default_price_table()  # a dead run's ledger is read with
        self._settling = False  # a pass over dead runs is under way
        self._settle_again = False  # dead runs were named since the pass began
        # host, port and dbname of the budget's database (session.start's record of it)
        self.database: dict[str, str | None] = dict.fromkeys(("host", "port", "dbname"))

    # ------------------------------------------------------------ calls

    async def cover(self, reservation_id: int, need: Amounts) -> Short | None:
        """Draw `need` for the call; when the slice cannot cover it, have the background
        task go to the budget and wait for its answer (bounded), then draw again. The
        Short that stands when even then it cannot. The exchange itself is never the
        call's to run: a call cancelled while it waits leaves no exchange half done."""
        short = self._draw(reservation_id, need)
        for _ in range(2):  # the first exchange may only teach the caps (a derived slice)
            if short is None:
                break
            if self.escrow.sending is None:
                if self.last_failure is not None:
                    break  # the database is failing: refuse now, the task retries on its own
                self._short = True
                self._wake.set()
            with trio.move_on_after(self.policy.timeout + 1.0):
                await self._answered.wait()
            short = self._draw(reservation_id, need)
        return short

    def _draw(self, reservation_id: int, need: Amounts) -> Short | None:
        now = trio.current_time()
        short = self.escrow.draw(need, now)
        if short is None:
            self._drawn[reservation_id] = self.escrow.mask(need)
            self._kick(now)
        return short

    def settle(self, reservation_id: int, used: Amounts) -> None:
        """The call drawn under `reservation_id` is over; `used` what it was charged."""
        need = self._drawn.pop(reservation_id, None)
        if need is None:
            return  # never drawn (refused before or by the fleet rule)
        self.escrow.settle(need, used)

    def _kick(self, now: float) -> None:
        if self.escrow.ask(now) is not None:
            self._wake.set()

    # ------------------------------------------------------------ the budget

    def attach(self, ledger: LedgerHead, folder: Path, prices: PriceTable) -> None:
        """The run's ledger and folder (the supervisor, once the ledger is open)."""
        self.ledger, self.folder, self.prices = ledger, str(folder.resolve()), prices

    async def run(self) -> None:
        """Go to the budget whenever the escrow asks; first at once."""
        async with trio.open_nursery() as nursery:
            await self._run(nursery)

    async def _run(self, nursery: trio.Nursery) -> None:
        while True:
            now = trio.current_time()
            if self.escrow.lapse_if_due(now):
                await self._event("fleet.lease", change="lost", reason="expired before renewal")
            ask = self.escrow.ask(now, short=self._short)
            self._short = False
            if ask is not None:
                if await self._exchange(ask) and self.folder is not None:
                    self._settle_again = True  # a pass under way looks once more
                    if not self._settling:
                        self._settling = True
                        nursery.start_soon(self._settle_dead)
                if self.escrow.sending is None and self.last_failure is not None:
                    await trio.sleep(min(RETRY_AFTER_S, self.policy.lease_seconds / 8))
                continue
            self._wake = trio.Event()
            with trio.move_on_at(self._next_due()):
                await self._wake.wait()

    def _next_due(self) -> float:
        until = self.escrow.valid_until
        if until is None:
            return trio.current_time() + RETRY_AFTER_S
        return until - self.policy.lease_seconds / 2  # renewal time

    async def _exchange(self, ask: Ask) -> bool:
        """One exchange; whether its answer says dead runs wait on this host."""
        self.escrow.sent(ask, trio.current_time())
        pin = None if self.ledger is None else (self.ledger.count, self.ledger.head)
        dead_here = False
        try:
            done = await self._in_thread(
                self.store.exchange,
                self.budget,
                ask.lease_id,
                ask.used,  # the lease's whole use: a repeat is not counted twice
                ask.want,
                run_id=self.run_id,
                host=self.host,
                lease_seconds=self.policy.lease_seconds,
                folder=self.folder,
                pin=pin,
                release=ask.release,
            )
        except (FleetStoreError, NoSuchBudget) as exc:  # the budget itself missing too
            self.last_failure = str(exc)
            self.escrow.failed(trio.current_time())
            await self._event("fleet.store", reason=str(exc), asked=ask.reason)
        else:
            self.last_failure = None
            self.escrow.exchanged(ask, done.grant)
            dead_here = done.dead_here
            await self._recorded(ask, done)
        finally:
            if self.escrow.sending is ask:  # cancelled (the boundary is stopping)
                self.escrow.failed(trio.current_time())
            answered, self._answered = self._answered, trio.Event()
            answered.set()
        return dead_here

    # ------------------------------------------------------------ dead runs

    async def _settle_dead(self) -> None:
        """Settle the dead runs' lapsed leases on this host from their ledgers, again
        while exchanges named more since the pass began."""
        try:
            while self._settle_again:
                self._settle_again = False
                try:
                    candidates = await self._in_thread(
                        self.store.lapsed_here, self.budget, self.host
                    )
                except (FleetStoreError, NoSuchBudget) as exc:
                    await self._event("fleet.store", reason=str(exc), asked="lapsed_here")
                    return
                for candidate in candidates:
                    if candidate.run_id != self.run_id:
                        await self._settle_one(candidate)
        finally:
            self._settling = False

    async def _settle_one(self, dead: DeadCandidate) -> None:
        def unsettled(reason: str) -> Awaitable[None]:
            return self._event(
                "fleet.lease", change="unsettled", of_run=dead.run_id, of_host=self.host,
                reason=reason,
            )  # fmt: skip

        deadline = time.monotonic() + self.policy.timeout
        try:
            facts = await self._in_thread(
                read_facts,
                dead.folder,
                None if dead.pin is None else dead.pin[0],
                self.prices,
                deadline=deadline,
            )
        except FleetStoreError:
            await unsettled(f"its ledger was not read within {self.policy.timeout:g} s")
            return
        decision = decide(dead.run_id, self.budget, dead.pin, facts)
        if isinstance(decision, Refuse):
            await unsettled(decision.reason)
            return
        try:
            done = await self._in_thread(
                self.store.settle_dead, self.budget, dead.run_id, decision.spent
            )
        except InputError as exc:  # the budget refused it (a live run, already settled, ...)
            await unsettled(str(exc))
            return
        except (FleetStoreError, NoSuchBudget) as exc:
            await self._event("fleet.store", reason=str(exc), asked="settle_dead")
            return
        await self._event(
            "fleet.lease",
            change="settled",
            of_run=dead.run_id,
            of_host=self.host,
            reason="its ledger is final (no writer holds it): charged what it says was spent",
            # in the dimensions the budget caps (the others have no room to give back)
            **_amounts("charged", self.escrow.mask(done.more)),
            **_amounts("given_back", self.escrow.mask(done.given_back)),
        )

    async def run_ended(self, receipt: Path | None) -> str | None:
        """Record the run's end and its receipt file's sha256 at the budget (bounded);
        why it could not be, as one line, or None."""
        if receipt is None:
            return "the run's end was not recorded at the budget: no receipt file"
        try:
            digest = hashlib.sha256(receipt.read_bytes()).hexdigest()
            await self._in_thread(self.store.run_ended, self.budget, self.run_id, digest)
        except OSError as exc:
            return f"the receipt {receipt} could not be read for its digest ({exc.strerror})"
        except (FleetStoreError, NoSuchBudget) as exc:
            return f"the run's end was not recorded at the budget: {exc}"
        finally:
            self.store.close()
        return None

    async def _in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn in a worker thread, abandoned (and said to have failed) past the timeout:
        psycopg's own timeouts bound the thread; this bounds the caller."""
        with trio.move_on_after(self.policy.timeout + 0.5):
            return await trio.to_thread.run_sync(
                lambda: fn(*args, **kwargs), abandon_on_cancel=True
            )
        raise FleetStoreError(
            f"the budget's database did not answer within {self.policy.timeout:g} s"
        )

    async def _recorded(self, ask: Ask, done: Exchanged) -> None:
        for folded in done.folded:
            await self._event(
                "fleet.lease",
                change="expired",
                lease=folded.lease_id,
                of_run=folded.run_id,
                of_host=folded.host,
                reason="past its expiry (server time): folded into lapsed",
                **_amounts("held", folded.amount),
            )
        grant: Grant = done.grant
        if ask.release != ZERO and not grant.lapsed:
            # unused_: the receipt's `returned` (given back unused) counts it, so a clean
            # run's granted is still its reported plus its returned
            await self._event(
                "fleet.lease",
                change="released",
                lease=grant.lease_id,
                reason="a call was refused and the budget has no room: the free part of the "
                "slice goes back to it, for the boundary refused next",
                lease_seconds=self.policy.lease_seconds,
                **_amounts("reported", ask.report),
                **_amounts("unused", ask.release),
            )
            return
        if grant.lapsed:
            await self._event(
                "fleet.lease", change="lost", lease=ask.lease_id, reason="it lapsed at the budget"
            )
        change = (
            "drawn"
            if grant.lease_id != ask.lease_id
            or grant.granted.nusd
            or grant.granted.tokens
            or grant.granted.calls
            else "renewed"
        )
        await self._event(
            "fleet.lease",
            change=change,
            lease=grant.lease_id,
            reason=ask.reason,
            lease_seconds=self.policy.lease_seconds,
            **_amounts("granted", grant.granted),
            **_amounts("reported", ask.report),
        )

    async def close(self) -> None:
        """Report what was used and give the rest of the lease back (bounded); the
        store's kept connection is closed after it."""
        try:
            await self._give_back()
        finally:
            self.store.close()

    async def _give_back(self) -> None:
        ask = self.escrow.closing()
        if ask is None or ask.lease_id is None:
            return
        try:
            done = await self._in_thread(self.store.give_back, self.budget, ask.lease_id, ask.used)
        except (FleetStoreError, NoSuchBudget) as exc:
            await self._event("fleet.store", reason=str(exc), asked="return")
            await self._event(
                "fleet.lease",
                change="lost",
                lease=ask.lease_id,
                reason="could not be given back: it lapses at its expiry",
            )
            return
        await self._event(
            "fleet.lease",
            change="returned",
            lease=ask.lease_id,
            reason="the run ended",
            **_amounts("reported", ask.report),
            **_amounts("unused", self.escrow.free),
            # leases an exchange whose answer was lost opened: never drawn, closed too
            **(
                {"unheard_leases": done.other_leases, **_amounts("unheard", done.others)}
                if done.other_leases
                else {}
            ),
        )

    def session_facts(self) -> dict:
        """session.start's `fleet`: the budget and where its database is, no credential."""
        return {"budget": self.budget, "database": dict(self.database)}

    async def _event(self, type: str, **fields: Any) -> None:
        if self.record is None:
            log.warning("%s %s (no recorder)", type, fields)
            return
        try:
            await self.record(type, budget=self.budget, **fields)
        except (LedgerFull, EvidenceLost) as exc:
            # The recorder has asked the run to stop; the lease goes on being kept
            # (and given back) without its events.
            log.warning("%s not recorded: %s", type, exc)

    def refusal_reason(self, short: Short) -> str:
        free = format_nusd(max(0, short.free.nusd))
        need = format_nusd(short.need.nusd)
        why = {
            "no_lease": "no slice of it is held",
            "lease_expiring": "the lease on its slice runs out before this call could end",
            "slice_short": f"the slice held has {free} free and this call could cost up to {need}",
        }[short.code]
        tail = f" (the database: {self.last_failure})" if self.last_failure else ""
        return f"fleet budget {self.budget!r}: {why}, and no more could be leased{tail}"


def fleet_lease(policy: Any, env: Mapping[str, str], run_id: str) -> FleetLease | None:
    """The run's share of its [fleet] budget (None without one); the DSN read from
    the policy or from the variable dsn_env names (InputError: one line, exit 2)."""
    fleet = policy.fleet
    if not fleet.enabled:
        return None
    dsn = fleet.dsn
    if fleet.dsn_env is not None:
        dsn = env.get(fleet.dsn_env, "")
        if not dsn.strip():
            raise InputError(
                f"fleet.dsn_env: the variable {fleet.dsn_env} is not set (it holds the "
                "budget's database connection string)"
            )
    try:
        import psycopg  # noqa: F401  (the fleet extra)
    except ImportError:
        raise InputError(
            "[fleet] needs psycopg, which is not installed: pip install 'docket[fleet]'"
        ) from None
    store = FleetStore(dsn, timeout_s=fleet.timeout, keep=True)
    lease = FleetLease(
        fleet,
        store,
        run_id=run_id,
        host=socket.gethostname(),
        horizon_s=policy.boundary.upstream_total_timeout,
    )
    lease.database = database_identity(dsn)
    return lease


def database_identity(dsn: str) -> dict[str, str | None]:
    """Where the budget's database is, as the DSN names it: host, port and dbname (None
    where it names none), for session.start and the receipt. Never the user or a
    password: the DSN may carry one (dsn_env). A DSN that does not parse: InputError."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        # the parser's message may quote the DSN, and so a password: name only the key
        raise InputError(
            f"fleet: the budget's DSN is not a PostgreSQL connection string ({type(exc).__name__})"
        ) from None
    return {name: _text_or_none(parts.get(name)) for name in ("host", "port", "dbname")}


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _amounts(prefix: str, a: Amounts) -> dict[str, int]:
    return {f"{prefix}_nusd": a.nusd, f"{prefix}_tokens": a.tokens, f"{prefix}_calls": a.calls}
