"""`docket fleet`: create the schema, set a budget's caps, show where a budget stands.

The database is named by --dsn (no password: use ~/.pgpass), by --dsn-env (the
variable holding the DSN; default DOCKET_FLEET_DSN), or by a policy's [fleet]
table (--policy). Bad input is one line and exit 2; a database that cannot be
reached is one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from docket.errors import InputError
from docket.fleet.amounts import Caps
from docket.fleet.settle import LedgerSpend
from docket.fleet.store import DIMS, FleetStore
from docket.policy import _BUDGET_NAME, _DSN_PASSWORD, load_policy
from docket.pricing import format_nusd
from docket.values import ValueProblem, nano_usd, parse_usd

DEFAULT_DSN_ENV = "DOCKET_FLEET_DSN"
_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}\Z")


def fleet_command(args: argparse.Namespace) -> int:
    if args.action is None:
        raise InputError(
            "fleet: name an action: init, budget set NAME --max-usd X, status NAME, runs NAME, "
            "settle NAME --ledger RUN"
        )
    store = FleetStore(_dsn(args))
    if args.action == "init":
        role = args.runs_role
        if role is not None and not _ROLE.match(role):
            raise InputError(f"fleet init --runs-role: {role!r} is not a role name")
        version = store.init(role)
        granted = f"; role {role} may only lease, report and give back" if role else ""
        print(f"fleet schema version {version} is in place{granted}")
        return 0
    if args.action == "budget":
        if args.budget_action != "set":
            raise InputError("fleet budget: the action is `set NAME --max-usd X`")
        name = _name(args.name)
        caps = Caps(
            _usd(args.max_usd),
            _count("--max-tokens", args.max_tokens),
            _count("--max-calls", args.max_calls),
        )
        store.set_budget(name, caps)
        print(f"fleet budget {name}: max_usd {format_nusd(caps.nusd or 0)}")
        return 0
    if args.action == "settle":
        return _settle(store, _name(args.name), args.ledger)
    if args.action == "runs":
        return _runs(store, _name(args.name), args.limit, args.json)
    status = store.status(_name(args.name))
    if args.json:
        json.dump(status, sys.stdout, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(_text(status))
    return 0


def _settle(store: FleetStore, budget: str, ledger: str) -> int:
    from docket.pricing import default_price_table
    from docket.reading.source import ledger_path, read_events

    path = ledger_path(ledger)
    fold = LedgerSpend(default_price_table())
    try:
        for event in read_events(path):
            fold.feed(event)
    except InputError as exc:
        # A run killed mid-write leaves a torn last line: a model.request that never
        # finished was never forwarded (it is written before the call goes out).
        if ": torn tail:" not in str(exc):
            raise
    if fold.run_id is None:
        raise InputError(f"fleet settle: {path} has no session.start: not a run's ledger")
    done = store.settle_dead(budget, fold.run_id, fold.total())
    print(
        f"fleet budget {budget}: run {fold.run_id} spent {format_nusd(done.spent.nusd)} "
        f"by its ledger ({format_nusd(done.more.nusd)} more than it reported); its lapsed "
        f"leases gave {format_nusd(done.given_back.nusd)} back"
    )
    return 0


def _runs(store: FleetStore, budget: str, limit: int, as_json: bool) -> int:
    if limit < 1:
        raise InputError(f"fleet runs --limit: must be at least 1, got {limit}")
    runs = store.runs(budget, limit)
    if as_json:
        json.dump({"budget": budget, "runs": runs}, sys.stdout, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    if not runs:
        print(f"budget {budget}: no runs yet")
    for r in runs:
        print(
            f"{r['run_id']}  {r['state']:<7}  host {r['host']}  started {r['started']}  "
            f"ended {r['ended'] or '-'}  spent {format_nusd(r['spent']['nusd'])}  "
            f"held {format_nusd(r['held_nusd'])}  lapsed {format_nusd(r['lapsed_nusd'])}  "
            f"receipt {r['receipt']}"
        )
    return 0


def _dsn(args: argparse.Namespace) -> str:
    if args.dsn is not None:
        if _DSN_PASSWORD.search(args.dsn):
            raise InputError("fleet --dsn: must not hold a password (use --dsn-env or ~/.pgpass)")
        return args.dsn
    var = args.dsn_env or DEFAULT_DSN_ENV
    if args.policy is not None:
        fleet = load_policy(args.policy).fleet
        if not fleet.enabled:
            raise InputError(f"fleet --policy {args.policy}: it has no [fleet] table")
        if fleet.dsn is not None:
            return fleet.dsn
        assert fleet.dsn_env is not None
        var = fleet.dsn_env
    dsn = os.environ.get(var, "")
    if not dsn.strip():
        raise InputError(
            f"fleet: the variable {var} is not set (give --dsn, --dsn-env or --policy)"
        )
    return dsn


def _name(name: str) -> str:
    if not _BUDGET_NAME.match(name):
        raise InputError(f"fleet: budget name {name!r} must be letters, digits, _ . - (64 at most)")
    return name


def _usd(text: str) -> int:
    try:
        number = float(text)
    except ValueError:
        raise InputError(f"fleet budget set --max-usd: not a number, got {text!r}") from None
    try:
        return nano_usd(parse_usd(number))
    except ValueProblem as exc:
        raise InputError(f"fleet budget set --max-usd: {exc.reason}") from None


def _count(flag: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise InputError(f"fleet budget set {flag}: must be at least 1, got {value}")
    return value


def _text(s: dict[str, Any]) -> str:
    def usd(part: str) -> str:
        v = s[part]["nusd"]
        return "none" if v is None else format_nusd(v)

    lines = [
        f"budget {s['budget']}: cap {usd('cap')}, spent {usd('spent')}, leased {usd('leased')}, "
        f"lapsed {usd('lapsed')}",
    ]
    for dim in DIMS[1:]:
        if s["cap"][dim] is not None:
            lines.append(
                f"  {dim}: cap {s['cap'][dim]}, spent {s['spent'][dim]}, "
                f"leased {s['leased'][dim]}, lapsed {s['lapsed'][dim]}"
            )
    for host in s["hosts"]:
        lines.append(
            f"  host {host['host']}: {host['runs']} runs, {host['active_leases']} active "
            f"leases holding {format_nusd(host['held_nusd'])}, used "
            f"{format_nusd(host['used_nusd'])}, lapsed {format_nusd(host['lapsed_nusd'])}"
        )
    if not s["leases"]:
        lines.append("  no active leases")
    for lease in s["leases"]:
        mark = "  EXPIRING (last quarter of its lease)" if lease["expiring"] else ""
        lines.append(
            f"  lease {lease['lease']}: run {lease['run_id']} on {lease['host']}, holds "
            f"{format_nusd(lease['held']['nusd'])}, used {format_nusd(lease['used']['nusd'])}, "
            f"expires in {lease['expires_in_s']:.1f} s{mark}"
        )
    return "\n".join(lines)
