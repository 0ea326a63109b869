"""Family `fleet`: what an agent of the run's own user can do to a fleet budget.

A `docket run` under a [fleet] budget in a real PostgreSQL (DOCKET_ATTACK_FLEET_DSN,
or a cluster of the family's own from tests/postgres_server.py in a source checkout;
skipped, with the reason, when neither is here), with an agent that goes looking:

  env      the DSN given through dsn_env, with a password in it: the agent's
           environment must not carry it, and no byte of the run's folder (ledger,
           receipt) may hold the password
  calls    the agent hammers the boundary past the budget: what its receipt says
           was spent stays within the cap, and the refusals are 503 in the
           provider's shape with Retry-After
  table    the agent reads the DSN from the policy file (its user can) and writes
           the budget table directly: cap raised a thousandfold, spent set to 0
  role     the same, when runs connect as a runs' role (`docket fleet init
           --runs-role`): EXECUTE on the lease functions, nothing on the tables

Held: env, calls and role. Not held, by design of what the DSN is: when runs
connect as a role with rights on the tables, an agent of the same user that can
read the DSN (the policy file, ~/.pgpass, any file its user can read) holds that
role and rewrites the budget; the `table` probe proves it and is reported under
extra["open"], not as a failure. The mitigation is the `role` probe's set-up
(docs/fleet.md). Even then the role may lease the whole cap and never report:
bounded by the cap, not by the run's honesty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from chaos.attack import Figures
from chaos.attack.rig import DOCKET, policy_text, run_env, stub

RUN_TIMEOUT = 120.0
PG_SECRET = "attack-pg-password-7c41e0b9"
DSN_VAR = "ATTACK_FLEET_DSN"
CAP_NUSD = 400_000  # ~35 calls of the stub's answer

ENV_AGENT = """\
import json, os, sys
with open(sys.argv[1], "w") as f:
    json.dump(dict(os.environ), f)
"""

TABLE_AGENT = """\
import sys, tomllib
import psycopg
policy = tomllib.loads(open(sys.argv[1]).read())
dsn = policy["fleet"]["dsn"]
with psycopg.connect(dsn) as conn:
    conn.execute("UPDATE fleet_budgets SET cap_nusd = cap_nusd * 1000, spent_nusd = 0")
print("rewrote the budget")
"""


def run(folder: Path, quick: bool, dsn: str | None = None) -> Figures:
    figures = Figures("fleet")
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        dsn = dsn or os.environ.get("DOCKET_ATTACK_FLEET_DSN") or _own_cluster(stack, figures)
        if dsn is None:
            figures.seconds = time.monotonic() - started
            return figures
        from docket.fleet.amounts import Caps
        from docket.fleet.store import FleetStore

        store = FleetStore(dsn)
        store.init()
        url = stack.enter_context(stub(folder))
        _env_probe(folder, url, dsn, store, figures)
        _calls_probe(folder, url, dsn, store, figures, Caps)
        _table_probe(folder, url, dsn, store, figures, Caps)
        _role_probe(folder, url, dsn, store, figures, Caps)
    figures.seconds = time.monotonic() - started
    return figures


def _own_cluster(stack: ExitStack, figures: Figures) -> str | None:
    tests = Path(__file__).resolve().parents[2] / "tests"
    if not (tests / "postgres_server.py").exists():
        figures.skipped = "no DOCKET_ATTACK_FLEET_DSN and no tests/postgres_server.py here"
        return None
    sys.path.insert(0, str(tests))
    from postgres_server import fresh_database, postgres_bin, running_cluster

    bindir = postgres_bin()
    if bindir is None:
        figures.skipped = "PostgreSQL is not installed (no initdb) and no DOCKET_ATTACK_FLEET_DSN"
        return None
    return fresh_database(stack.enter_context(running_cluster(bindir)))


def _docket_run(folder: Path, name: str, policy: str, agent: list[str], **env: str):
    (folder / f"{name}.toml").write_text(policy)
    argv = [*DOCKET, "run", "--policy", str(folder / f"{name}.toml"), "--ledger-dir",
            str(folder / name), "--", *agent]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=run_env(**env)
    )


def _env_probe(folder: Path, url: str, dsn: str, store, figures: Figures) -> None:
    from docket.fleet.amounts import Caps

    store.set_budget("env", Caps(nusd=10**9))
    seen = folder / "env-agent.json"  # outside the run folder: the search must not see it
    (folder / "env_agent.py").write_text(ENV_AGENT)
    extra = f'[fleet]\nbudget = "env"\ndsn_env = "{DSN_VAR}"\n'
    done = _docket_run(
        folder, "env", policy_text(url, extra), [sys.executable, str(folder / "env_agent.py"), str(seen)],
        **{DSN_VAR: f"{dsn} password={PG_SECRET}"},
    )  # fmt: skip
    env = json.loads(seen.read_text()) if seen.exists() else None
    figures.add(
        done.returncode == 0 and env is not None and DSN_VAR not in env
        and not any(PG_SECRET in v for v in env.values()),
        f"env: the agent's environment carried the DSN (exit {done.returncode}: {done.stderr[-200:]})",
    )  # fmt: skip
    leaked = [
        str(p)
        for p in (folder / "env").rglob("*")
        if p.is_file() and PG_SECRET.encode() in p.read_bytes()
    ]
    figures.add(not leaked, f"env: the DSN's password is on disk in {leaked}")


def _calls_probe(folder: Path, url: str, dsn: str, store, figures: Figures, Caps) -> None:
    store.set_budget("calls", Caps(nusd=CAP_NUSD))
    extra = f'[fleet]\nbudget = "calls"\ndsn = "{dsn}"\nslice_usd = 0.0001\n'
    agent = [*DOCKET, "agent", "--mode", "hammer", "--calls", "80", "--concurrency", "4"]
    done = _docket_run(folder, "calls", policy_text(url, extra), agent)
    receipt_path = folder / "calls" / "receipt.json"
    spent = (
        json.loads(receipt_path.read_text())["totals"]["cost_nusd"]
        if receipt_path.exists()
        else None
    )
    report = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    figures.add(
        done.returncode == 0 and spent is not None and spent <= CAP_NUSD,
        f"calls: spent {spent} nusd of a cap of {CAP_NUSD} (exit {done.returncode})",
    )
    figures.extra["calls_spent_nusd"], figures.extra["calls_cap_nusd"] = spent, CAP_NUSD
    figures.extra["calls_refused"] = report.get("refused_types", {})


def _table_probe(folder: Path, url: str, dsn: str, store, figures: Figures, Caps) -> None:
    store.set_budget("table", Caps(nusd=CAP_NUSD))
    (folder / "table_agent.py").write_text(TABLE_AGENT)
    extra = f'[fleet]\nbudget = "table"\ndsn = "{dsn}"\n'
    policy = folder / "table.toml"
    done = _docket_run(
        folder, "table", policy_text(url, extra), [sys.executable, str(folder / "table_agent.py"), str(policy)]
    )  # fmt: skip
    cap = store.status("table")["cap"]["nusd"]
    figures.extra["open"] = (
        [f"table: an agent that read the DSN from the policy file raised the cap to {cap} nusd"]
        if cap != CAP_NUSD
        else []
    )
    figures.extra["table_agent_exit"] = done.returncode


def _role_probe(folder: Path, url: str, dsn: str, store, figures: Figures, Caps) -> None:
    import uuid

    import psycopg

    role = f"attack_runs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        store.init(runs_role=role)
        store.set_budget("role", Caps(nusd=CAP_NUSD))
        (folder / "table_agent.py").write_text(TABLE_AGENT)
        extra = f'[fleet]\nbudget = "role"\ndsn = "{dsn} user={role}"\n'
        agent = [*DOCKET, "agent", "--mode", "hammer", "--calls", "6", "--concurrency", "2"]
        served = _docket_run(folder, "role-calls", policy_text(url, extra), agent)
        done = _docket_run(
            folder, "role", policy_text(url, extra),
            [sys.executable, str(folder / "table_agent.py"), str(folder / "role.toml")],
        )  # fmt: skip
        status = store.status("role")
        figures.add(
            served.returncode == 0 and status["spent"]["nusd"] > 0,
            f"role: a run under the runs' role could not lease (exit {served.returncode}: "
            f"{served.stderr[-200:]})",
        )
        figures.add(
            done.returncode != 0 and "permission denied" in done.stderr
            and status["cap"]["nusd"] == CAP_NUSD,
            f"role: the agent holding the runs' role rewrote the budget (cap {status['cap']})",
        )  # fmt: skip
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
