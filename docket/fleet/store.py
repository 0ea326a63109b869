"""The fleet budget in PostgreSQL: the pool's arithmetic (pool.py) kept by the server.

Every operation is one transaction that first locks its budget's row, so the
operations on one budget take turns and two budgets never wait on each other.
The lease itself is one conditional UPDATE: the grant is what room is left under
every cap, up to what was asked, and the row is updated only if, with the grant,
spent + leased + lapsed stays within every cap. Expiry is the server's clock
(now()), never a client's; any caller folds expired leases into `lapsed` first.

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

SCHEMA_VERSION = 1
DIMS = ("nusd", "tokens", "calls")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fleet_schema_version (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS fleet_budgets (
    name text PRIMARY KEY,
    cap_nusd bigint CHECK (cap_nusd > 0),
    cap_tokens bigint CHECK (cap_tokens > 0),
    cap_calls bigint CHECK (cap_calls > 0),
    spent_nusd bigint NOT NULL DEFAULT 0,
    spent_tokens bigint NOT NULL DEFAULT 0,
    spent_calls bigint NOT NULL DEFAULT 0,
    leased_nusd bigint NOT NULL DEFAULT 0,
    leased_tokens bigint NOT NULL DEFAULT 0,
    leased_calls bigint NOT NULL DEFAULT 0,
    lapsed_nusd bigint NOT NULL DEFAULT 0 CHECK (lapsed_nusd >= 0),
    lapsed_tokens bigint NOT NULL DEFAULT 0 CHECK (lapsed_tokens >= 0),
    lapsed_calls bigint NOT NULL DEFAULT 0 CHECK (lapsed_calls >= 0)
);
CREATE TABLE IF NOT EXISTS fleet_leases (
    id bigserial PRIMARY KEY,
    budget text NOT NULL REFERENCES fleet_budgets (name) ON DELETE CASCADE,
    run_id text NOT NULL,
    host text NOT NULL,
    state text NOT NULL CHECK (state IN ('active', 'lapsed', 'returned')),
    amount_nusd bigint NOT NULL DEFAULT 0,
    amount_tokens bigint NOT NULL DEFAULT 0,
    amount_calls bigint NOT NULL DEFAULT 0,
    used_nusd bigint NOT NULL DEFAULT 0,
    used_tokens bigint NOT NULL DEFAULT 0,
    used_calls bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fleet_leases_active ON fleet_leases (budget, expires_at)
    WHERE state = 'active';
"""

# The lease: one conditional statement. The grant is the room left under each cap,
# up to what is asked (0 in a dimension the budget does not cap); the WHERE holds
# the cap whatever the grant's arithmetic says.
_GRANT = """
WITH g AS (
    SELECT name,
        CASE WHEN cap_nusd IS NULL THEN 0
             ELSE GREATEST(0, LEAST(%(nusd)s, cap_nusd - spent_nusd - leased_nusd - lapsed_nusd)) END AS nusd,
        CASE WHEN cap_tokens IS NULL THEN 0
             ELSE GREATEST(0, LEAST(%(tokens)s, cap_tokens - spent_tokens - leased_tokens - lapsed_tokens)) END AS tokens,
        CASE WHEN cap_calls IS NULL THEN 0
             ELSE GREATEST(0, LEAST(%(calls)s, cap_calls - spent_calls - leased_calls - lapsed_calls)) END AS calls
    FROM fleet_budgets WHERE name = %(budget)s
)
UPDATE fleet_budgets b SET
    leased_nusd = b.leased_nusd + g.nusd,
    leased_tokens = b.leased_tokens + g.tokens,
    leased_calls = b.leased_calls + g.calls
FROM g
WHERE b.name = g.name
  AND (b.cap_nusd IS NULL OR b.spent_nusd + b.leased_nusd + b.lapsed_nusd + g.nusd <= b.cap_nusd)
  AND (b.cap_tokens IS NULL OR b.spent_tokens + b.leased_tokens + b.lapsed_tokens + g.tokens <= b.cap_tokens)
  AND (b.cap_calls IS NULL OR b.spent_calls + b.leased_calls + b.lapsed_calls + g.calls <= b.cap_calls)
RETURNING g.nusd, g.tokens, g.calls
"""

# Any caller folds the budget's expired leases into lapsed (server time).
_RECLAIM = """
WITH folded AS (
    UPDATE fleet_leases SET state = 'lapsed'
    WHERE budget = %(budget)s AND state = 'active' AND expires_at <= now()
    RETURNING id, run_id, host, amount_nusd, amount_tokens, amount_calls
), total AS (
    SELECT coalesce(sum(amount_nusd), 0) AS n, coalesce(sum(amount_tokens), 0) AS t,
           coalesce(sum(amount_calls), 0) AS c FROM folded
), moved AS (
    UPDATE fleet_budgets SET
        leased_nusd = leased_nusd - total.n, lapsed_nusd = lapsed_nusd + total.n,
        leased_tokens = leased_tokens - total.t, lapsed_tokens = lapsed_tokens + total.t,
        leased_calls = leased_calls - total.c, lapsed_calls = lapsed_calls + total.c
    FROM total WHERE name = %(budget)s
    RETURNING name
)
SELECT id, run_id, host, amount_nusd, amount_tokens, amount_calls FROM folded
"""


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
            raise FleetStoreError(_one_line(exc)) from None
        finally:
            conn.close()

    # ------------------------------------------------------------ admin

    def init(self) -> int:
        """Create the tables (idempotent); the schema version in the database."""
        with self._transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('docket_fleet_schema'))")
            cur.execute(_SCHEMA)
            cur.execute("SELECT max(version) FROM fleet_schema_version")
            row = cur.fetchone()
            if row is None or row[0] is None:
                cur.execute("INSERT INTO fleet_schema_version VALUES (%s)", (SCHEMA_VERSION,))
                return SCHEMA_VERSION
            if row[0] != SCHEMA_VERSION:
                raise FleetStoreError(
                    f"the database holds fleet schema version {row[0]}; this docket knows "
                    f"{SCHEMA_VERSION}"
                )
            return int(row[0])

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
            budget = self._lock(cur, name)
            folded = self._reclaim(cur, name)
            if folded:
                budget = self._lock(cur, name)
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
        none) is settled and a new one opened. One transaction."""
        with self._transaction() as cur:
            self._lock(cur, budget)
            folded = self._reclaim(cur, budget)
            live = None
            if lease_id is not None:
                cur.execute(
                    """UPDATE fleet_leases SET
                         amount_nusd = amount_nusd - %(nusd)s, used_nusd = used_nusd + %(nusd)s,
                         amount_tokens = amount_tokens - %(tokens)s, used_tokens = used_tokens + %(tokens)s,
                         amount_calls = amount_calls - %(calls)s, used_calls = used_calls + %(calls)s
                       WHERE id = %(id)s AND budget = %(budget)s AND state = 'active'
                       RETURNING id""",
                    {**report.as_dict(), "id": int(lease_id), "budget": budget},
                )
                live = cur.fetchone()
                if live is not None:
                    self._spend(cur, budget, report, from_leased=report)
                else:
                    self._settle_closed(cur, budget, lease_id, report)
            else:
                self._spend(cur, budget, report)
            if live is None:
                cur.execute(
                    """INSERT INTO fleet_leases (budget, run_id, host, state, expires_at)
                       VALUES (%s, %s, %s, 'active', now()) RETURNING id""",
                    (budget, run_id, host),
                )
                row = cur.fetchone()
                assert row is not None
                live = row
            cur.execute(_GRANT, {"budget": budget, **want.as_dict()})
            granted_row = cur.fetchone()
            granted = Amounts(*granted_row) if granted_row is not None else ZERO
            cur.execute(
                """UPDATE fleet_leases SET amount_nusd = amount_nusd + %(nusd)s,
                       amount_tokens = amount_tokens + %(tokens)s,
                       amount_calls = amount_calls + %(calls)s,
                       expires_at = now() + %(s)s * interval '1 second'
                   WHERE id = %(id)s""",
                {**granted.as_dict(), "s": lease_seconds, "id": live[0]},
            )
            caps = self._caps(cur, budget)
        grant = Grant(
            str(live[0]), granted, caps, lapsed=lease_id is not None and str(live[0]) != lease_id
        )
        return Exchanged(grant, folded)

    def give_back(self, budget: str, lease_id: str, report: Amounts) -> tuple[Folded, ...]:
        """The run is over: `report` is spent, the rest of the lease is room again."""
        with self._transaction() as cur:
            self._lock(cur, budget)
            folded = self._reclaim(cur, budget)
            cur.execute(
                """UPDATE fleet_leases SET state = 'returned',
                       used_nusd = used_nusd + %s, used_tokens = used_tokens + %s,
                       used_calls = used_calls + %s
                   WHERE id = %s AND budget = %s AND state = 'active'
                   RETURNING amount_nusd, amount_tokens, amount_calls""",
                (report.nusd, report.tokens, report.calls, int(lease_id), budget),
            )
            row = cur.fetchone()
            if row is not None:
                self._spend(cur, budget, report, from_leased=Amounts(*row))
            else:
                self._settle_closed(cur, budget, lease_id, report)
        return folded

    # ------------------------------------------------------------ inside

    def _lock(self, cur: Any, budget: str) -> dict[str, Any]:
        cur.execute(
            """SELECT cap_nusd, cap_tokens, cap_calls, spent_nusd, spent_tokens, spent_calls,
                      leased_nusd, leased_tokens, leased_calls,
                      lapsed_nusd, lapsed_tokens, lapsed_calls
               FROM fleet_budgets WHERE name = %s FOR UPDATE""",
            (budget,),
        )
        row = cur.fetchone()
        if row is None:
            raise NoSuchBudget(f"no fleet budget {budget!r} (docket fleet budget set {budget} ...)")
        out = {}
        for i, part in enumerate(("cap", "spent", "leased", "lapsed")):
            out[part] = dict(zip(DIMS, row[3 * i : 3 * i + 3], strict=True))
        return out

    def _caps(self, cur: Any, budget: str) -> Caps:
        cur.execute(
            "SELECT cap_nusd, cap_tokens, cap_calls FROM fleet_budgets WHERE name = %s", (budget,)
        )
        row = cur.fetchone()
        assert row is not None
        return Caps(*row)

    def _reclaim(self, cur: Any, budget: str) -> tuple[Folded, ...]:
        cur.execute(_RECLAIM, {"budget": budget})
        return tuple(Folded(str(r[0]), r[1], r[2], Amounts(*r[3:6])) for r in cur.fetchall())

    def _spend(self, cur: Any, budget: str, report: Amounts, from_leased: Amounts = ZERO) -> None:
        cur.execute(
            """UPDATE fleet_budgets SET
                 spent_nusd = spent_nusd + %s, spent_tokens = spent_tokens + %s,
                 spent_calls = spent_calls + %s, leased_nusd = leased_nusd - %s,
                 leased_tokens = leased_tokens - %s, leased_calls = leased_calls - %s
               WHERE name = %s""",
            (
                report.nusd,
                report.tokens,
                report.calls,
                from_leased.nusd,
                from_leased.tokens,
                from_leased.calls,
                budget,
            ),
        )

    def _settle_closed(self, cur: Any, budget: str, lease_id: str, report: Amounts) -> None:
        """A report on a lease that lapsed: what it held is no longer counted as
        lapsed, what it used is spent (a lease already returned: spent only)."""
        cur.execute(
            """UPDATE fleet_leases SET state = 'returned',
                   used_nusd = used_nusd + %s, used_tokens = used_tokens + %s,
                   used_calls = used_calls + %s
               WHERE id = %s AND budget = %s AND state = 'lapsed'
               RETURNING amount_nusd, amount_tokens, amount_calls""",
            (report.nusd, report.tokens, report.calls, int(lease_id), budget),
        )
        row = cur.fetchone()
        lapsed = Amounts(*row) if row is not None else ZERO
        cur.execute(
            """UPDATE fleet_budgets SET
                 spent_nusd = spent_nusd + %s, spent_tokens = spent_tokens + %s,
                 spent_calls = spent_calls + %s, lapsed_nusd = lapsed_nusd - %s,
                 lapsed_tokens = lapsed_tokens - %s, lapsed_calls = lapsed_calls - %s
               WHERE name = %s""",
            (
                report.nusd,
                report.tokens,
                report.calls,
                lapsed.nusd,
                lapsed.tokens,
                lapsed.calls,
                budget,
            ),
        )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
