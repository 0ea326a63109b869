"""Family `fleet`: what an agent of the run's own user can do to a fleet budget.

A `docket run` under a [fleet] budget in a real PostgreSQL (DOCKET_ATTACK_FLEET_DSN,
or a cluster of the family's own, started by chaos/fleet/postgres.py where PostgreSQL's
binaries are installed; skipped, with the reason, when neither is here), with an agent that goes looking:

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
  ledger   a run under [fleet] is SIGKILLed and its lease lapses; before a live
           boundary on its host reads its ledger to settle the slice, the agent
           rewrites that ledger to lower its charge: (pin) a closed call's cost
           lowered and the whole chain rebuilt so it holds; (tail) the events after
           the run's last exchange cut off (its calls in flight at its death)

Held: env, calls, role and ledger's pin (a ledger rewritten before the position the
run reported at its last exchange is refused, and the slice stays lapsed). Not
held: ledger's tail: what the run wrote after its last exchange is in no pin, so a
rewrite there lowers the charge; bounded by the lease the run held (one slice, or
the one call larger than a slice), reported under extra["open"] with its figures. Not held, by design of what the DSN is: when runs
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
from chaos.fleet.postgres import fresh_database, postgres_bin, running_cluster

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
        if not quick:  # a run killed and its lease left to lapse: ~8 s (the suite's
            # own check of the pin is tests/test_fleet_settle.py)
            _ledger_probe(folder, url, dsn, store, figures, Caps)
    figures.seconds = time.monotonic() - started
    return figures


def _own_cluster(stack: ExitStack, figures: Figures) -> str | None:
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


def _ledger_probe(folder: Path, url: str, dsn: str, store, figures: Figures, Caps) -> None:
    import signal
    import socket

    from docket.fleet.dead import Refuse, Settle, decide, read_facts
    from docket.fleet.store import DeadCandidate
    from docket.pricing import default_price_table

    store.set_budget("ledger", Caps(nusd=CAP_NUSD))
    extra = (
        f'[fleet]\nbudget = "ledger"\ndsn = "{dsn}"\nslice_usd = 0.0002\n'
        "lease_seconds = 2\ntimeout = 0.5\n"
    )
    (folder / "ledger.toml").write_text(policy_text(url, extra))
    run_dir = folder / "ledger"
    agent = [*DOCKET, "agent", "--mode", "hammer", "--calls", "10000", "--concurrency", "2"]
    argv = [*DOCKET, "run", "--policy", str(folder / "ledger.toml"), "--ledger-dir",
            str(run_dir), "--", *agent]  # fmt: skip
    victim = subprocess.Popen(
        argv, env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    ledger = run_dir / "ledger.jsonl"
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not ledger.exists() or ledger.read_bytes().count(b'"model.response"') < 3:
            if time.monotonic() > deadline or victim.poll() is not None:
                figures.add(False, f"ledger: the victim run never spent (exit {victim.poll()})")
                return
            time.sleep(0.02)
        while not _exchanged_after_a_call(ledger.read_bytes()):
            if time.monotonic() > deadline or victim.poll() is not None:
                figures.add(False, f"ledger: the victim never renewed (exit {victim.poll()})")
                return
            time.sleep(0.05)
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(30)
    lapse_by = time.monotonic() + RUN_TIMEOUT
    while store.status("ledger")["lapsed"]["nusd"] == 0:  # its lease lapses (server time)
        if time.monotonic() > lapse_by:
            figures.add(False, "ledger: the killed run's lease never lapsed at the budget")
            return
        time.sleep(0.1)
    prices = default_price_table()
    host = socket.gethostname()

    def live_boundary_reads() -> tuple[DeadCandidate, Settle | Refuse]:
        (dead,) = [
            c for c in store.lapsed_here("ledger", host) if c.folder == str(run_dir.resolve())
        ]
        facts = read_facts(
            dead.folder, dead.pin and dead.pin[0], prices, deadline=time.monotonic() + 5
        )
        return dead, decide(dead.run_id, "ledger", dead.pin, facts)

    original = ledger.read_bytes()
    dead, honest = live_boundary_reads()
    if not isinstance(honest, Settle):
        figures.add(False, f"ledger: the dead run's own ledger, untouched, was refused: {honest}")
        return
    ledger.write_bytes(_forge_first_cost(original))  # pin: rewritten before the pin
    _, got = live_boundary_reads()
    figures.add(
        isinstance(got, Refuse) and "rewritten" in got.reason,
        f"ledger: a chain rebuilt with a lowered cost was not refused ({got})",
    )
    assert dead.pin is not None
    kept = original.split(b"\n")[: dead.pin[0]]  # tail: cut after the last exchange
    ledger.write_bytes(b"\n".join(kept) + b"\n")
    _, cut = live_boundary_reads()
    if isinstance(cut, Settle):
        done = store.settle_dead("ledger", dead.run_id, cut.spent)
        lowered = honest.spent.nusd - cut.spent.nusd
        figures.extra["ledger_tail"] = {
            "honest_charge_nusd": honest.spent.nusd,
            "charged_after_cut_nusd": cut.spent.nusd,
            "given_back_nusd": done.given_back.nusd,
        }
        if lowered > 0:
            figures.extra.setdefault("open", []).append(
                f"ledger: events after the dead run's last exchange cut from its ledger "
                f"lowered its charge by {lowered} nusd (bounded by its lapsed lease, "
                f"{done.lapsed.nusd} nusd)"
            )


def _exchanged_after_a_call(data: bytes) -> bool:
    """Two fleet.lease events after the first model.response: the second exchange
    was sent after the first was recorded, so its pin covers that call."""
    types = [json.loads(raw).get("type") for raw in data.split(b"\n")[:-1]]
    if "model.response" not in types:
        return False
    return types[types.index("model.response") :].count("fleet.lease") >= 2


def _forge_first_cost(data: bytes) -> bytes:
    """The ledger with its first model.response charged 0, the chain rebuilt so every
    line's prev is the hash of the line before it (what a same-user agent can do)."""
    from docket.ledger.chain import GENESIS, encode_body, encode_line, line_hash

    out, prev, done = [], GENESIS, False
    for raw in data.split(b"\n"):
        if not raw:
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            break  # a torn last line
        if event["type"] == "model.response" and not done:
            event["cost_nusd"], done = 0, True
        common = {k: event.pop(k) for k in ("v", "seq", "ts", "mono_ms", "type", "prev")}
        line = encode_line(
            seq=common["seq"], ts=common["ts"], mono_ms=common["mono_ms"], type=common["type"],
            prev=prev, body=encode_body(event),
        )  # fmt: skip
        out.append(line)
        prev = line_hash(line)
    return b"\n".join(out) + b"\n"
