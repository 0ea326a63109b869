"""The fleet budget's schema (version 2): its migrations, and the functions a run calls.

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

Versions are migrations applied in order (MIGRATIONS[v - 1] takes a database from
v - 1 to v), then FUNCTIONS, always the current ones, replace whatever a previous
docket created. Version 2 records where each run's folder is and how far its ledger
had got at each exchange (a dead run's lapsed slice is settled from that ledger by a
live boundary on its host, docs/fleet.md), and one row per run (fleet_runs: host,
folder, start, end, its receipt's sha256).
"""

from __future__ import annotations

SCHEMA_VERSION = 2

# Version 1, as it shipped: never edited (a database at version 1 holds exactly this).
V1_TABLES = """
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

# Version 1 -> 2. A lease names its run's folder (absolute, on its host) and the
# ledger's position at its last exchange (pin_seq lines, pin_head the hash of the
# last: a ledger read back later must carry that prefix), and the lease's length
# (status marks leases in their last quarter). fleet_runs: one row per run.
V2_DELTA = """
ALTER TABLE fleet_leases ADD COLUMN IF NOT EXISTS folder text;
ALTER TABLE fleet_leases ADD COLUMN IF NOT EXISTS pin_seq bigint;
ALTER TABLE fleet_leases ADD COLUMN IF NOT EXISTS pin_head text;
ALTER TABLE fleet_leases ADD COLUMN IF NOT EXISTS lease_s double precision;
CREATE INDEX IF NOT EXISTS fleet_leases_lapsed ON fleet_leases (budget, host)
    WHERE state = 'lapsed';
CREATE TABLE IF NOT EXISTS fleet_runs (
    budget text NOT NULL REFERENCES fleet_budgets (name) ON DELETE CASCADE,
    run_id text NOT NULL,
    host text NOT NULL,
    folder text,
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    receipt_sha256 text CHECK (receipt_sha256 ~ '^[0-9a-f]{64}$'),
    settled_at timestamptz,          -- its lapsed leases were settled from its ledger
    settle_tried_at timestamptz,     -- fleet_lapsed_here offers the least recently tried first
    PRIMARY KEY (budget, run_id)
);
"""

MIGRATIONS = (V1_TABLES, V2_DELTA)

# (name, argument types): what a runs' role is granted, and nothing else.
EXCHANGE_V1_ARGS = (
    "text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, text, double precision"
)
EXCHANGE_ARGS = EXCHANGE_V1_ARGS + ", text, bigint, text, bigint, bigint, bigint"

# (name, argument types): what a runs' role is granted, and nothing else.
RUN_FUNCTIONS = (
    ("fleet_exchange", EXCHANGE_ARGS),
    # A boundary of version 1 during a rolling upgrade: the same exchange with no
    # folder and no pin (its lapsed leases are settled by `docket fleet settle` only).
    ("fleet_exchange", EXCHANGE_V1_ARGS),
    ("fleet_return_lease", "text, bigint, bigint, bigint, bigint"),
    ("fleet_give_back", "text, bigint, bigint, bigint, bigint"),  # version 1's
    ("fleet_run_ended", "text, text, text"),
    ("fleet_settle_dead", "text, text, bigint, bigint, bigint"),
    ("fleet_lapsed_here", "text, text"),
)

# A settle refused for a reason the caller can act on (a live run, nothing lapsed,
# a ledger that says too little): its message is for the user, as is.
SETTLE_REFUSED = "DKF01"

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

-- A report: (un, uk, uc) is the lease's whole use so far as its run knows it, never
-- use since the last report. An exchange whose COMMIT reached the server but whose
-- answer was lost (a reset, a late answer abandoned) is sent again by its boundary
-- with the same use plus any since: counted as a difference from what the lease
-- already records, a repeat adds nothing, so nothing is ever spent twice. Active: the
-- use comes off the lease's amount (never below zero: a call that used more than its
-- reservation is spent in full but takes no more than was leased). Lapsed: its
-- boundary lived after all; the lapsed amount goes, the use is spent. Returned: use
-- reported late (or again) is spent beyond what the lease records. A lease the budget
-- does not know is charged the whole. Returns the lease's state before (NULL: none).
CREATE OR REPLACE FUNCTION fleet_report(
    p_budget text, p_lease bigint, un bigint, uk bigint, uc bigint) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE l record; dn bigint; dk bigint; dc bigint;
BEGIN
    SELECT state, amount_nusd, amount_tokens, amount_calls, used_nusd, used_tokens, used_calls
    INTO l FROM fleet_leases WHERE id = p_lease AND budget = p_budget FOR UPDATE;
    IF NOT FOUND THEN
        UPDATE fleet_budgets SET spent_nusd = spent_nusd + un,
            spent_tokens = spent_tokens + uk, spent_calls = spent_calls + uc
        WHERE name = p_budget;
        RETURN NULL;
    END IF;
    dn := greatest(0, un - l.used_nusd);
    dk := greatest(0, uk - l.used_tokens);
    dc := greatest(0, uc - l.used_calls);
    UPDATE fleet_leases SET used_nusd = used_nusd + dn, used_tokens = used_tokens + dk,
        used_calls = used_calls + dc
    WHERE id = p_lease;
    UPDATE fleet_budgets SET spent_nusd = spent_nusd + dn, spent_tokens = spent_tokens + dk,
        spent_calls = spent_calls + dc
    WHERE name = p_budget;
    IF l.state = 'active' THEN
        UPDATE fleet_leases SET amount_nusd = amount_nusd - least(dn, l.amount_nusd),
            amount_tokens = amount_tokens - least(dk, l.amount_tokens),
            amount_calls = amount_calls - least(dc, l.amount_calls)
        WHERE id = p_lease;
        UPDATE fleet_budgets SET leased_nusd = leased_nusd - least(dn, l.amount_nusd),
            leased_tokens = leased_tokens - least(dk, l.amount_tokens),
            leased_calls = leased_calls - least(dc, l.amount_calls)
        WHERE name = p_budget;
    ELSIF l.state = 'lapsed' THEN
        UPDATE fleet_leases SET state = 'returned' WHERE id = p_lease;
        UPDATE fleet_budgets SET lapsed_nusd = lapsed_nusd - l.amount_nusd,
            lapsed_tokens = lapsed_tokens - l.amount_tokens,
            lapsed_calls = lapsed_calls - l.amount_calls
        WHERE name = p_budget;
    END IF;
    RETURN l.state;
END $$;

-- What a boundary of version 1 sends (use since its last report) as a lease's whole
-- use: its boundary has one exchange in flight at a time, so the lease's use read
-- here is the one its report adds to.
CREATE OR REPLACE FUNCTION fleet_whole_use(
    p_budget text, p_lease bigint, rn bigint, rk bigint, rc bigint,
    OUT un bigint, OUT uk bigint, OUT uc bigint)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT rn + coalesce(max(used_nusd), 0), rk + coalesce(max(used_tokens), 0),
           rc + coalesce(max(used_calls), 0)
    FROM fleet_leases WHERE id = p_lease AND budget = p_budget
$$;

-- Report (rn, rk, rc), the lease's whole use (fleet_report), add what room allows of (wn, wk, wc) and
-- extend it by p_lease_s from now(); a lease that lapsed (or none) is settled and a
-- new one opened.
-- p_folder: the run's folder (absolute, on p_host); p_seq, p_head: its ledger's line
-- count and head hash when the exchange was sent (the pin a later settle checks);
-- (xn, xk, xc): free amount the boundary gives back to the room (a release: it was
-- refused a call while the budget had no room), never more than the lease holds.
CREATE OR REPLACE FUNCTION fleet_exchange(
    p_budget text, p_lease bigint, rn bigint, rk bigint, rc bigint,
    wn bigint, wk bigint, wc bigint, p_run text, p_host text, p_lease_s double precision,
    p_folder text, p_seq bigint, p_head text, xn bigint, xk bigint, xc bigint)
RETURNS TABLE (lease bigint, gn bigint, gk bigint, gc bigint,
               cap_n bigint, cap_k bigint, cap_c bigint, lapsed boolean, folded jsonb,
               dead_here boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE live bigint; tn bigint; tk bigint; tc bigint;
BEGIN
    IF least(rn, rk, rc, wn, wk, wc, xn, xk, xc) < 0 OR p_lease_s <= 0 OR p_seq < 0 THEN
        RAISE EXCEPTION 'fleet_exchange: amounts must be >= 0, lease seconds > 0'
            USING ERRCODE = '22023';
    END IF;
    PERFORM fleet_lock(p_budget);
    folded := fleet_reclaim(p_budget);
    INSERT INTO fleet_runs (budget, run_id, host, folder) VALUES (p_budget, p_run, p_host, p_folder)
    ON CONFLICT (budget, run_id) DO NOTHING;
    IF p_lease IS NOT NULL THEN
        IF fleet_report(p_budget, p_lease, rn, rk, rc) = 'active' THEN
            live := p_lease;
            IF greatest(xn, xk, xc) > 0 THEN  -- a release: back to the room
                SELECT least(xn, amount_nusd), least(xk, amount_tokens), least(xc, amount_calls)
                INTO tn, tk, tc FROM fleet_leases WHERE id = live;
                UPDATE fleet_leases SET amount_nusd = amount_nusd - tn,
                    amount_tokens = amount_tokens - tk, amount_calls = amount_calls - tc
                WHERE id = live;
                UPDATE fleet_budgets SET leased_nusd = leased_nusd - tn,
                    leased_tokens = leased_tokens - tk, leased_calls = leased_calls - tc
                WHERE name = p_budget;
            END IF;
        END IF;
    ELSE
        -- no lease: nothing drawn yet, so nothing to be counted against
        UPDATE fleet_budgets SET spent_nusd = spent_nusd + rn,
            spent_tokens = spent_tokens + rk, spent_calls = spent_calls + rc
        WHERE name = p_budget;
    END IF;
    IF live IS NULL THEN
        INSERT INTO fleet_leases (budget, run_id, host, state, expires_at, folder)
        VALUES (p_budget, p_run, p_host, 'active', now(), p_folder) RETURNING id INTO live;
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
        amount_calls = amount_calls + gc, expires_at = now() + p_lease_s * interval '1 second',
        lease_s = p_lease_s, pin_seq = coalesce(p_seq, pin_seq), pin_head = coalesce(p_head, pin_head)
    WHERE id = live;
    SELECT cap_nusd, cap_tokens, cap_calls INTO cap_n, cap_k, cap_c
    FROM fleet_budgets WHERE name = p_budget;
    lease := live;
    lapsed := p_lease IS NOT NULL AND live <> p_lease;
    -- Dead runs wait on the caller's host (a lapsed lease with a folder, no active
    -- lease, not offered within the last four leases): its boundary settles them
    -- (fleet_lapsed_here), whoever folded their leases.
    dead_here := EXISTS (
        SELECT 1 FROM fleet_leases l
        LEFT JOIN fleet_runs x ON x.budget = l.budget AND x.run_id = l.run_id
        WHERE l.budget = p_budget AND l.host = p_host AND l.state = 'lapsed'
          AND l.folder IS NOT NULL AND l.run_id <> p_run
          AND (x.settle_tried_at IS NULL
               OR x.settle_tried_at < now() - 4 * p_lease_s * interval '1 second')
          AND NOT EXISTS (SELECT 1 FROM fleet_leases a WHERE a.budget = p_budget
                          AND a.run_id = l.run_id AND a.state = 'active'));
    RETURN NEXT;
END $$;

-- The run is over: (un, uk, uc), the lease's whole use, is spent (fleet_report), the
-- rest of the lease is room again. So are the run's other leases still active or
-- lapsed: an exchange whose answer was lost may have opened one its run never heard of,
-- and every use the run made was reported on the lease it knew, so they hold nothing
-- used. Returns the expired leases folded ("folded") and those other leases ("others":
-- id, state, amounts).
CREATE OR REPLACE FUNCTION fleet_return_lease(
    p_budget text, p_lease bigint, un bigint, uk bigint, uc bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE folded jsonb; others jsonb; a record; v_run text;
BEGIN
    IF least(un, uk, uc) < 0 THEN
        RAISE EXCEPTION 'fleet_return_lease: amounts must be >= 0' USING ERRCODE = '22023';
    END IF;
    PERFORM fleet_lock(p_budget);
    folded := fleet_reclaim(p_budget);
    IF fleet_report(p_budget, p_lease, un, uk, uc) = 'active' THEN
        UPDATE fleet_leases SET state = 'returned' WHERE id = p_lease
        RETURNING amount_nusd AS n, amount_tokens AS k, amount_calls AS c INTO a;
        UPDATE fleet_budgets SET leased_nusd = leased_nusd - a.n,
            leased_tokens = leased_tokens - a.k, leased_calls = leased_calls - a.c
        WHERE name = p_budget;
    END IF;
    SELECT run_id INTO v_run FROM fleet_leases WHERE id = p_lease AND budget = p_budget;
    WITH o AS (
        SELECT id, state, amount_nusd, amount_tokens, amount_calls FROM fleet_leases
        WHERE budget = p_budget AND run_id = v_run AND id <> p_lease
          AND state IN ('active', 'lapsed')
        FOR UPDATE
    ), closed AS (
        UPDATE fleet_leases l SET state = 'returned' FROM o WHERE l.id = o.id RETURNING 1
    ), t AS (
        SELECT
            coalesce(sum(amount_nusd) FILTER (WHERE state = 'active'), 0) AS an,
            coalesce(sum(amount_tokens) FILTER (WHERE state = 'active'), 0) AS ak,
            coalesce(sum(amount_calls) FILTER (WHERE state = 'active'), 0) AS ac,
            coalesce(sum(amount_nusd) FILTER (WHERE state = 'lapsed'), 0) AS ln,
            coalesce(sum(amount_tokens) FILTER (WHERE state = 'lapsed'), 0) AS lk,
            coalesce(sum(amount_calls) FILTER (WHERE state = 'lapsed'), 0) AS lc,
            coalesce(jsonb_agg(jsonb_build_array(id, state, amount_nusd, amount_tokens,
                                                 amount_calls)), '[]') AS j
        FROM o
    ), moved AS (
        UPDATE fleet_budgets SET
            leased_nusd = leased_nusd - t.an, leased_tokens = leased_tokens - t.ak,
            leased_calls = leased_calls - t.ac,
            lapsed_nusd = lapsed_nusd - t.ln, lapsed_tokens = lapsed_tokens - t.lk,
            lapsed_calls = lapsed_calls - t.lc
        FROM t WHERE name = p_budget RETURNING 1
    )
    SELECT t.j INTO others FROM t;
    RETURN jsonb_build_object('folded', folded, 'others', others);
END $$;

-- Version 1's give-back (use since the last report), for a boundary of that version.
CREATE OR REPLACE FUNCTION fleet_give_back(
    p_budget text, p_lease bigint, rn bigint, rk bigint, rc bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE w record;
BEGIN
    IF least(rn, rk, rc) < 0 THEN
        RAISE EXCEPTION 'fleet_give_back: amounts must be >= 0' USING ERRCODE = '22023';
    END IF;
    PERFORM fleet_lock(p_budget);
    SELECT * INTO w FROM fleet_whole_use(p_budget, p_lease, rn, rk, rc);
    RETURN fleet_return_lease(p_budget, p_lease, w.un, w.uk, w.uc) -> 'folded';
END $$;

-- Version 1's exchange, kept for a boundary of that version during a rolling upgrade:
-- its report is use since its last one, made the lease's whole use here. (Its repeat
-- after a lost answer is counted again, as version 1 did; version 2 boundaries are not.)
CREATE OR REPLACE FUNCTION fleet_exchange(
    p_budget text, p_lease bigint, rn bigint, rk bigint, rc bigint,
    wn bigint, wk bigint, wc bigint, p_run text, p_host text, p_lease_s double precision)
RETURNS TABLE (lease bigint, gn bigint, gk bigint, gc bigint,
               cap_n bigint, cap_k bigint, cap_c bigint, lapsed boolean, folded jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE w record;
BEGIN
    IF least(rn, rk, rc) < 0 THEN
        RAISE EXCEPTION 'fleet_exchange: amounts must be >= 0, lease seconds > 0'
            USING ERRCODE = '22023';
    END IF;
    PERFORM fleet_lock(p_budget);
    SELECT * INTO w FROM fleet_whole_use(p_budget, p_lease, rn, rk, rc);
    RETURN QUERY SELECT e.lease, e.gn, e.gk, e.gc, e.cap_n, e.cap_k, e.cap_c, e.lapsed, e.folded
    FROM fleet_exchange(p_budget, p_lease, w.un, w.uk, w.uc, wn, wk, wc, p_run, p_host,
                        p_lease_s, NULL::text, NULL::bigint, NULL::text, 0, 0, 0) e;
END $$;

-- The run wrote its receipt: its end and the receipt file's sha256, once.
CREATE OR REPLACE FUNCTION fleet_run_ended(p_budget text, p_run text, p_sha text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF p_sha !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'fleet_run_ended: the receipt digest must be 64 hex digits'
            USING ERRCODE = '22023';
    END IF;
    UPDATE fleet_runs SET ended_at = now(), receipt_sha256 = p_sha
    WHERE budget = p_budget AND run_id = p_run AND ended_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fleet_run_ended: run % has no open record on budget %',
            quote_literal(p_run), quote_literal(p_budget) USING ERRCODE = 'DKF02';
    END IF;
END $$;

-- A dead run's lapsed leases, settled from what its ledger says it spent (sn, sk, sc:
-- every call it made, those open at its death at their worst case): the spend beyond
-- what it reported is charged, the rest of its lapsed leases is room again. Refused
-- for a run holding an active lease (it is alive), with nothing lapsed, or whose
-- ledger accounts for less than it reported (not its ledger, or rewritten).
CREATE OR REPLACE FUNCTION fleet_settle_dead(
    p_budget text, p_run text, sn bigint, sk bigint, sc bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE rep record; lap record;
BEGIN
    IF least(sn, sk, sc) < 0 THEN
        RAISE EXCEPTION 'fleet_settle_dead: amounts must be >= 0' USING ERRCODE = '22023';
    END IF;
    PERFORM fleet_lock(p_budget);
    PERFORM fleet_reclaim(p_budget);
    IF EXISTS (SELECT 1 FROM fleet_leases WHERE budget = p_budget AND run_id = p_run
               AND state = 'active') THEN
        RAISE EXCEPTION 'fleet settle: run % still holds an active lease on %', p_run, p_budget
            USING ERRCODE = 'DKF01';
    END IF;
    SELECT coalesce(sum(used_nusd), 0) AS n, coalesce(sum(used_tokens), 0) AS k,
           coalesce(sum(used_calls), 0) AS c INTO rep
    FROM fleet_leases WHERE budget = p_budget AND run_id = p_run;
    SELECT count(*) AS leases, coalesce(sum(amount_nusd), 0) AS n,
           coalesce(sum(amount_tokens), 0) AS k, coalesce(sum(amount_calls), 0) AS c INTO lap
    FROM fleet_leases WHERE budget = p_budget AND run_id = p_run AND state = 'lapsed';
    IF lap.leases = 0 THEN
        RAISE EXCEPTION 'fleet settle: run % has no lapsed lease on %', p_run, p_budget
            USING ERRCODE = 'DKF01';
    END IF;
    IF sn < rep.n OR sk < rep.k OR sc < rep.c THEN
        RAISE EXCEPTION 'fleet settle: the ledger accounts for less than run % reported '
            '(% nusd, % tokens, % calls < % nusd, % tokens, % calls): is it that run''s ledger?',
            p_run, sn, sk, sc, rep.n, rep.k, rep.c USING ERRCODE = 'DKF01';
    END IF;
    UPDATE fleet_leases SET state = 'returned'
    WHERE budget = p_budget AND run_id = p_run AND state = 'lapsed';
    UPDATE fleet_budgets SET
        spent_nusd = spent_nusd + (sn - rep.n), spent_tokens = spent_tokens + (sk - rep.k),
        spent_calls = spent_calls + (sc - rep.c),
        lapsed_nusd = lapsed_nusd - lap.n, lapsed_tokens = lapsed_tokens - lap.k,
        lapsed_calls = lapsed_calls - lap.c
    WHERE name = p_budget;
    UPDATE fleet_runs SET settled_at = now() WHERE budget = p_budget AND run_id = p_run;
    RETURN jsonb_build_object(
        'reported', jsonb_build_array(rep.n, rep.k, rep.c),
        'lapsed', jsonb_build_array(lap.n, lap.k, lap.c),
        'more', jsonb_build_array(sn - rep.n, sk - rep.k, sc - rep.c));
END $$;

-- Dead-run candidates on one host: runs with a lapsed lease, a folder and no active
-- lease (at most four, the least recently offered first, so a ledger that is refused
-- every time does not keep the others waiting), each with its latest pin.
CREATE OR REPLACE FUNCTION fleet_lapsed_here(p_budget text, p_host text)
RETURNS TABLE (run_id text, folder text, pin_seq bigint, pin_head text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    WITH c AS (
        SELECT DISTINCT ON (l.run_id) l.run_id AS r, l.folder AS f, l.pin_seq AS s,
               l.pin_head AS h
        FROM fleet_leases l
        WHERE l.budget = p_budget AND l.host = p_host AND l.state = 'lapsed'
          AND l.folder IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM fleet_leases a WHERE a.budget = p_budget
                          AND a.run_id = l.run_id AND a.state = 'active')
        ORDER BY l.run_id, l.id DESC
    ), picked AS (
        SELECT c.r, c.f, c.s, c.h FROM c
        LEFT JOIN fleet_runs x ON x.budget = p_budget AND x.run_id = c.r
        ORDER BY x.settle_tried_at NULLS FIRST, c.r LIMIT 4
    ), marked AS (
        UPDATE fleet_runs x SET settle_tried_at = now() FROM picked
        WHERE x.budget = p_budget AND x.run_id = picked.r RETURNING 1
    )
    SELECT picked.r, picked.f, picked.s, picked.h FROM picked;
END $$;

-- fleet_settle_closed was version 1's report on a closed lease (fleet_report now).
DROP FUNCTION IF EXISTS fleet_settle_closed(text, bigint, bigint, bigint, bigint);
REVOKE ALL ON FUNCTION fleet_lock(text), fleet_reclaim(text),
    fleet_report(text, bigint, bigint, bigint, bigint),
    fleet_whole_use(text, bigint, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION
    fleet_exchange(text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, text, double precision),
    fleet_exchange(text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, text,
                   double precision, text, bigint, text, bigint, bigint, bigint),
    fleet_give_back(text, bigint, bigint, bigint, bigint),
    fleet_return_lease(text, bigint, bigint, bigint, bigint),
    fleet_run_ended(text, text, text),
    fleet_settle_dead(text, text, bigint, bigint, bigint),
    fleet_lapsed_here(text, text) FROM PUBLIC;
"""
