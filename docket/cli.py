"""The `docket` command: an argparse front with one small function per verb.

Each verb imports its machinery when it runs (the `# per verb` imports below): all of
it together took 353 ms to import on the 2-core machine, `docket.cli` alone 13-23 ms
and `docket verify`'s 28-31 ms (python -X importtime), so `docket --help` and
`docket verify` stay quick, and the recorder never loads the chaos harness unless a
chaos verb is asked for.
Every failure is one line on stderr; exit codes are documented in --help.
"""

from __future__ import annotations

import argparse
import os
import sys

from docket import __version__
from docket.cli_help import AGENT_MODES, EXIT_CODES, GAMEDAY_PHASES, document
from docket.errors import EXIT_USAGE, DocketError, InputError, one_line
from docket.inputs import integer_arg, seconds_arg
from docket.reading.run_paths import run_ledger, run_receipt, verify_pair
from docket.replay.options import ON_MISS as REPLAY_ON_MISS

RUN = "a run's folder, its ledger.jsonl or its receipt.json"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other error."""

    def error(self, message: str):  # noqa: D401 - argparse's signature
        raise DocketError(f"{message} (see {self.prog} --help)")


def cmd_verify(args: argparse.Namespace) -> int:
    if args.attestation or args.pubkey:
        from docket.attest.cli import attested_verify  # per verb

        return attested_verify(args)
    if args.json:
        from docket.receipts.verify import RECEIPT_UNREADABLE, VerifyInputError  # per verb
        from docket.receipts.verify_report import (  # per verb
            dumps,
            input_error_report,
            verify_json_command,
        )

        try:
            receipt, ledger = verify_pair(args.receipt, args.ledger)
        except InputError as exc:  # --json promises an object, input errors included
            report = input_error_report(VerifyInputError(RECEIPT_UNREADABLE, str(exc)))
            print(dumps(report))
            return int(report["exit"])
        return verify_json_command(receipt, ledger)
    from docket.receipts.verify import verify_command  # per verb

    return verify_command(*verify_pair(args.receipt, args.ledger))


def cmd_doctor(args: argparse.Namespace) -> int:
    from docket.ledger.doctor import doctor_command  # per verb

    ledger = str(run_ledger(args.ledger))
    return doctor_command(ledger, quarantine=args.quarantine_torn_tail, as_json=args.json)


def cmd_demo(args: argparse.Namespace) -> int:
    from docket.demo import demo_command  # per verb

    return demo_command(args.dir)


def cmd_selftest(args: argparse.Namespace) -> int:
    from docket.selftest.command import selftest_command  # per verb

    return selftest_command(args.only, as_json=args.json)


def cmd_run(args: argparse.Namespace) -> int:
    from docket.run.supervisor import run_command  # per verb

    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    return run_command(args)


def cmd_fleet(args: argparse.Namespace) -> int:
    from docket.fleet.command import fleet_command  # per verb

    return fleet_command(args)


def cmd_restore(args: argparse.Namespace) -> int:
    from docket.snapshot.command import restore_command  # per verb

    if args.diff:
        from docket.snapshot.diff import restore_diff_command  # per verb

        if args.apply:
            raise InputError("restore: --diff shows what --apply would change: give one")
        return restore_diff_command(args.run_dir, only=args.only, force=args.force)
    return restore_command(args.run_dir, apply=args.apply, only=args.only, force=args.force)


def cmd_prune(args: argparse.Namespace) -> int:
    from docket.snapshot.prune import prune_command  # per verb
    from docket.values import ValueProblem, duration_text, parse_size  # per verb

    try:
        older = None if args.older_than is None else duration_text(args.older_than).seconds
    except ValueProblem as exc:
        raise InputError(f"prune: --older-than {args.older_than!r}: {exc.reason}") from None
    try:
        size = None if args.max_size is None else parse_size(args.max_size)
    except ValueProblem as exc:
        raise InputError(f"prune: --max-size {args.max_size!r}: {exc.reason}") from None
    return prune_command(
        args.store, older_than=older, max_size=size, runs=args.runs or [], apply=args.apply
    )


def cmd_init(args: argparse.Namespace) -> int:
    from docket.policy import init_command  # per verb

    return init_command(args.path, force=args.force)


def cmd_prices(args: argparse.Namespace) -> int:
    from docket.pricing import prices_command  # per verb

    if args.policy is not None:
        from docket.policy import load_policy  # per verb

        return prices_command(args, table=load_policy(args.policy).price_table())
    return prices_command(args)


def cmd_stub(args: argparse.Namespace) -> int:
    from chaos.stub.cli import stub_command  # the harness, loaded only for this verb

    return stub_command(args)


def cmd_chaos(args: argparse.Namespace) -> int:
    from chaos.cli import chaos_command  # the harness, loaded only for this verb

    return chaos_command(args)


def cmd_agent(args: argparse.Namespace) -> int:
    from docket.agent.command import agent_command  # per verb
    from docket.agent.config import FLAGS  # per verb

    return agent_command(
        {env: getattr(args, flag[2:].replace("-", "_")) for env, flag in FLAGS.items()}
    )


def cmd_game_day(args: argparse.Namespace) -> int:
    from chaos.gameday.runner import game_day_command  # the harness, loaded only for this verb

    return game_day_command(args)


def cmd_explain(args: argparse.Namespace) -> int:
    from docket.reading.explain import explain_command  # per verb

    return explain_command(str(run_ledger(args.run)), policy=args.policy, as_json=args.json)


def cmd_diff(args: argparse.Namespace) -> int:
    from docket.reading.diff import diff_command  # per verb

    a, b = run_receipt(args.receipt_a), run_receipt(args.receipt_b)
    return diff_command(str(a), str(b), as_json=args.json)


def cmd_show(args: argparse.Namespace) -> int:
    from docket.reading.show import Filter, check_types, parse_seq_range, show_command  # per verb

    check_types(tuple(args.type or ()))
    first, last = parse_seq_range(args.seq) if args.seq else (None, None)
    flt = Filter(tuple(args.type or ()), tuple(args.provider or ()), first, last, args.errors)
    return show_command(str(run_ledger(args.ledger)), flt, as_json=args.json, follow=args.follow)


def cmd_ls(args: argparse.Namespace) -> int:
    from docket.reading.runs_list import ls_command  # per verb

    return ls_command(args.dir, as_json=args.json)


def cmd_export(args: argparse.Namespace) -> int:
    from docket.export.otel_command import export_otel_command  # per verb

    return export_otel_command(
        str(run_ledger(args.run)),
        args.endpoint,
        args.header or [],
        args.timeout,
        args.policy,
        not args.no_metrics,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="docket",
        description="A flight recorder and chaos harness for AI agent runs.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"docket {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    p = verbs.add_parser("verify", help="re-derive a receipt's claims from its ledger")
    p.add_argument("receipt", help=f"the receipt to check: {RUN}")
    p.add_argument("--ledger", help="the ledger to check it against (default: the one it names)")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object on stdout, input errors included (spec/docket-receipt-1.md 10)",
    )
    p.set_defaults(func=cmd_verify)
    from docket.attest.cli import add_attest_verbs, add_verify_flags  # argparse only

    add_verify_flags(p)
    add_attest_verbs(verbs)

    p = verbs.add_parser("doctor", help="classify a ledger: clean, torn tail, corrupt, locked")
    p.add_argument("ledger", help=f"the ledger to classify: {RUN}")
    p.add_argument(
        "--quarantine-torn-tail",
        action="store_true",
        help="move a torn tail to a sidecar and write the readable prefix beside the original",
    )
    p.add_argument("--json", action="store_true", help="print the diagnosis as one JSON object")
    p.set_defaults(func=cmd_doctor)

    p = verbs.add_parser(
        "demo", help="a capped agent run against a stub, then verify, tamper and doctor"
    )
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    p.set_defaults(func=cmd_demo)

    p = verbs.add_parser(
        "selftest",
        help="prove offline, in seconds, that the recorder and its guards work on this machine",
    )
    p.add_argument("--json", action="store_true", help="the results as one JSON object")
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this check or group (calls, guards, caps, evidence); repeat for several",
    )
    p.set_defaults(func=cmd_selftest)

    p = verbs.add_parser("run", help="supervise an agent: boundary, ledger, caps, receipt")
    p.add_argument("--policy", default=None, help="docket.toml (default: built-in defaults)")
    p.add_argument("--ledger-dir", default=None, help="where the ledger and receipt go")
    p.add_argument(
        "--max-wall-clock",
        type=seconds_arg,
        default=None,
        metavar="DURATION",
        help="stop the run after this long: seconds (90), or with a unit (500ms, 30s, 10m, 1h)",
    )
    p.add_argument(
        "--grace",
        type=seconds_arg,
        default=None,
        metavar="DURATION",
        help="between SIGTERM and SIGKILL when the child is stopped: seconds or 500ms, 10s, ... "
        "(default 5)",
    )
    p.add_argument(
        "--budget-mode",
        choices=["usd", "quota"],
        default=None,
        help="quota: a subscription with no per-token bill (tokens, calls and time still capped)",
    )
    p.add_argument(
        "--snapshot",
        action="append",
        nargs="?",
        const=".",
        metavar="PATH",
        help="copy a tree before the run and record what it changed: --snapshot alone is the "
        "working directory, --snapshot=PATH another (repeat for more)",
    )
    p.add_argument(
        "--rollback-on-breach",
        action="store_true",
        help="when a cap stops the run (exit 42), restore what it changed before the receipt",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no start line or summary: only warnings and the last line (the receipt's path)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p.set_defaults(func=cmd_run)

    p = verbs.add_parser("restore", help="undo what a --snapshot run changed (dry run by default)")
    p.add_argument("run_dir", help="the run's folder (its ledger, receipt and snapshots/)")
    p.add_argument(
        "--apply", action="store_true", help="make the changes (default: print the plan)"
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="PATH",
        help="only this path (relative to its root); repeat",
    )
    p.add_argument(
        "--force", action="store_true", help="also overwrite what changed after the run ended"
    )
    p.add_argument(
        "--diff",
        action="store_true",
        help="show what a restore would change: a unified diff per text file, sizes and "
        "sha256 for a binary one or one over 1 MiB (writes nothing)",
    )
    p.set_defaults(func=cmd_restore)

    p = verbs.add_parser(
        "prune", help="free snapshot-store objects no kept run references (dry run by default)"
    )
    p.add_argument("store", nargs="?", help="default docket-runs/.docket-snapshot-store")
    p.add_argument("--older-than", metavar="DURATION", help="only objects stored before (24h)")
    p.add_argument("--max-size", metavar="SIZE", help="oldest first until it fits (10GiB)")
    p.add_argument("--runs", action="append", metavar="DIR", help="more run folders; repeat")
    p.add_argument("--apply", action="store_true", help="remove (default: list what would go)")
    p.set_defaults(func=cmd_prune)

    p = verbs.add_parser(
        "fleet",
        help="a budget shared by many runs in PostgreSQL: init, budget set, status, runs, settle",
    )
    _fleet_arguments(p)
    p.set_defaults(func=cmd_fleet)

    p = verbs.add_parser("init", help="write a commented docket.toml covering every policy key")
    p.add_argument("path", nargs="?", default="docket.toml")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_init)

    p = verbs.add_parser("prices", help="print the price table, its date and provenance")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help="the table a run under this docket.toml uses: its [prices] over the shipped one",
    )
    p.set_defaults(func=cmd_prices)

    p = verbs.add_parser("stub", help="run a stub model provider (OpenAI- or Anthropic-shaped)")
    p.add_argument(
        "--kind",
        choices=["openai", "anthropic"],
        default="openai",
        help="the API shape: openai (chat.completions, /v1/models) or anthropic (messages); "
        "default openai",
    )
    p.add_argument("--port", type=integer_arg, default=0, help="0 picks a free port (printed)")
    p.add_argument("--latency", default="0ms", help="delay before the first byte, e.g. 50ms")
    p.add_argument("--token-delay", default="0ms", help="delay between streamed tokens")
    p.add_argument("--log", default=None, help="append every request received to this JSONL file")
    p.set_defaults(func=cmd_stub)

    p = verbs.add_parser(
        "chaos", help="one supervised run under seeded faults against stub providers"
    )
    p.add_argument(
        "--seed", type=integer_arg, default=None, help="the schedule's seed (default: drawn)"
    )
    p.add_argument("--scenario", default=None, metavar="FILE", help="a scenario (YAML)")
    p.add_argument(
        "--fault", action="append", metavar="SPEC", help="a fault (spec/fault-grammar.md); repeat"
    )
    p.add_argument(
        "--agent",
        default=None,
        metavar="MODE",
        help=f"run the reference agent in this mode: {' | '.join(AGENT_MODES)}",
    )
    p.add_argument("--toxiproxy", default=None, metavar="URL", help="a real Toxiproxy's API")
    p.add_argument(
        "--replay",
        default=None,
        metavar="RUN",
        help="put the upstream faults on a recorded run's answers (docket replay; -- CMD)",
    )
    p.add_argument("--policy", default=None, help="with --replay: the recording's docket.toml")
    p.add_argument(
        "--on-miss", choices=REPLAY_ON_MISS, default=None, help="with --replay: as docket replay's"
    )
    _host_flags(p)
    p.add_argument("--dir", default=None, help="the run's folder (default: under ./docket-runs/)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... (your own agent)")
    p.set_defaults(func=cmd_chaos)

    p = verbs.add_parser(
        "agent",
        help="the reference agent: drive a boundary (settings from the environment; flags override)",
    )
    p.add_argument("--mode", help=f"{' | '.join(AGENT_MODES)} (DOCKET_AGENT_MODE)")
    p.add_argument("--provider", help="openai | anthropic (DOCKET_AGENT_PROVIDER)")
    p.add_argument("--base-url", help="instead of OPENAI_BASE_URL / ANTHROPIC_BASE_URL")
    p.add_argument("--calls", help="calls for loop, hammer, backoff, repeat (DOCKET_AGENT_CALLS)")
    p.add_argument("--concurrency", help="hammer's workers (DOCKET_AGENT_CONCURRENCY)")
    p.add_argument("--model", help="DOCKET_AGENT_MODEL")
    p.add_argument("--max-tokens", help="DOCKET_AGENT_MAX_TOKENS")
    p.add_argument("--timeout", help="seconds per call (DOCKET_AGENT_TIMEOUT)")
    p.add_argument("--seed", help="the jitter's seed (DOCKET_AGENT_SEED)")
    p.add_argument(
        "--temperature", help="0 to 2, sent in every call; unset: none (DOCKET_AGENT_TEMPERATURE)"
    )
    p.add_argument("--backoff-base", help="seconds (DOCKET_AGENT_BACKOFF_BASE)")
    p.add_argument("--backoff-cap", help="seconds (DOCKET_AGENT_BACKOFF_CAP)")
    p.add_argument(
        "--max-attempts", help="per call, the first included (DOCKET_AGENT_MAX_ATTEMPTS)"
    )
    p.add_argument(
        "--max-retry-after", help="longest Retry-After honoured (DOCKET_AGENT_MAX_RETRY_AFTER)"
    )
    p.add_argument(
        "--deadline", help="seconds per call, all its attempts and waits (DOCKET_AGENT_DEADLINE)"
    )
    p.add_argument(
        "--retry-ratio", help="retries per first attempt, e.g. 0.1 (DOCKET_AGENT_RETRY_RATIO)"
    )
    p.add_argument("--retry-floor", help="retries a run may always take (DOCKET_AGENT_RETRY_FLOOR)")
    p.set_defaults(func=cmd_agent)

    p = verbs.add_parser(
        "game-day",
        help="run the game-day phases (gamedays/*.yaml), judge each from its evidence, report",
    )
    p.add_argument(
        "--phase",
        action="append",
        metavar="NAME",
        help="run only this phase (a name, or a phase file's path); repeat for several. "
        f"Phases: {', '.join(GAMEDAY_PHASES)}",
    )
    p.add_argument("--seed", type=integer_arg, default=None, help="every phase with this seed")
    p.add_argument("--toxiproxy", default=None, metavar="URL", help="a real Toxiproxy's API")
    _host_flags(p)
    p.add_argument(
        "--report",
        default="gameday-report",
        metavar="DIR",
        help="where the HTML report (and JSON, JUnit) go (default ./gameday-report/)",
    )
    p.add_argument("--junit", default=None, metavar="FILE", help="JUnit XML here instead")
    p.add_argument(
        "--attest", default=None, metavar="KEY", help="sign the report folder (docket attest)"
    )
    p.add_argument("--json", default=None, metavar="FILE", help="the results as JSON here instead")
    p.add_argument(
        "--journal",
        default=None,
        metavar="DIR",
        help="a Chaos Toolkit journal per phase in DIR/PHASE.journal.json (docs/gamedays.md)",
    )
    p.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="keep each phase's evidence (ledger, receipt, stub logs, metrics) in DIR/PHASE "
        "(default: REPORT/evidence)",
    )
    p.add_argument(
        "--agent-command",
        default=None,
        metavar="CMD",
        help="your own agent, in the place each phase names for it (or: -- CMD ARGS)",
    )
    p.add_argument(
        "--policy", default=None, metavar="FILE", help="your docket.toml, under each phase's own"
    )
    p.add_argument(
        "--agent-findings",
        default=None,
        metavar="fail|warn",
        help="whether a finding about your agent fails the day (default warn)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... (your own agent)")
    p.set_defaults(func=cmd_game_day)

    p = verbs.add_parser("explain", help="name the patterns a run shows, costliest first")
    p.add_argument("run", help=RUN)
    p.add_argument("--policy", default=None, help="docket.toml whose [explain] sets thresholds")
    p.add_argument("--json", action="store_true", help="the findings as one JSON object")
    p.set_defaults(func=cmd_explain)

    p = verbs.add_parser("diff", help="what moved between two runs (exit 0 equal, 1 differ)")
    p.add_argument("receipt_a", help=f"the first run: {RUN}")
    p.add_argument("receipt_b", help=f"the second run: {RUN}")
    p.add_argument("--json", action="store_true", help="the differences as one JSON object")
    p.set_defaults(func=cmd_diff)

    p = verbs.add_parser("show", help="a ledger one line per event; --follow a live run")
    p.add_argument("ledger", help=RUN)
    p.add_argument("--type", action="append", metavar="T", help="model.error, model, x-docket.*")
    p.add_argument("--provider", action="append", metavar="NAME", help="this provider's events")
    p.add_argument("--seq", default=None, metavar="A..B", help="seq A to B (A.., ..B, N)")
    p.add_argument("--errors", action="store_true", help="failures, refusals, breaches only")
    p.add_argument("--follow", action="store_true", help="keep reading until session.end")
    p.add_argument("--json", action="store_true", help="the ledger's own lines, as written")
    p.set_defaults(func=cmd_show)

    p = verbs.add_parser("ls", help="the runs in a folder, newest first, from their receipts")
    p.add_argument("dir", nargs="?", default=None, help="the runs folder (default ./docket-runs)")
    p.add_argument("--json", action="store_true", help="the runs as one JSON object")
    p.set_defaults(func=cmd_ls)
    p = verbs.add_parser(
        "export", help="send a run's record to an OpenTelemetry collector (OTLP/HTTP)"
    )
    p.add_argument("format", choices=["otel"], help="otel: OTLP/HTTP protobuf, GenAI names")
    p.add_argument("run", help="a run: its folder, its ledger.jsonl or its receipt.json")
    p.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="the OTLP/HTTP base URL (/v1/traces and /v1/metrics are added); default "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, else http://127.0.0.1:4318",
    )
    p.add_argument(
        "--header",
        action="append",
        metavar="K=V",
        help="a header for every request (a collector's token); repeat",
    )
    p.add_argument(
        "--timeout",
        type=seconds_arg,
        default=None,
        help="seconds for each request, retries included (default 10)",
    )
    p.add_argument(
        "--policy",
        default=None,
        help="the run's docket.toml: names each provider's host and port (server.address)",
    )
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="send the trace only (for a backend that takes no metrics, such as Langfuse)",
    )
    p.set_defaults(func=cmd_export)

    from docket.replay.command import add_replay_parser  # the verb's arguments live with it

    add_replay_parser(verbs)
    document(verbs)  # each verb's description and examples: docket/cli_help.py
    return parser


def _host_flags(p: argparse.ArgumentParser) -> None:
    """Where the harness binds (and what it tells others to dial): loopback by default;
    in staging, addresses a Toxiproxy on another host can reach (docs/gamedays.md)."""
    p.add_argument(
        "--stub-host",
        default=None,
        metavar="HOST",
        help="the stub providers listen here (default 127.0.0.1, or the scenario's hosts.stubs)",
    )
    p.add_argument(
        "--proxy-host",
        default=None,
        metavar="HOST",
        help="the fault proxies listen here (default 127.0.0.1, or hosts.proxies)",
    )
    p.add_argument(
        "--boundary-host",
        default=None,
        metavar="HOST",
        help="the boundary listens here (default 127.0.0.1, or the policy's boundary.host)",
    )


def _fleet_arguments(p: argparse.ArgumentParser) -> None:
    """docket fleet's (docket/fleet/command.py runs it)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--dsn", help="a libpq connection string (no password: use ~/.pgpass)")
    where.add_argument(
        "--dsn-env", metavar="VAR", help="the variable holding the DSN (default DOCKET_FLEET_DSN)"
    )
    where.add_argument("--policy", metavar="FILE", help="read dsn or dsn_env from its [fleet]")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    init = actions.add_parser("init", help="create the fleet tables and functions (idempotent)")
    init.add_argument(
        "--runs-role",
        metavar="ROLE",
        help="the role runs connect as: EXECUTE on the lease functions, nothing on the tables",
    )
    budget = actions.add_parser("budget", help="set a budget's caps")
    budget_actions = budget.add_subparsers(dest="budget_action", metavar="set")
    s = budget_actions.add_parser("set", help="create a budget or change its caps")
    s.add_argument("name")
    s.add_argument("--max-usd", required=True, help="the budget's spend cap in USD")
    s.add_argument("--max-tokens", type=int, default=None)
    s.add_argument("--max-calls", type=int, default=None)
    se = actions.add_parser(
        "settle", help="settle a dead run's lapsed leases from its ledger: the rest is room again"
    )
    se.add_argument("name")
    se.add_argument("--ledger", required=True, help="the dead run's ledger (or its folder)")
    st = actions.add_parser(
        "status", help="cap, spent, leased, lapsed, per host, and each lease (expiring marked)"
    )
    st.add_argument("name")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    ru = actions.add_parser(
        "runs", help="each run, newest first: host, start, end, spend, state, receipt digest"
    )
    ru.add_argument("name")
    ru.add_argument("--json", action="store_true", help="machine-readable output")
    ru.add_argument("--limit", type=int, default=50, help="the newest N runs (default 50)")


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["run"]:
        # A supervisor holds provider keys: closed to same-user processes before
        # anything here reads one (the environment is read from the Supervisor on).
        # The run's hardening asks again and records what the kernel said.
        from docket.run.hardening import make_non_dumpable

        make_non_dumpable()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USAGE
        return args.func(args)
    except DocketError as exc:
        print(f"docket: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("docket: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`docket ... | head`); nothing to say.
        sys.stderr.close()
        return 1
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, no traceback
        if os.environ.get("DOCKET_DEBUG"):
            raise
        print(
            f"docket: internal error: {type(exc).__name__}: {one_line(str(exc))} "
            "(set DOCKET_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return 70
