"""The fleet budget in PostgreSQL: the pool's arithmetic (pool.py) kept by the server.

The schema and the functions a run calls are schema.py's: a boundary's exchange and
give-back are each one call of a SECURITY DEFINER function (one transaction), so a
runs' role needs EXECUTE on two functions and nothing on the tables. `docket fleet`
(an admin's role) creates them, sets budgets and reads where a budget stands.

Synchronous (psycopg 3): the boundary calls it off the event loop
(trio.to_thread.run_sync, lease.py), `docket fleet` calls it directly. Every
connection has a connect timeout and a statement timeout, so a slow server or a
black hole costs one bounded wait.

A run's calls (exchange, give-back, settle, run ended) are each one function call
in autocommit: the call is its own transaction, with no BEGIN and COMMIT round
trips, and the budget's row lock is let go as the function ends, not one round
trip later (under 500 ms of latency an exchange took 2.5 s as five round trips on
a new connection). A boundary's store keeps its connection between calls (`keep`):
a connection is taken by one call at a time, so a call its caller abandoned past
the timeout (still running in its worker thread) never shares one; a call that
fails closes its connection, and the next opens a new one. Reports are the
lease's whole use, so a call sent again after its answer was lost counts nothing
twice (schema.fleet_report).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from docket.errors import DocketError, InputError
from docket.fleet.amounts import ZERO, Amounts, Caps
from docket.fleet.escrow import Grant
from docket.fleet.schema import (
    FUNCTIONS,
    MIGRATIONS,
    RUN_FUNCTIONS,
    SCHEMA_VERSION,
    SETTLE_REFUSED,
)

DIMS = ("nusd", "tokens", "calls")


class FleetStoreError(DocketError):
    """The budget's database could not be used (unreachable, late, refused): exit 1."""

    exit_code = 1


class NoSuchBudget(InputError):
    """The named budget is not in the database (`docket fleet budget set`)."""


@dataclass(frozen=True)
class Folded:
    """A lease that expired and was folded into lapsed."""

    lease_id: str
    run_id: str
    host: str
    amount: Amounts


@dataclass(frozen=True)
class GivenBack:
    """fleet_return_lease's answer: the expired leases it folded (anyone's), and the run's
    other leases it closed: ones whose grant the run never heard of (an exchange whose
    answer was lost opened them), held, never used."""

    folded: tuple[Folded, ...]
    others: Amounts  # what they held, given back to the room
    other_leases: int


@dataclass(frozen=True)
class Exchanged:
    grant: Grant
    folded: tuple[Folded, ...]  # leases this call found expired (anyone's)
    dead_here: bool = False  # dead runs' lapsed leases wait on the caller's host


@dataclass(frozen=True)
class Settled:
    """fleet_settle_dead's answer: what the ledger says, what the run had reported,
    what its lapsed leases held and what was charged beyond the report."""

    run_id: str
    spent: Amounts
    reported: Amounts
    lapsed: Amounts
    more: Amounts

    @property
    def given_back(self) -> Amounts:
        return self.lapsed - self.more


@dataclass(frozen=True)
class DeadCandidate:
    """A run fleet_lapsed_here names: lapsed, nothing active, its folder on this host."""

    run_id: str
    folder: str
    pin: tuple[int, str] | None  # its ledger's line count and head at its last exchange


class FleetStore:
    def __init__(self, dsn: str, *, timeout_s: float = 5.0, keep: bool = False) -> None:
        self.dsn = dsn
        self.timeout_s = timeout_s
        self.keep = keep  # keep one connection between a run's calls
        self._idle: Any = None  # the kept connection, while no call has it
        self._idle_lock = threading.Lock()

    def _connect(self, *, autocommit: bool) -> Any:
        import psycopg  # the fleet extra: only a run with [fleet] needs it

        ms = max(1, int(self.timeout_s * 1000))
        try:
            return psycopg.connect(
                self.dsn,
                autocommit=autocommit,
                connect_timeout=max(2, math.ceil(self.timeout_s)),  # libpq's floor is 2 s
                options=f"-c statement_timeout={ms} -c lock_timeout={ms}",
                application_name="docket-fleet",
            )
        except psycopg.Error as exc:
            raise FleetStoreError(_one_line(exc)) from None

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """Several statements in one transaction, on a connection of their own."""
        import psycopg

        conn = self._connect(autocommit=False)
        try:
            with conn, conn.transaction(), conn.cursor() as cur:
                yield cur
        except psycopg.Error as exc:
            raise _refused(exc) from None
        finally:
            conn.close()

    @contextmanager
    def _call(self) -> Iterator[Any]:
        """One function call, its own transaction (autocommit), on the kept connection
        when there is one idle."""
        import psycopg

        with self._idle_lock:
            conn, self._idle = self._idle, None
        if conn is None:
            conn = self._connect(autocommit=True)
        done = False
        try:
            with conn.cursor() as cur:
                yield cur
            done = True
        except psycopg.Error as exc:
            raise _refused(exc) from None
        finally:
            if done and self.keep:
                with self._idle_lock:
                    if self._idle is None:  # kept for the next call
                        conn, self._idle = None, conn
            if conn is not None:
                conn.close()

    def close(self) -> None:
        """Close the kept connection; a call still running (abandoned past its timeout)
        closes its own when it ends, since nothing is kept from now on."""
        with self._idle_lock:
            self.keep = False
            conn, self._idle = self._idle, None
        if conn is not None:
            conn.close()

    # ------------------------------------------------------------ admin

    def init(self, runs_role: str | None = None) -> int:
        """Create the tables and functions, or migrate an older version's (idempotent);
        the schema version now in the database. `runs_role`: the role runs connect as, granted EXECUTE on the run
        functions and nothing on the tables (it must exist)."""
        from psycopg import sql

        with self._transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('docket_fleet_schema'))")
            cur.execute("SELECT to_regclass('fleet_schema_version') IS NOT NULL")
            row = cur.fetchone()
            version = 0
            if row is not None and row[0]:
                cur.execute("SELECT max(version) FROM fleet_schema_version")
                row = cur.fetchone()
                version = 0 if row is None or row[0] is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise FleetStoreError(
                    f"the database holds fleet schema version {version}, newer than this "
                    f"docket's {SCHEMA_VERSION}: upgrade docket to use it"
                )
            # Each migration in turn, in this one transaction: a failure leaves the
            # database at the version it had.
            for migration in MIGRATIONS[version:]:
                cur.execute(migration)
            if version == 0:
                cur.execute("INSERT INTO fleet_schema_version VALUES (%s)", (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:
                cur.execute("UPDATE fleet_schema_version SET version = %s", (SCHEMA_VERSION,))
            cur.execute(FUNCTIONS)
            if runs_role is not None:
                role = sql.Identifier(runs_role)
                cur.execute(
                    sql.SQL(
                        "REVOKE ALL ON fleet_budgets, fleet_leases, fleet_runs, fleet_schema_version "
                        "FROM {}"
                    ).format(role)
                )
                for name, args in RUN_FUNCTIONS:
                    cur.execute(
                        sql.SQL("GRANT EXECUTE ON FUNCTION {}(" + args + ") TO {}").format(
                            sql.Identifier(name), role
                        )
                    )
            return SCHEMA_VERSION

    def set_budget(self, name: str, caps: Caps) -> None:
        """Create the budget, or change its caps (what is spent and leased stays)."""
        with self._transaction() as cur:
            cur.execute(
                """INSERT INTO fleet_budgets (name, cap_nusd, cap_tokens, cap_calls)
                   VALUES (%s, %s, %s, %s)
                   ON CONFLICT (name) DO UPDATE SET cap_nusd = EXCLUDED.cap_nusd,
                       cap_tokens = EXCLUDED.cap_tokens, cap_calls = EXCLUDED.cap_calls""",
                (name, caps.nusd, caps.tokens, caps.calls),
            )

    def status(self, name: str) -> dict[str, Any]:
        with self._transaction() as cur:
            cur.execute("SELECT fleet_lock(%s), fleet_reclaim(%s)", (name, name))
            budget = self._read(cur, name)
            cur.execute(
                """SELECT id, run_id, host, amount_nusd, amount_tokens, amount_calls,
                          used_nusd, used_tokens, used_calls,
                          extract(epoch FROM expires_at - now()), lease_s
                   FROM fleet_leases WHERE budget = %s AND state = 'active' ORDER BY id""",
                (name,),
            )
            leases = [_lease_row(r) for r in cur.fetchall()]
            cur.execute(
                """SELECT host, count(*) FILTER (WHERE state = 'active'),
                          coalesce(sum(amount_nusd) FILTER (WHERE state = 'active'), 0),
                          coalesce(sum(amount_nusd) FILTER (WHERE state = 'lapsed'), 0),
                          coalesce(sum(used_nusd), 0), count(DISTINCT run_id)
                   FROM fleet_leases WHERE budget = %s GROUP BY host ORDER BY host""",
                (name,),
            )
            hosts = [
                {
                    "host": r[0],
                    "active_leases": int(r[1]),
                    "held_nusd": int(r[2]),
                    "lapsed_nusd": int(r[3]),
                    "used_nusd": int(r[4]),
                    "runs": int(r[5]),
                }
                for r in cur.fetchall()
            ]
        return {"budget": name, **budget, "leases": leases, "hosts": hosts}

    # ------------------------------------------------------------ a boundary's

    def exchange(
        self,
        budget: str,
        lease_id: str | None,
        used: Amounts,
        want: Amounts,
        *,
        run_id: str,
        host: str,
        lease_seconds: float,
        folder: str | None = None,
        pin: tuple[int, str] | None = None,
        release: Amounts = ZERO,
    ) -> Exchanged:
        """Report `used`, the lease's whole use so far (the budget counts what it has
        not recorded yet: a repeat adds nothing), add what room allows of `want` and
        extend it by lease_seconds from the server's now(); a lease that lapsed (or
        none) is settled and a new one opened. One call of fleet_exchange. `folder`:
        the run's folder (absolute); `pin`: its ledger's line count and head hash;
        `release`: free amount of the lease given back to the room first."""
        seq, head = (None, None) if pin is None else pin
        with self._call() as cur:
            cur.execute(
                "SELECT * FROM fleet_exchange(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, %s, %s, %s, %s, %s)",
                (
                    budget,
                    None if lease_id is None else int(lease_id),
                    used.nusd, used.tokens, used.calls,
                    want.nusd, want.tokens, want.calls,
                    run_id, host, lease_seconds, folder, seq, head,
                    release.nusd, release.tokens, release.calls,
                ),
            )  # fmt: skip
            row = cur.fetchone()
        assert row is not None  # a function returning one row
        lease, gn, gk, gc, cap_n, cap_k, cap_c, lapsed, folded, dead_here = row
        grant = Grant(str(lease), Amounts(gn, gk, gc), Caps(cap_n, cap_k, cap_c), lapsed=lapsed)
        return Exchanged(grant, _folded(folded), bool(dead_here))

    def give_back(self, budget: str, lease_id: str, used: Amounts) -> GivenBack:
        """The run is over: `used`, the lease's whole use, is spent (what the budget
        has not recorded of it), the rest of the lease is room again."""
        with self._call() as cur:
            cur.execute(
                "SELECT fleet_return_lease(%s, %s, %s, %s, %s)",
                (budget, int(lease_id), used.nusd, used.tokens, used.calls),
            )
            row = cur.fetchone()
        assert row is not None
        others = row[0]["others"]
        held = ZERO
        for _id, _state, n, k, c in others:
            held += Amounts(n, k, c)
        return GivenBack(_folded(row[0]["folded"]), held, len(others))

    def settle_dead(self, budget: str, run_id: str, spent: Amounts) -> Settled:
        """A dead run's lapsed leases, settled from what its ledger says it spent: the
        use beyond what it reported is charged, the rest of the leases is room again.
        One call of fleet_settle_dead; its refusals (a live run, nothing lapsed, a ledger
        that says less than the run reported) are InputError."""
        with self._call() as cur:
            cur.execute(
                "SELECT fleet_settle_dead(%s, %s, %s, %s, %s)",
                (budget, run_id, spent.nusd, spent.tokens, spent.calls),
            )
            row = cur.fetchone()
        assert row is not None
        got = row[0]
        return Settled(
            run_id, spent, Amounts(*got["reported"]), Amounts(*got["lapsed"]), Amounts(*got["more"])
        )

    def lapsed_here(self, budget: str, host: str) -> tuple[DeadCandidate, ...]:
        """Runs on `host` with a lapsed lease and none active (four at most): each one's
        folder and the pin of its ledger at its last exchange."""
        with self._call() as cur:
            cur.execute("SELECT * FROM fleet_lapsed_here(%s, %s)", (budget, host))
            rows = cur.fetchall()
        return tuple(
            DeadCandidate(r[0], r[1], None if r[2] is None else (int(r[2]), r[3])) for r in rows
        )

    def run_ended(self, budget: str, run_id: str, receipt_sha256: str) -> None:
        """The run wrote its receipt: its end, and the receipt file's digest."""
        with self._call() as cur:
            cur.execute("SELECT fleet_run_ended(%s, %s, %s)", (budget, run_id, receipt_sha256))

    def runs(self, name: str, limit: int) -> list[dict[str, Any]]:
        """The budget's runs, newest first: where, when, what they spent and hold."""
        with self._transaction() as cur:
            cur.execute("SELECT fleet_lock(%s), fleet_reclaim(%s)", (name, name))
            cur.execute(
                """SELECT r.run_id, r.host, r.folder, r.started_at, r.ended_at,
                          r.receipt_sha256, r.settled_at,
                          coalesce(sum(l.used_nusd), 0), coalesce(sum(l.used_tokens), 0),
                          coalesce(sum(l.used_calls), 0),
                          coalesce(sum(l.amount_nusd) FILTER (WHERE l.state = 'active'), 0),
                          coalesce(sum(l.amount_nusd) FILTER (WHERE l.state = 'lapsed'), 0),
                          count(*) FILTER (WHERE l.state = 'active'),
                          count(*) FILTER (WHERE l.state = 'lapsed')
                   FROM fleet_runs r LEFT JOIN fleet_leases l
                     ON l.budget = r.budget AND l.run_id = r.run_id
                   WHERE r.budget = %s
                   GROUP BY r.budget, r.run_id
                   ORDER BY r.started_at DESC, r.run_id LIMIT %s""",
                (name, limit),
            )
            rows = cur.fetchall()
        return [_run_row(r) for r in rows]

    # ------------------------------------------------------------ inside

    def _read(self, cur: Any, budget: str) -> dict[str, Any]:
        cur.execute(
            """SELECT cap_nusd, cap_tokens, cap_calls, spent_nusd, spent_tokens, spent_calls,
                      leased_nusd, leased_tokens, leased_calls,
                      lapsed_nusd, lapsed_tokens, lapsed_calls
               FROM fleet_budgets WHERE name = %s""",
            (budget,),
        )
        row = cur.fetchone()
        assert row is not None  # fleet_lock found it
        out = {}
        for i, part in enumerate(("cap", "spent", "leased", "lapsed")):
            out[part] = dict(zip(DIMS, row[3 * i : 3 * i + 3], strict=True))
        return out


def _lease_row(r: tuple[Any, ...]) -> dict[str, Any]:
    expires_in = round(float(r[9]), 3)
    lease_s = None if r[10] is None else float(r[10])
    return {
        "lease": str(r[0]),
        "run_id": r[1],
        "host": r[2],
        "held": dict(zip(DIMS, r[3:6], strict=True)),
        "used": dict(zip(DIMS, r[6:9], strict=True)),
        "expires_in_s": expires_in,
        "lease_seconds": lease_s,
        # in the last quarter of its lease: a live boundary renews at half, so one
        # this close to expiry is late (cut off from the database, or dead)
        "expiring": lease_s is not None and expires_in < lease_s / 4,
    }


def _run_row(r: tuple[Any, ...]) -> dict[str, Any]:
    run_id, host, folder, started, ended, sha, settled = r[:7]
    active, lapsed = int(r[12]), int(r[13])
    if active:
        state = "active"
    elif lapsed:
        state = "lapsed"
    elif settled is not None:
        state = "settled"
    else:
        state = "ended"
    if sha is not None:
        receipt = sha
    elif state == "active":
        receipt = "none: still running"
    elif state in ("lapsed", "settled"):
        receipt = "none: died"
    else:
        receipt = "none: not recorded"
    return {
        "run_id": run_id,
        "host": host,
        "folder": folder,
        "started": started.isoformat(timespec="seconds"),
        "ended": None if ended is None else ended.isoformat(timespec="seconds"),
        "spent": dict(zip(DIMS, (int(v) for v in r[7:10]), strict=True)),
        "held_nusd": int(r[10]),
        "lapsed_nusd": int(r[11]),
        "receipt_sha256": sha,
        "receipt": receipt,
        "state": state,
    }


def _refused(exc: Any) -> DocketError:
    """The error a failed statement is to the caller (exc: a psycopg.Error)."""
    if exc.sqlstate == "P0002":  # fleet_lock: no such budget
        budget = _one_line(exc).removeprefix("no fleet budget ")
        return NoSuchBudget(f"no fleet budget {budget} (docket fleet budget set ...)")
    if exc.sqlstate == SETTLE_REFUSED:
        return InputError(_one_line(exc))
    return FleetStoreError(_one_line(exc))


def _folded(rows: list[list[Any]]) -> tuple[Folded, ...]:
    return tuple(Folded(str(r[0]), r[1], r[2], Amounts(*r[3:6])) for r in rows)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
