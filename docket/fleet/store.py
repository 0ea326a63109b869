"""The fleet budget in PostgreSQL: the pool's arithmetic (pool.py) kept by the server.

The schema and the functions a run calls are schema.py's: a boundary's exchange and
give-back are each one call of a SECURITY DEFINER function (one transaction), so a
runs' role needs EXECUTE on two functions and nothing on the tables. `docket fleet`
(an admin's role) creates them, sets budgets and reads where a budget stands.

Synchronous (psycopg 3): the boundary calls it off the event loop
(trio.to_thread.run_sync, lease.py), `docket fleet` calls it directly. Each
operation opens its own connection (leases are taken once per slice, not per
call), with a connect timeout and a statement timeout, so a slow server or a
black hole costs one bounded wait and never a stuck connection kept for later.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from docket.errors import DocketError, InputError
from docket.fleet.amounts import ZERO, Amounts, Caps
from docket.fleet.escrow import Grant
from docket.fleet.schema import FUNCTIONS, RUN_FUNCTIONS, SCHEMA_VERSION, TABLES

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
class Exchanged:
    grant: Grant
    folded: tuple[Folded, ...]  # leases this call found expired (anyone's)


class FleetStore:
    def __init__(self, dsn: str, *, timeout_s: float = 5.0) -> None:
        self.dsn = dsn
        self.timeout_s = timeout_s

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        import psycopg  # the fleet extra: only a run with [fleet] needs it

        ms = max(1, int(self.timeout_s * 1000))
        try:
            conn = psycopg.connect(
                self.dsn,
                connect_timeout=max(2, math.ceil(self.timeout_s)),  # libpq's floor is 2 s
                options=f"-c statement_timeout={ms} -c lock_timeout={ms}",
                application_name="docket-fleet",
            )
        except psycopg.Error as exc:
            raise FleetStoreError(_one_line(exc)) from None
        try:
            with conn, conn.transaction(), conn.cursor() as cur:
                yield cur
        except psycopg.Error as exc:
            if exc.sqlstate == "P0002":  # fleet_lock: no such budget
                budget = _one_line(exc).removeprefix("no fleet budget ")
                raise NoSuchBudget(
                    f"no fleet budget {budget} (docket fleet budget set ...)"
                ) from None
            raise FleetStoreError(_one_line(exc)) from None
        finally:
            conn.close()

    # ------------------------------------------------------------ admin

    def init(self, runs_role: str | None = None) -> int:
        """Create the tables and functions (idempotent); the schema version in the
        database. `runs_role`: the role runs connect as, granted EXECUTE on the run
        functions and nothing on the tables (it must exist)."""
        from psycopg import sql

        with self._transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('docket_fleet_schema'))")
            cur.execute(TABLES)
            cur.execute("SELECT max(version) FROM fleet_schema_version")
            row = cur.fetchone()
            version = None if row is None else row[0]
            if version is None:
                cur.execute("INSERT INTO fleet_schema_version VALUES (%s)", (SCHEMA_VERSION,))
            elif version != SCHEMA_VERSION:
                raise FleetStoreError(
                    f"the database holds fleet schema version {version}; this docket knows "
                    f"{SCHEMA_VERSION}"
                )
            cur.execute(FUNCTIONS)
            if runs_role is not None:
                role = sql.Identifier(runs_role)
                cur.execute(
                    sql.SQL(
                        "REVOKE ALL ON fleet_budgets, fleet_leases, fleet_schema_version FROM {}"
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
                          extract(epoch FROM expires_at - now())
                   FROM fleet_leases WHERE budget = %s AND state = 'active' ORDER BY id""",
                (name,),
            )
            leases = [
                {
                    "lease": str(r[0]),
                    "run_id": r[1],
                    "host": r[2],
                    "held": dict(zip(DIMS, r[3:6], strict=True)),
                    "used": dict(zip(DIMS, r[6:9], strict=True)),
                    "expires_in_s": round(float(r[9]), 3),
                }
                for r in cur.fetchall()
            ]
        return {"budget": name, **budget, "leases": leases}

    # ------------------------------------------------------------ a boundary's

    def exchange(
        self,
        budget: str,
        lease_id: str | None,
        report: Amounts,
        want: Amounts,
        *,
        run_id: str,
        host: str,
        lease_seconds: float,
    ) -> Exchanged:
        """Report `report` as used on the lease, add what room allows of `want` and
        extend it by lease_seconds from the server's now(); a lease that lapsed (or
        none) is settled and a new one opened. One call of fleet_exchange."""
        with self._transaction() as cur:
            cur.execute(
                "SELECT * FROM fleet_exchange(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    budget,
                    None if lease_id is None else int(lease_id),
                    report.nusd, report.tokens, report.calls,
                    want.nusd, want.tokens, want.calls,
                    run_id, host, lease_seconds,
                ),
            )  # fmt: skip
            row = cur.fetchone()
        assert row is not None  # a function returning one row
        lease, gn, gk, gc, cap_n, cap_k, cap_c, lapsed, folded = row
        grant = Grant(str(lease), Amounts(gn, gk, gc), Caps(cap_n, cap_k, cap_c), lapsed=lapsed)
        return Exchanged(grant, _folded(folded))

    def give_back(self, budget: str, lease_id: str, report: Amounts) -> tuple[Folded, ...]:
        """The run is over: `report` is spent, the rest of the lease is room again."""
        with self._transaction() as cur:
            cur.execute(
                "SELECT fleet_give_back(%s, %s, %s, %s, %s)",
                (budget, int(lease_id), report.nusd, report.tokens, report.calls),
            )
            row = cur.fetchone()
        assert row is not None
        return _folded(row[0])

    def settle_lapsed(self, budget: str, run_id: str, spent: Amounts) -> dict[str, Any]:
        """A dead run's lapsed leases, settled from what its ledger says it spent: the
        use beyond what it reported is spent, the rest of the leases is room again.
        An admin's operation (the runs' role cannot call it)."""
        with self._transaction() as cur:
            cur.execute("SELECT fleet_lock(%s), fleet_reclaim(%s)", (budget, budget))
            cur.execute(
                """SELECT state, count(*), coalesce(sum(amount_nusd), 0),
                          coalesce(sum(amount_tokens), 0), coalesce(sum(amount_calls), 0),
                          coalesce(sum(used_nusd), 0), coalesce(sum(used_tokens), 0),
                          coalesce(sum(used_calls), 0)
                   FROM fleet_leases WHERE budget = %s AND run_id = %s GROUP BY state""",
                (budget, run_id),
            )
            by_state = {r[0]: r[1:] for r in cur.fetchall()}
            if "active" in by_state:
                raise InputError(
                    f"fleet settle: run {run_id} still holds an active lease on {budget}"
                )
            if "lapsed" not in by_state:
                raise InputError(f"fleet settle: run {run_id} has no lapsed lease on {budget}")
            reported = ZERO
            for row in by_state.values():
                reported += Amounts(*(int(v) for v in row[4:7]))
            more = spent - reported
            if min(more.nusd, more.tokens, more.calls) < 0:
                raise InputError(
                    f"fleet settle: the ledger accounts for less than run {run_id} reported "
                    f"({spent} < {reported}): is it that run's ledger?"
                )
            lapsed = Amounts(*(int(v) for v in by_state["lapsed"][1:4]))
            cur.execute(
                """UPDATE fleet_leases SET state = 'returned'
                   WHERE budget = %s AND run_id = %s AND state = 'lapsed'""",
                (budget, run_id),
            )
            cur.execute(
                """UPDATE fleet_budgets SET
                     spent_nusd = spent_nusd + %s, spent_tokens = spent_tokens + %s,
                     spent_calls = spent_calls + %s, lapsed_nusd = lapsed_nusd - %s,
                     lapsed_tokens = lapsed_tokens - %s, lapsed_calls = lapsed_calls - %s
                   WHERE name = %s""",
                (
                    more.nusd,
                    more.tokens,
                    more.calls,
                    lapsed.nusd,
                    lapsed.tokens,
                    lapsed.calls,
                    budget,
                ),
            )
        return {
            "run_id": run_id,
            "spent": spent,
            "reported": reported,
            "lapsed": lapsed,
            "more": more,
        }

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


def _folded(rows: list[list[Any]]) -> tuple[Folded, ...]:
    return tuple(Folded(str(r[0]), r[1], r[2], Amounts(*r[3:6])) for r in rows)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
