"""`docket replay RUN -- CMD`: the recorded run's answers served to CMD, supervised.

The recording is read and verified first (recording.py: one line and exit 2 when
it cannot be replayed), then the replay upstream starts on 127.0.0.1, then CMD runs
exactly as under `docket run` (a boundary, a ledger, the policy's caps, a receipt)
with every provider's base URL pointed at that upstream. The new ledger is an
ordinary one: each replayed answer's closing event carries `replayed_from` and costs
zero, and session.start carries `replay_of` {run_id, head}, which the receipt states.

Exit: the run's own status; 1 when a request diverged under `--on-miss fail` (the
first divergence printed as a JSON diff against the nearest recorded call); with
`--check`, 0 only when every recorded call was replayed and nothing else asked.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import secrets
import sys
from types import MappingProxyType
from typing import TYPE_CHECKING

from docket.errors import InputError
from docket.replay.options import ON_MISS, PACES, POLICIES

if TYPE_CHECKING:  # the parser imports this module: nothing heavy at run time
    from docket.policy import Policy
    from docket.replay.match import Matcher
    from docket.replay.recording import Recording
    from docket.replay.upstream import ReplayUpstream
    from docket.run.values import RunOptions

CHECK_FAILED = 1
EXAMPLES = """examples:
  docket replay docket-runs/20261202T101500Z-1a2b3c4d --policy docket.toml -- python agent.py
  docket replay RUN --check -- python agent.py          exit 0 only if every call replayed
  docket replay RUN --on-miss error -- python agent.py  a changed request gets an SDK error
  docket replay RUN --match model+messages --ignore metadata,user -- python agent.py
  docket replay RUN --pace recorded -- python agent.py  streams at the recorded pace
"""


def add_replay_parser(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "replay",
        help="serve a recorded run's answers to an agent, offline, under a new run",
        description=(
            "Run CMD supervised exactly as `docket run` does, with every provider's base URL "
            "pointed at a local upstream that answers each request from a recorded run (recorded "
            "with record_bodies = true; its receipt must verify). Each replayed answer is marked "
            "replayed_from and costs zero; the receipt states replay_of. See docs/replay.md."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_options(p)
    # RUN, the options and `-- CMD ARGS`, in any order before the `--`: argparse's
    # REMAINDER after a positional would swallow the options, so the words before
    # `--` are parsed again by replay_command (_options_parser).
    p.add_argument("words", nargs=argparse.REMAINDER, help="RUN [options] -- CMD ARGS...")
    p.set_defaults(func=replay_command)


class _OneLineParser(argparse.ArgumentParser):
    """A usage error is one line and exit 2, as docket.cli's parser makes it."""

    def error(self, message: str):  # noqa: D401 - argparse's signature
        raise InputError(f"{message} (see {self.prog} --help)")


def _options_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="docket replay")
    p.add_argument("run", help="the recorded run: its folder, its receipt, or its run id")
    _add_options(p)
    return p


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=None, help="docket.toml (default: built-in defaults)")
    p.add_argument("--ledger-dir", default=None, help="where the replay's ledger and receipt go")
    p.add_argument(
        "--match",
        choices=POLICIES,
        default="exact",
        help="how a request finds its recorded answer (default exact: the same bytes)",
    )
    p.add_argument(
        "--ignore",
        default="",
        metavar="A,B",
        help="with --match model+messages: body members not compared (e.g. metadata,user)",
    )
    p.add_argument(
        "--on-miss",
        choices=ON_MISS,
        default="fail",
        help="a request with no recorded answer: end the replay (exit 1), answer a "
        "provider-shaped error, or forward it to the real provider",
    )
    p.add_argument(
        "--pace",
        choices=PACES,
        default="fast",
        help="stream events as fast as possible, or at the recorded pace",
    )
    p.add_argument(
        "--max-wall-clock", type=float, default=None, help="stop the run after S seconds"
    )
    p.add_argument(
        "--grace",
        type=float,
        default=None,
        help="seconds between SIGTERM and SIGKILL when the child is stopped (default 5)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 0 only when every recorded call was replayed and nothing else asked",
    )


@dataclasses.dataclass
class Prepared:
    """A replay ready to run: what replay_command (and docket chaos --replay) runs."""

    args: argparse.Namespace
    recording: Recording
    matcher: Matcher
    upstream: ReplayUpstream
    policy: Policy
    options: RunOptions


def replay_command(args: argparse.Namespace) -> int:
    return run_replay(prepare_replay(args))


def prepare_replay(args: argparse.Namespace) -> Prepared:
    """The words parsed, the recording read and verified, the upstream built: every
    refusal (one line, exit 2) happens here, before anything starts."""
    from docket.policy import load_policy
    from docket.replay.match import Matcher
    from docket.replay.recording import load_recording
    from docket.replay.upstream import ReplayUpstream
    from docket.run import supervisor as run
    from docket.run.values import RunOptions

    words = list(args.words)
    cut = words.index("--") if "--" in words else len(words)
    args = _options_parser().parse_args(words[:cut], namespace=args)
    command = words[cut + 1 :]
    if not command:
        raise InputError(
            "replay: give the command to run after --, e.g. docket replay RUN -- python agent.py"
        )
    run._check_command(command)
    ignore = [name.strip() for name in args.ignore.split(",") if name.strip()]
    if ignore and args.match != "model+messages":
        raise InputError("replay: --ignore applies to --match model+messages only")
    recording = load_recording(args.run)
    try:
        matcher = Matcher(recording.calls, args.match, ignore)
    except ValueError as exc:
        raise InputError(f"replay: {exc}") from None
    policy = load_policy(args.policy)
    unrouted = sorted({c.provider for c in recording.calls} - set(policy.providers))
    if unrouted:  # the agent's calls to them cannot reach the replay: say so at once
        print(
            f"docket: warning: recorded provider(s) {', '.join(unrouted)} are not in the policy "
            "(give the recording's --policy): their calls cannot be replayed",
            file=sys.stderr,
        )
    upstream = ReplayUpstream(
        matcher,
        run_id=recording.run_id,
        key=secrets.token_hex(16),
        kinds={name: p.kind for name, p in policy.providers.items()},
        on_miss=args.on_miss,
        pace=args.pace,
        real_base_urls={name: p.base_url for name, p in policy.providers.items()},
    )
    options = RunOptions(
        command=command,
        ledger_dir=args.ledger_dir,
        max_wall_clock=run._seconds(args.max_wall_clock, "--max-wall-clock", positive=True),
    )
    grace = run._seconds(args.grace, "--grace", positive=False)
    if grace is not None:
        options.grace_seconds = grace
    return Prepared(args, recording, matcher, upstream, policy, options)


def run_replay(prepared: Prepared, hooks=None) -> int:
    """Run it: the upstream, then CMD supervised against it. `hooks` (docket.run.hooks:
    a harness's) go to the supervisor; a harness's faults are on the upstream already
    (prepared.upstream.faults)."""
    import trio

    from docket.run import supervisor as run

    p = prepared
    outcome, supervisor = trio.run(
        functools.partial(_replay, p.upstream, p.policy, p.options, p.recording, hooks)
    )
    for note in outcome.notes:
        print(f"docket: warning: {note}", file=sys.stderr)
    print(run.last_line(supervisor.run_id, outcome), file=sys.stderr)
    return _verdict(p.args, p.matcher, p.upstream, outcome.exit_status)


async def _replay(upstream, policy, options, recording, hooks=None):
    import trio

    from docket.boundary.stop import StopRequest
    from docket.run import supervisor as run

    async with trio.open_nursery() as nursery:
        url = await nursery.start(upstream.serve)
        providers = {
            name: dataclasses.replace(p, base_url=f"{url}/{name}")
            for name, p in policy.providers.items()
        }
        # The cache off: every call goes to the replay upstream, and is answered from the record.
        replay_policy = dataclasses.replace(
            policy,
            providers=MappingProxyType(providers),
            cache=dataclasses.replace(policy.cache, enabled=False),
        )
        supervisor = run.Supervisor(options, policy=replay_policy, hooks=hooks)
        supervisor.replay_key = upstream.key
        supervisor.replay_of = recording.replay_of
        upstream.stop = lambda reason: supervisor.request_stop(StopRequest(reason, exit_status=1))
        supervisor._harden()
        run._drop_keys_from_environ(supervisor)
        supervisor.on_started = functools.partial(_start_warnings, supervisor, upstream.on_miss)
        outcome = await supervisor.run()
        nursery.cancel_scope.cancel()
    return outcome, supervisor


def _start_warnings(supervisor, on_miss: str) -> None:
    """`docket run`'s start warnings; a missing provider key only where it matters: a
    replay answers from the record, and only --on-miss forward reaches a provider (the
    keys missing are in session.start either way)."""
    from docket.run import supervisor as run

    missing = supervisor.keys_missing
    if on_miss != "forward":
        supervisor.keys_missing = []
    try:
        run._start_warnings(supervisor)
    finally:
        supervisor.keys_missing = missing


def _verdict(args, matcher, upstream, status: int) -> int:
    from docket.replay.upstream import miss_report

    recorded = len(matcher.calls)
    summary = (
        f"docket: replay of {upstream.run_id}: {matcher.matched} of {recorded} recorded calls "
        f"replayed, {matcher.missed} request(s) with no recorded answer"
    )
    if upstream.forwarded:
        summary += f" ({upstream.forwarded} forwarded to the real provider)"
    if upstream.faulted:
        summary += f"; {upstream.faulted} answer(s) replaced or broken by an injected fault"
    if upstream.not_model_calls:
        shown = ", ".join(upstream.not_model_calls[:3])
        summary += f"; {len(upstream.not_model_calls)} not model calls, not recorded ({shown})"
    for problem in upstream.forward_errors:
        print(f"docket: replay: forwarding failed: {problem}", file=sys.stderr)
    print(summary, file=sys.stderr)
    if upstream.misses:
        print("docket: replay: the first divergence:", file=sys.stderr)
        print(miss_report(upstream.misses[0]), file=sys.stderr)
    if args.check:
        return 0 if (matcher.matched == recorded and not matcher.missed) else CHECK_FAILED
    if upstream.misses and args.on_miss == "fail":
        return 1
    return status
