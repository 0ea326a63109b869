"""The fleet budget's schema (version 1): two tables, and the functions a run calls.

A boundary's whole conversation with the budget is two functions, fleet_exchange
and fleet_give_back, each one call (one transaction) that first locks its budget's
row, so operations on one budget take turns and two budgets never wait on each
other. They are SECURITY DEFINER: a runs' role (`docket fleet init --runs-role
NAME`) is granted EXECUTE on them and nothing on the tables, so a process holding
that role's DSN can lease and report, bounded by the cap, but cannot rewrite a cap
or what was spent (docs/fleet.md). The lease itself is one conditional UPDATE: the
grant is the room left under every cap, up to what is asked, and the row changes
only if spent + leased + lapsed + grant stays within every cap. Expiry is the
server's now(); any caller first folds the budget's expired leases into lapsed.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

TABLES = """
CREATE TABLE IF NOT EXISTS fleet_schema_version (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS fleet_budgets (
    name text PRIMARY KEY,
    cap_nusd bigint CHECK (cap_nusd > 0),
    cap_tokens bigint CHECK (cap_tokens > 0),
    cap_calls bigint CHECK (cap_calls > 0),
    spent_nusd bigint NOT NULL DEFAULT 0,
    spent_tokens bigint NOT NULL DEFAULT 0,
    spent_calls bigint NOT NULL DEFAULT 0,
    leased_nusd bigint NOT NULL DEFAULT 0 CHECK (leased_nusd >= 0),
    leased_tokens bigint NOT NULL DEFAULT 0 CHECK (leased_tokens >= 0),
    leased_calls bigint NOT NULL DEFAULT 0 CHECK (leased_calls >= 0),
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
    amount_nusd bigint NOT NULL DEFAULT 0 CHECK (amount_nusd >= 0),
    amount_tokens bigint NOT NULL DEFAULT 0 CHECK (amount_tokens >= 0),
    amount_calls bigint NOT NULL DEFAULT 0 CHECK (amount_calls >= 0),
    used_nusd bigint NOT NULL DEFAULT 0,
    used_tokens bigint NOT NULL DEFAULT 0,
    used_calls bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fleet_leases_active ON fleet_leases (budget, expires_at)
    WHERE state = 'active';
"""

# (name, argument types): what a runs' role is granted, and nothing else.
RUN_FUNCTIONS = (
    (
        "fleet_exchange",
        "text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, text, double precision",
    ),
    ("fleet_give_back", "text, bigint, bigint, bigint, bigint"),
)

FUNCTIONS = """
CREATE OR REPLACE FUNCTION fleet_lock(p_budget text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM 1 FROM fleet_budgets WHERE name = p_budget FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no fleet budget %', quote_literal(p_budget) USING ERRCODE = 'P0002';
    END IF;
END $$;

-- Fold the budget's expired leases into lapsed; the folded leases as JSON.
CREATE OR REPLACE FUNCTION fleet_reclaim(p_budget text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE folded jsonb;
BEGIN
    WITH f AS (
        UPDATE fleet_leases SET state = 'lapsed'
        WHERE budget = p_budget AND state = 'active' AND expires_at <= now()
        RETURNING id, run_id, host, amount_nusd, amount_tokens, amount_calls
    ), t AS (
        SELECT coalesce(sum(amount_nusd), 0) AS n, coalesce(sum(amount_tokens), 0) AS k,
               coalesce(sum(amount_calls), 0) AS c,
               coalesce(jsonb_agg(jsonb_build_array(id, run_id, host, amount_nusd,
                                                    amount_tokens, amount_calls)), '[]') AS j
        FROM f
    ), moved AS (
        UPDATE fleet_budgets SET
            leased_nusd = leased_nusd - t.n, lapsed_nusd = lapsed_nusd + t.n,
            leased_tokens = leased_tokens - t.k, lapsed_tokens = lapsed_tokens + t.k,
            leased_calls = leased_calls - t.c, lapsed_calls = lapsed_calls + t.c
        FROM t WHERE name = p_budget RETURNING 1
    )
    SELECT t.j INTO folded FROM t;
    RETURN folded;
END $$;

-- A report on a lease no longer active: a lapsed lease's amount leaves lapsed (the
-- run's use is now known), the use is spent.
CREATE OR REPLACE FUNCTION fleet_settle_closed(
    p_budget text, p_lease bigint, rn bigint, rk bigint, rc bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE a record;
BEGIN
    UPDATE fleet_leases SET state = 'returned',
        used_nusd = used_nusd + rn, used_tokens = used_tokens + rk, used_calls = used_calls + rc
    WHERE id = p_lease AND budget = p_budget AND state = 'lapsed'
    RETURNING amount_nusd AS n, amount_tokens AS k, amount_calls AS c INTO a;
    UPDATE fleet_budgets SET
        spent_nusd = spent_nusd + rn, spent_tokens = spent_tokens + rk,
        spent_calls = spent_calls + rc,
        lapsed_nusd = lapsed_nusd - coalesce(a.n, 0),
        lapsed_tokens = lapsed_tokens - coalesce(a.k, 0),
        lapsed_calls = lapsed_calls - coalesce(a.c, 0)
    WHERE name = p_budget;
END $$;

-- Report (rn, rk, rc) used on the lease, add what room allows of (wn, wk, wc) and
-- extend it by p_lease_s from now(); a lease that lapsed (or none) is settled and a
-- new one opened.
CREATE OR REPLACE FUNCTION fleet_exchange(
    p_budget text, p_lease bigint, rn bigint, rk bigint, rc bigint,
    wn bigint, wk bigint, wc bigint, p_run text, p_host text, p_lease_s double precision)
RETURNS TABLE (lease bigint, gn bigint, gk bigint, gc bigint,
               cap_n bigint, cap_k bigint, cap_c bigint, lapsed boolean, folded jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE live bigint; tn bigint; tk bigint; tc bigint;
BEGIN
    IF least(rn, rk, rc, wn, wk, wc) < 0 OR p_lease_s <= 0 THEN
        RAISE EXCEPTION 'fleet_exchange: amounts must be >= 0, lease seconds > 0'
            USING ERRCODE = '22023';
    END IF;
    PERFORM fleet_lock(p_budget);
    folded := fleet_reclaim(p_budget);
    IF p_lease IS NOT NULL THEN
        -- What was used comes off the lease, never below zero: a call that used more
        -- than its reservation is spent in full but cannot take more than was leased.
        SELECT id, least(rn, amount_nusd), least(rk, amount_tokens), least(rc, amount_calls)
        INTO live, tn, tk, tc
        FROM fleet_leases WHERE id = p_lease AND budget = p_budget AND state = 'active'
        FOR UPDATE;
        IF live IS NOT NULL THEN
            UPDATE fleet_leases SET
                amount_nusd = amount_nusd - tn, used_nusd = used_nusd + rn,
                amount_tokens = amount_tokens - tk, used_tokens = used_tokens + rk,
                amount_calls = amount_calls - tc, used_calls = used_calls + rc
            WHERE id = live;
            UPDATE fleet_budgets SET
                spent_nusd = spent_nusd + rn, leased_nusd = leased_nusd - tn,
                spent_tokens = spent_tokens + rk, leased_tokens = leased_tokens - tk,
                spent_calls = spent_calls + rc, leased_calls = leased_calls - tc
            WHERE name = p_budget;
        ELSE
            PERFORM fleet_settle_closed(p_budget, p_lease, rn, rk, rc);
        END IF;
    ELSE
        UPDATE fleet_budgets SET spent_nusd = spent_nusd + rn,
            spent_tokens = spent_tokens + rk, spent_calls = spent_calls + rc
        WHERE name = p_budget;
    END IF;
    IF live IS NULL THEN
        INSERT INTO fleet_leases (budget, run_id, host, state, expires_at)
        VALUES (p_budget, p_run, p_host, 'active', now()) RETURNING id INTO live;
    END IF;
    -- The lease: one conditional statement.
    WITH g AS (
        SELECT name,
            CASE WHEN cap_nusd IS NULL THEN 0 ELSE
                greatest(0, least(wn, cap_nusd - spent_nusd - leased_nusd - lapsed_nusd)) END AS n,
            CASE WHEN cap_tokens IS NULL THEN 0 ELSE
                greatest(0, least(wk, cap_tokens - spent_tokens - leased_tokens - lapsed_tokens)) END AS k,
            CASE WHEN cap_calls IS NULL THEN 0 ELSE
                greatest(0, least(wc, cap_calls - spent_calls - leased_calls - lapsed_calls)) END AS c
        FROM fleet_budgets WHERE name = p_budget
    )
    UPDATE fleet_budgets b SET
        leased_nusd = b.leased_nusd + g.n,
        leased_tokens = b.leased_tokens + g.k,
        leased_calls = b.leased_calls + g.c
    FROM g
    WHERE b.name = g.name
      AND (b.cap_nusd IS NULL OR b.spent_nusd + b.leased_nusd + b.lapsed_nusd + g.n <= b.cap_nusd)
      AND (b.cap_tokens IS NULL OR b.spent_tokens + b.leased_tokens + b.lapsed_tokens + g.k <= b.cap_tokens)
      AND (b.cap_calls IS NULL OR b.spent_calls + b.leased_calls + b.lapsed_calls + g.c <= b.cap_calls)
    RETURNING g.n, g.k, g.c INTO gn, gk, gc;
    IF NOT FOUND THEN
        gn := 0; gk := 0; gc := 0;
    END IF;
    UPDATE fleet_leases SET amount_nusd = amount_nusd + gn, amount_tokens = amount_tokens + gk,
        amount_calls = amount_calls + gc, expires_at = now() + p_lease_s * interval '1 second'
    WHERE id = live;
    SELECT cap_nusd, cap_tokens, cap_calls INTO cap_n, cap_k, cap_c
    FROM fleet_budgets WHERE name = p_budget;
    lease := live;
    lapsed := p_lease IS NOT NULL AND live <> p_lease;
    RETURN NEXT;
END $$;

-- The run is over: (rn, rk, rc) is spent, the rest of the lease is room again.
CREATE OR REPLACE FUNCTION fleet_give_back(
    p_budget text, p_lease bigint, rn bigint, rk bigint, rc bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE folded jsonb; a record;
BEGIN
    IF least(rn, rk, rc) < 0 THEN
        RAISE EXCEPTION 'fleet_give_back: amounts must be >= 0' USING ERRCODE = '22023';
    END IF;
    PERFORM fleet_lock(p_budget);
    folded := fleet_reclaim(p_budget);
    UPDATE fleet_leases SET state = 'returned',
        used_nusd = used_nusd + rn, used_tokens = used_tokens + rk, used_calls = used_calls + rc
    WHERE id = p_lease AND budget = p_budget AND state = 'active'
    RETURNING amount_nusd AS n, amount_tokens AS k, amount_calls AS c INTO a;
    IF FOUND THEN
        UPDATE fleet_budgets SET
            spent_nusd = spent_nusd + rn, leased_nusd = leased_nusd - a.n,
            spent_tokens = spent_tokens + rk, leased_tokens = leased_tokens - a.k,
            spent_calls = spent_calls + rc, leased_calls = leased_calls - a.c
        WHERE name = p_budget;
    ELSE
        PERFORM fleet_settle_closed(p_budget, p_lease, rn, rk, rc);
    END IF;
    RETURN folded;
END $$;

REVOKE ALL ON FUNCTION fleet_lock(text), fleet_reclaim(text),
    fleet_settle_closed(text, bigint, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION
    fleet_exchange(text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, text, double precision),
    fleet_give_back(text, bigint, bigint, bigint, bigint) FROM PUBLIC;
"""
