"""The oracle itself is tested: one regression planted per claim a game-day phase makes
about Docket (the FMEA rows of docs/resilience.md it names as `gameday:PHASE` detectors),
each in the code the claim is about, must end that phase as FAIL with exit 1, naming the
checks aimed at it, never as "unknown" (exit 2) and never as a pass. The MUTANTS table
below is the list: its claim (FMEA row), the phase, the plant and the checks it must fail.

Most phases are in-process: their boundary (breaker, caps, limiter, bulkhead, ledger),
stub providers and embedded fault proxy run in this process (chaos.run.here.run_here),
and only the agents are child processes. So their regression is planted with pytest's
monkeypatch on the real class or function, the phase runs through the real runner
(chaos.gameday.runner.game_day), and the patch is gone when the test ends. No test hook
in docket/ or the harness is needed. supervisor-killed runs its runs in a child process
(`docket chaos`, which hands a run that kills its own supervisor to `python -m
chaos.run.worker`): its regression is planted in that child by a sitecustomize.py put
first on the PYTHONPATH the children inherit (see supervisor_spawns_without_launcher).

The suite runs a short form (SHORT); `nox -s mutants` runs them all (DOCKET_MUTANTS=full).
Where a plant was not caught, the phase was strengthened, not the plant weakened: see
the comments in gamedays/02, 05, 07 and 09.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from chaos.gameday.assertions import FAIL, UNKNOWN
from chaos.gameday.phase import load_phases
from chaos.gameday.results import EXIT_FAIL
from chaos.gameday.runner import game_day

# ---------------------------------------------------------------- the regressions


def breaker_never_opens(monkeypatch):
    """The breaker counts failures but its thresholds are out of reach."""
    from docket.boundary import wiring

    made = wiring.breaker_for

    def breaker_for(upstream, policy):
        b = made(upstream, policy)
        b.threshold = b.min_calls = 10**9
        return b

    monkeypatch.setattr(wiring, "breaker_for", breaker_for)


def status_503_not_a_failure(monkeypatch):
    """An upstream 5xx is told to the breaker as "ignored", like a 4xx."""
    from docket.boundary import guarded
    from docket.guards import breaker as brk

    real = guarded.breaker_outcome

    def outcome(reason, status):
        return brk.IGNORED if reason == "upstream_status" else real(reason, status)

    monkeypatch.setattr(guarded, "breaker_outcome", outcome)


def slow_calls_not_timed(monkeypatch):
    """The breaker is told no call's duration, so no call is ever slow."""
    from docket.guards import breaker as brk

    real = brk.CircuitBreaker.record

    def record(self, ticket, outcome, now, duration=None):
        return real(self, ticket, outcome, now)

    monkeypatch.setattr(brk.CircuitBreaker, "record", record)


def caps_never_refuse(monkeypatch):
    """The caps guard reserves every call as if no cap were set."""
    from docket.guards.caps import CapsGuard

    real = CapsGuard.reserve

    def reserve(self, **kw):
        limits, self._limits = self._limits, {}
        try:
            return real(self, **kw)
        finally:
            self._limits = limits

    monkeypatch.setattr(CapsGuard, "reserve", reserve)


def in_flight_ignored(monkeypatch):
    """The caps guard checks a call against what was spent, not what is in flight."""
    from docket.guards.caps import CapsGuard

    real = CapsGuard.reserve

    def reserve(self, **kw):
        held = dict(self._reserved)
        self._reserved = dict.fromkeys(held, 0)
        try:
            return real(self, **kw)
        finally:
            self._reserved = {cap: held[cap] + self._reserved[cap] for cap in held}

    monkeypatch.setattr(CapsGuard, "reserve", reserve)


def upstream_fault_never_injected(monkeypatch):
    """The stub's fault plan performs nothing and records nothing."""
    from chaos.faults import upstream
    from chaos.stub.server import Behaviour

    monkeypatch.setattr(upstream, "plan", lambda schedule, arrival, **kw: Behaviour())


def fault_recorded_not_performed(monkeypatch):
    """The stub records each fault as injected but answers normally."""
    from chaos.faults import upstream
    from chaos.stub.server import Behaviour

    real = upstream.plan
    monkeypatch.setattr(
        upstream, "plan", lambda *a, **kw: Behaviour(injected=real(*a, **kw).injected)
    )


def timeout_passes_data(monkeypatch):
    """The embedded proxy's timeout toxic forwards the bytes it should drop."""
    from chaos.toxiproxy.toxics.timeout import Timeout

    async def pipe(self, chunk, send, link, state):
        await send(chunk)

    monkeypatch.setattr(Timeout, "pipe", pipe)


def open_breaker_leaks(monkeypatch):
    """An open breaker lets every other call through to the upstream (still "open")."""
    from docket.guards import breaker as brk

    real = brk.CircuitBreaker.before_call
    leaked = [0]

    def before_call(self, now):
        verdict = real(self, now)
        if verdict.refusal is not None and self.state == brk.OPEN:
            leaked[0] += 1
            if leaked[0] % 2:
                return brk.Verdict(ticket=self._issue(probe=False), refusal=None)
        return verdict

    monkeypatch.setattr(brk.CircuitBreaker, "before_call", before_call)


def boundary_resends_silently(monkeypatch):
    """The boundary sends each call upstream twice, the first time without a record
    (a hidden "warm-up" or retry): the dependency sees twice the load the ledger shows."""
    from docket.boundary.forward import ModelCall

    real = ModelCall._attempt_once

    async def attempt_once(self, pool, target, out_headers, body, respond, strip):
        async with pool.request(
            "POST", target, out_headers, body, wait_timeout=pool.connect_timeout
        ) as resp:
            await resp.read(limit=1 << 20)
        await real(self, pool, target, out_headers, body, respond, strip)

    monkeypatch.setattr(ModelCall, "_attempt_once", attempt_once)


# ---- upstream-latency (F02: a slow upstream is cut at the read timeout; F13: the
# wall-clock cap runs on the monotonic clock, whatever the recorder's clock does)


def read_timeout_not_applied(monkeypatch):
    """Each route's pool is made without the policy's upstream_timeout, so it waits
    for a slow upstream as long as the pool's own default (120 s) allows."""
    from docket.boundary import app

    made = app.make_route

    def make_route(provider, *, read_timeout, **kw):
        return made(provider, read_timeout=120.0, **kw)

    monkeypatch.setattr(app, "make_route", make_route)


def timeout_not_a_breaker_failure(monkeypatch):
    """A call that timed out is told to the breaker as saying nothing (abandoned),
    so a provider that has stopped answering in time never opens it."""
    from docket.boundary import guarded

    real = guarded.breaker_outcome

    def outcome(reason, status):
        return None if reason == "timeout" else real(reason, status)

    monkeypatch.setattr(guarded, "breaker_outcome", outcome)


def wall_cap_on_the_recorders_clock(monkeypatch):
    """The wall-clock cap reads the elapsed time from the recorder's clock (the one
    that stamps `ts` and `mono_ms`, which an NTP step moves) instead of trio's."""
    import trio

    from docket.boundary.stop import StopRequest
    from docket.clock import Clock
    from docket.run import control

    made = control.ChildControl.__init__

    def __init__(self, *a, **kw):
        made(self, *a, **kw)
        self._clock = self.hooks.clock or Clock()
        self._clock_origin = self._clock.mono()  # before the ledger opens, before any fault

    async def watch_wall_clock(self, boundary):
        from docket.ledger.limits import EvidenceLost

        hard = self.options.max_wall_clock
        caps = boundary.caps
        while True:
            due = [t for t in (caps.next_wall_threshold(), hard) if t is not None]
            if not due:
                return
            await trio.sleep_until(self.started + min(due))
            elapsed = self._clock.mono() - self._clock_origin  # the regression
            try:
                await boundary.cap_events(caps.check_wall(elapsed))
            except EvidenceLost:
                return
            if hard is not None and elapsed >= hard:
                self.stop.request(StopRequest("wall-clock cap reached", cap="max_wall_seconds"))
                return

    monkeypatch.setattr(control.ChildControl, "__init__", __init__)
    monkeypatch.setattr(control.ChildControl, "watch_wall_clock", watch_wall_clock)


# ---- retry-storm (F05: the limiter refuses with 429 and Retry-After, so retries do
# not amplify the load; F01: an error reaches the agent with its own status)


def limiter_hint_says_now(monkeypatch):
    """The limiter's refusal tells the caller to come back in 0 s, whatever the bucket
    and the window say (the event and the 429's Retry-After both say 0)."""
    import dataclasses

    from docket.guards.limiter import RateLimiter

    real = RateLimiter._refuse

    def _refuse(self, *a, **kw):
        return dataclasses.replace(real(self, *a, **kw), retry_after_s=0.0)

    monkeypatch.setattr(RateLimiter, "_refuse", _refuse)


def rate_limited_answered_as_503(monkeypatch):
    """The boundary's rate-limit refusal goes out as a 503 (the breaker's and the
    bulkhead's status), not the 429 SDKs read as "too many requests"."""
    from docket.boundary.providers import base

    monkeypatch.setitem(base.DOCKET_ERRORS, "docket_rate_limited", base.RefusalKind(503, True))


# ---- partition (F17: the pool is the bulkhead, with a bounded queue)


def bulkhead_queue_unbounded(monkeypatch):
    """Each upstream's bulkhead queues every caller that finds its slots busy
    (max_queue ignored): nothing is shed, callers wait on each other."""
    from docket.boundary import wiring
    from docket.guards.bulkhead import BulkheadCore

    made = wiring.bulkhead_core_for

    def bulkhead_core_for(upstream, resilience):
        core = made(upstream, resilience)
        return None if core is None else BulkheadCore(upstream, core.slots, 10**9)

    monkeypatch.setattr(wiring, "bulkhead_core_for", bulkhead_core_for)


# ---- ledger-pressure (F08: the ledger's ceilings stop the run)


def event_ceiling_ignored(monkeypatch):
    """The ledger's book forgets max_events (the byte ceiling still holds)."""
    import dataclasses

    from docket.ledger.book import LedgerBook

    made = LedgerBook.__init__

    def __init__(self, limits, **kw):
        made(self, limits, **kw)
        self.limits = dataclasses.replace(limits, max_events=None)

    monkeypatch.setattr(LedgerBook, "__init__", __init__)


def byte_ceiling_ignored(monkeypatch):
    """The ledger's book forgets max_ledger_bytes (the event ceiling still holds)."""
    from docket.ledger.book import LedgerBook

    made = LedgerBook.__init__

    def __init__(self, limits, **kw):
        made(self, limits, **kw)
        self._room_control = self._room_other = 1 << 60

    monkeypatch.setattr(LedgerBook, "__init__", __init__)


# ---- evidence-loss (F09: lost events are counted and disclosed)


def lost_events_not_counted(monkeypatch):
    """The evidence guard writes its evidence.gap but leaves the lost events out of
    the run's stats, so the receipt says ledger_complete: true."""
    from docket.ledger.book import LedgerBook

    real = LedgerBook.lose

    def lose(self, items, error, **kw):
        unwritten, by_type = self.unwritten, dict(self.unwritten_by_type)
        real(self, items, error, **kw)
        self.unwritten, self.unwritten_by_type = unwritten, by_type

    monkeypatch.setattr(LedgerBook, "lose", lose)


# ---- supervisor-killed (F10: doctor sets a torn tail aside and never repairs in place).
# doctor and quarantine run after the run, in this process (chaos.gameday.aftermath):
# monkeypatch reaches them.


def quarantine_truncates_in_place(monkeypatch):
    """`doctor --quarantine-torn-tail` writes its sidecar and repaired copy, then also
    cuts the torn bytes off the original (a repair in place: the evidence changed)."""
    import os

    from docket.ledger import doctor

    real = doctor.quarantine_torn_tail

    def quarantine_torn_tail(diag):
        done = real(diag)
        assert diag.tail is not None  # real() refuses anything but a torn tail
        os.truncate(diag.path, diag.tail.offset)
        return done

    monkeypatch.setattr(doctor, "quarantine_torn_tail", quarantine_torn_tail)


# ---- supervisor-killed (F10: no process outlives the supervisor). Its runs are in a
# child process (`docket chaos` hands a run that kills its supervisor to `python -m
# chaos.run.worker`), out of monkeypatch's reach: the regression is planted in that
# child by a sitecustomize.py on the PYTHONPATH the children inherit (the harness
# neither runs python -I nor scrubs the environment), applied at start-up only in
# the process that runs the supervisor.


WITHOUT_LAUNCHER = """\
import sys

if "chaos.run.worker" in getattr(sys, "orig_argv", ()):
    import subprocess

    from docket.run import control

    class Popen(subprocess.Popen):
        # the regression: the child is started as itself, not through
        # `python -m docket.run.launch` (no death signal, no watcher, no cgroup leaf)
        def __init__(self, argv, *a, **kw):
            if "docket.run.launch" in argv:
                argv = argv[argv.index("--") + 1 :]
            super().__init__(argv, *a, **kw)

    class Subprocess:
        def __getattr__(self, name):
            return getattr(subprocess, name)

    Subprocess.Popen = Popen
    control.subprocess = Subprocess()
"""


def supervisor_spawns_without_launcher(monkeypatch, folder):
    """The supervisor starts its child directly, not through docket.run.launch: no
    parent-death signal, no watcher to kill the group, no cgroup leaf."""
    import os

    (folder / "sitecustomize.py").write_text(WITHOUT_LAUNCHER, encoding="utf-8")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(folder) + (os.pathsep + path if path else ""))


@dataclasses.dataclass(frozen=True)
class Mutant:
    plant: object
    phase: str
    catches: frozenset[str]  # checks that must fail (others may fail too)
    claims: tuple[str, ...] = ()  # FMEA rows (docs/resilience.md) whose claim the checks are
    in_child: bool = False  # planted in the phase's child process (a sitecustomize.py)

    @property
    def id(self) -> str:
        return self.plant.__name__


OPENED = "the breaker opened"
CYCLE = "the whole cycle is in the ledger"
BY_RATE = "failures between successes opened it on the failure rate"
BY_SLOWNESS = "slow answers opened it on the slow-call rate, with no failure in the window"
MUTANTS = [
    Mutant(breaker_never_opens, "circuit-breaker", frozenset({OPENED, CYCLE}), ("F03",)),
    # The slow answers still open it (no failure needed), so "opened" alone holds; the
    # cycle and the failure-rate opening do not.
    Mutant(status_503_not_a_failure, "circuit-breaker", frozenset({CYCLE, BY_RATE}), ("F03",)),
    Mutant(slow_calls_not_timed, "circuit-breaker", frozenset({CYCLE, BY_SLOWNESS}), ("F03",)),
    Mutant(
        caps_never_refuse,
        "runaway-loop",
        frozenset(
            {
                # deny mode: the spend runs past the cap. (Whether a call is refused
                # afterwards depends on timing: the breach, seen when a call is charged,
                # still stops later ones once it is recorded; so that check is not named.)
                "eight callers at once did not push the spend past the cap ($0.001 = 1000000 nUSD)",
                # kill mode: the breach is seen only when the 21st call is charged, so
                # it was forwarded (the kill itself still happens: the guard stops the run)
                "no more calls were forwarded than the cap allows, with seven callers at once",
            }
        ),
        claims=("F06",),
    ),
    Mutant(
        in_flight_ignored,
        "runaway-loop:deny",
        frozenset({"no more calls were in flight than the cap holds at their worst case (7)"}),
        claims=("F07",),
    ),
    Mutant(
        upstream_fault_never_injected,
        "upstream-failure",
        frozenset(
            {
                "upstream 503s were injected",
                "the ledger has the answer that came without its usage",
                "the cut stream closed as a model.error",
            }
        ),
        claims=("F01", "F11"),
    ),
    Mutant(
        fault_recorded_not_performed,
        "upstream-failure",
        frozenset(
            {
                "every injected 503 is a model.error, never a model.response",
                "the ledger has the answer that came without its usage",
                "the cut stream closed as a model.error",
            }
        ),
        claims=("F01", "F11"),
    ),
    Mutant(
        timeout_passes_data,
        "partition",
        frozenset({"the black hole shows as calls that timed out at the boundary"}),
        claims=("F04",),
    ),
    Mutant(
        open_breaker_leaks,
        "circuit-breaker",
        frozenset(
            {
                "no call was forwarded while the breaker was open (the ledger's order)",
                "the stub saw nothing while the breaker was open (the stub's own log)",
            }
        ),
        claims=("F03",),
    ),
    Mutant(
        boundary_resends_silently,
        "upstream-failure",
        frozenset(
            {
                "calls forwarded equal calls the stubs logged (no amplification)",
                "each stub logged exactly the calls the ledger forwarded to it, body for body",
            }
        ),
        claims=("F05",),
    ),
    Mutant(
        read_timeout_not_applied,
        "upstream-latency",
        frozenset(
            {
                "each call past the timeout is a model.error with reason timeout",
                "a timeout closes at the read timeout, not when the upstream would have answered",
                "the slowest call as the boundary answered it is far inside the agent's 2 s deadline",
            }
        ),
        claims=("F02",),
    ),
    Mutant(
        timeout_not_a_breaker_failure,
        "upstream-latency",
        frozenset(
            {
                "the timeouts count for the breaker, which opens after three",
                "the three calls after the breaker opened were refused at once, not sent",
            }
        ),
        claims=("F02",),
    ),
    Mutant(
        wall_cap_on_the_recorders_clock,
        "upstream-latency",
        frozenset({"the wall-clock cap fired at 7 s of real (monotonic) time despite the step"}),
        claims=("F13",),
    ),
    Mutant(
        limiter_hint_says_now,
        "retry-storm",
        frozenset({"every refusal tells the caller when to come back"}),
        claims=("F05",),
    ),
    Mutant(
        rate_limited_answered_as_503,
        "retry-storm",
        frozenset(
            {"the limiter's refusals reached both agents as 429s, the status SDKs back off on"}
        ),
        claims=("F01",),
    ),
    Mutant(
        bulkhead_queue_unbounded,
        "partition",
        frozenset({"the bulkhead shed calls that could not get an upstream slot"}),
        claims=("F17",),
    ),
    Mutant(
        event_ceiling_ignored,
        "ledger-pressure",
        frozenset(
            {
                "the run stopped at the event ceiling, exit 42",
                "the events that count against the ceiling stayed within it",
            }
        ),
        claims=("F08",),
    ),
    Mutant(
        byte_ceiling_ignored,
        "ledger-pressure",
        frozenset(
            {
                "the run stopped at the byte ceiling, exit 42",
                "the file never passed its byte ceiling (16 KiB)",
            }
        ),
        claims=("F08",),
    ),
    Mutant(
        lost_events_not_counted,
        "evidence-loss",
        frozenset(
            {
                "the receipt discloses that the ledger is incomplete",
                "the receipt counts the unwritten events and the first failing seq",
            }
        ),
        claims=("F09",),
    ),
    Mutant(
        supervisor_spawns_without_launcher,
        "supervisor-killed",
        frozenset(
            {
                "no process the run spawned outlived the supervisor",
                "no process outlived the supervisor that died mid-line",
            }
        ),
        claims=("F10",),
        in_child=True,
    ),
    Mutant(
        quarantine_truncates_in_place,
        "supervisor-killed",
        frozenset({"quarantine moved the torn bytes to a sidecar and left the original unchanged"}),
        claims=("F10",),
    ),
]


# The suite runs SHORT: three of the cheapest (1.4-1.9 s each, idle), one per room
# (a guard, the boundary, the ledger). `nox -s mutants` (DOCKET_MUTANTS=full) runs every
# mutant, ~95 s in all. Chosen at collection, so the suite lists no skips for the rest.
SHORT = ("limiter_hint_says_now", "boundary_resends_silently", "event_ceiling_ignored")
FULL = os.environ.get("DOCKET_MUTANTS") == "full"
CHOSEN = MUTANTS if FULL else [m for m in MUTANTS if m.id in SHORT]


def test_the_short_form_names_real_mutants():
    assert set(SHORT) <= {m.id for m in MUTANTS}
    assert len({m.id for m in MUTANTS}) == len(MUTANTS)


def test_every_claim_of_a_phase_has_a_mutant():
    # Each (FMEA row, phase) pair of docs/resilience.md's detectors has a plant aimed at it.
    from chaos.gameday.fmea import load_fmea

    planted = {(row, m.phase.split(":")[0]) for m in MUTANTS for row in m.claims}
    claimed = {(row.id, phase) for row in load_fmea() for phase in row.phases}
    assert claimed - planted == set()
    assert planted - claimed == set()  # a mutant names a claim the table makes


@pytest.mark.parametrize("mutant", CHOSEN, ids=lambda m: m.id)
def test_a_planted_regression_fails_its_phase(mutant, monkeypatch, tmp_path):
    (phase,) = load_phases([mutant.phase])
    if mutant.in_child:
        mutant.plant(monkeypatch, tmp_path)
    else:
        mutant.plant(monkeypatch)
    try:
        result = game_day([phase])
    finally:
        monkeypatch.undo()  # before anything else runs in this process
    assert not result.interrupted
    (judged,) = result.phases
    survivors = _stop_survivors(judged)
    by_verdict = {
        v: {c.check.name for c in judged.checks if c.verdict == v} for v in (FAIL, UNKNOWN)
    }
    shown = {c.check.name: (c.verdict, c.check.reason) for c in judged.checks}
    assert result.exit_code == EXIT_FAIL, shown
    assert judged.verdict == FAIL
    assert mutant.catches <= by_verdict[FAIL], shown
    # A regression is read as an observation: nothing in these phases is left unjudged.
    assert by_verdict[UNKNOWN] == set(), shown
    assert all(not _alive(pid) for pid in survivors), survivors


def _stop_survivors(judged) -> list[int]:
    """The processes a check found outliving their run (`orphans`): this test started
    them, so it ends them, by pid."""
    pids = [
        pid
        for c in judged.checks
        if c.check.query == "orphans" and isinstance(c.check.observed, list)
        for pid in c.check.observed
    ]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


GIVES_UP = (
    "import os, sys, httpx\n"
    "base, key = os.environ['OPENAI_BASE_URL'], os.environ['OPENAI_API_KEY']\n"
    "with httpx.Client(base_url=base, headers={'authorization': 'Bearer ' + key}) as http:\n"
    "    for i in range(10):\n"
    "        body = {'model': 'gpt-4o-mini', 'max_tokens': 4,\n"
    "                'messages': [{'role': 'user', 'content': f'line {i}'}]}\n"
    "        if http.post('/chat/completions', json=body).status_code != 200:\n"
    "            sys.exit(1)\n"
)


def test_a_leaking_breaker_is_dockets_failure_whatever_the_users_agent_did(monkeypatch):
    # With a user's agent beside the reference agent (one that gives up at its first
    # 503), the breaker's invariants are still judged over every route, so a planted
    # leak is caught, and the day says the failure is Docket's, not the agent's.
    import sys

    from chaos.gameday.your_agent import UserAgent, for_user

    (phase,) = load_phases(["circuit-breaker"])
    mine = for_user(phase, UserAgent(command=(sys.executable, "-c", GIVES_UP), findings="fail"))
    open_breaker_leaks(monkeypatch)
    result = game_day([mine], agent_findings="fail")
    (judged,) = result.phases
    shown = {c.check.name: (c.verdict, c.check.reason) for c in judged.checks}
    assert result.exit_code == EXIT_FAIL and judged.verdict == FAIL, shown
    leaked = "no call was forwarded while the breaker was open (the ledger's order)"
    assert shown[leaked][0] == FAIL, shown
    blame = result.whose_failures()
    assert f"circuit-breaker: {leaked}" in blame["docket"], blame
    assert "circuit-breaker: runs_to_the_end" in blame["agent"], blame  # and the agent's own
