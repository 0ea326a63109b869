"""`docket chaos --seed N --replay RUN -- CMD`: the fault grammar's upstream faults on a
replayed conversation.

The run is `docket replay`'s (docket/replay/: the recording verified, a replay upstream,
a boundary, a ledger, a receipt), with two things added here, on the harness's side of
the line docket never crosses (docket never imports chaos): the seeded schedule decides,
per request the replay upstream receives (`call` N, counted from 1 as the stub counts:
every request), which upstream faults fire, exactly as `plan()` decides them for the
stub (chaos/faults/upstream.py); and each fault performed is recorded as a
`fault.injected` event (FaultEvidence: durable before its effect, also in
injected.jsonl) with the run's `chaos` entry in session.start, so the receipt's faults
section counts them as in any chaos run. The replay upstream performs the Damage
(docket/replay/faults.py) on the recorded answer: an error in the provider's shape
instead of it, a cut or truncated stream, a malformed body, usage left out, a delay.

Only upstream faults apply to an answer: net, ledger, clock and process faults are
refused in one line (exit 2) before anything starts.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from pathlib import Path

import trio

from chaos.faults.schedule import FaultSchedule
from chaos.faults.upstream import plan
from chaos.run.evidence import FaultEvidence
from chaos.run.here import RESOLVE_UP_TO
from chaos.stub.common import MALFORMED_EVENT, frame_without_usage, without_usage
from chaos.stub.server import PROVIDERS, Arrival
from docket.errors import InputError
from docket.replay.faults import AnswerFaults, Damage
from docket.replay.match import Answer, RecordedCall
from docket.run.hooks import RunHandle, RunHooks


def check_replay_faults(schedule: FaultSchedule) -> None:
    for fault in schedule.faults:
        if fault.target != "upstream":
            raise InputError(
                f"fault {fault.text!r}: --replay performs upstream faults only (on the "
                "replayed answers); run net, ledger, clock and process faults without --replay"
            )


def damage_of(
    schedule: FaultSchedule, call: int, kind: str, answer: Answer, elapsed_s: float | None = None
) -> Damage:
    """What the faults firing at request `call` do to this recorded answer: the stub's
    decision (plan) and the stub's shapes (its error bodies, its usage removal, its
    malformed event), applied to the recorded answer instead of a made-up one. Pure."""
    arrival = Arrival(
        ordinal=call - 1,
        kind=kind,
        method="POST",
        path="",
        model="recorded",  # a model call: plan() performs faults on model calls only
        stream=answer.stream,
        body_bytes=len(answer.body),
    )
    b = plan(schedule, arrival, elapsed_s=elapsed_s)
    error = None
    if b.error is not None:
        error = PROVIDERS[kind].injected_error(b.error, b.status, seq=call - 1)
    body = None
    if b.omit_usage or b.malformed_json:
        body = _rewritten(answer, omit_usage=b.omit_usage, malformed=b.malformed_json)
    return Damage(
        first_byte_delay=b.first_byte_delay,
        token_delay=b.token_delay,
        error=error,
        retry_after=b.retry_after,
        body=body,
        cut_after_events=b.cut_after_events,
        truncate_bytes=b.truncate_bytes,
        injected=b.injected,
    )


def _rewritten(answer: Answer, *, omit_usage: bool, malformed: bool) -> str:
    if not answer.stream:
        data = answer.body.encode("utf-8")
        if omit_usage:
            data = without_usage(data)
        if malformed:
            data = data[: len(data) // 2]  # a complete answer whose JSON does not parse
        return data.decode("utf-8", "replace")
    events = [e.encode("utf-8") for e in answer.events()]
    if omit_usage:
        events = [e for e in (_event_without_usage(e) for e in events) if e]
    if malformed and events:
        events[0] = MALFORMED_EVENT
    return b"".join(events).decode("utf-8", "replace")


def _event_without_usage(event: bytes) -> bytes:
    try:
        return frame_without_usage(event)
    except ValueError:
        # An event whose JSON was recorded cut (a stream cut mid-event): it carries no
        # usage anyone could read, so it goes as recorded.
        return event


def answer_faults(
    schedule: FaultSchedule, evidence: FaultEvidence, elapsed: Callable[[], float]
) -> AnswerFaults:
    """The replay upstream's hook: decide, record each performed fault, then damage."""

    async def faults(call: int, provider: str, kind: str, recorded: RecordedCall) -> Damage:
        damage = damage_of(schedule, call, kind, recorded.answer, elapsed())
        for fields in damage.injected:
            await evidence.record(fields | {"provider": provider})
        return damage

    return faults


def replay_chaos(
    args: argparse.Namespace,
    seed: int,
    schedule: FaultSchedule,
    folder: Path,
    schedule_lines: list[str],
) -> int:
    """The chaos verb with --replay: the replay prepared (every refusal first), the
    schedule printed, then the run with the faults on the replay upstream."""
    from docket.replay.command import prepare_replay, run_replay

    check_replay_faults(schedule)
    if args.agent is not None or args.toxiproxy is not None:
        raise InputError(
            "--replay serves a recorded run to your command (-- CMD): not with --agent or "
            "--toxiproxy"
        )
    command = [c for c in (args.command or []) if c != "--"]
    if not command:
        raise InputError("--replay: give the agent's command after --")
    words = [args.replay, "--on-miss", args.on_miss or "fail", "--ledger-dir", str(folder)]
    if args.policy:
        words += ["--policy", args.policy]
    prepared = prepare_replay(argparse.Namespace(words=[*words, "--", *command]))
    evidence = FaultEvidence(folder / "injected.jsonl")
    t0: list[float] = []

    def elapsed() -> float:
        return trio.current_time() - t0[0] if t0 else 0.0

    async def before_spawn(handle: RunHandle) -> None:
        t0.append(trio.current_time())
        evidence.open(handle)

    async def before_stop(handle: RunHandle) -> None:
        await evidence.close()

    prepared.upstream.faults = answer_faults(schedule, evidence, elapsed)
    hooks = RunHooks(
        chaos=schedule.receipt_entry(RESOLVE_UP_TO),
        before_spawn=before_spawn,
        before_stop=before_stop,
    )
    print(f"seed {seed}")
    for line in schedule_lines:
        print(line)
    status = run_replay(prepared, hooks=hooks)
    performed = len(evidence.injected)
    print(f"faults: {performed} performed on replayed answers (injected.jsonl in {folder})")
    print(f"reproduce: {shlex.join(repro_argv(args, seed))}")
    return status


def repro_argv(args: argparse.Namespace, seed: int) -> list[str]:
    argv = ["docket", "chaos", "--seed", str(seed), "--replay", args.replay]
    if args.scenario:
        argv += ["--scenario", args.scenario]
    for text in args.fault or []:
        argv += ["--fault", text]
    if args.policy:
        argv += ["--policy", args.policy]
    if args.on_miss:
        argv += ["--on-miss", args.on_miss]
    return [*argv, "--", *[c for c in (args.command or []) if c != "--"]]


def injected_lines(folder: Path) -> list[dict]:
    """injected.jsonl, parsed: what the tests compare across runs."""
    path = folder / "injected.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
