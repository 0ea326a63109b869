"""The oracle itself is tested: nine regressions, each planted in the code a game-day
phase exercises, must each end that phase as FAIL with exit 1, naming the checks that
caught it, never as "unknown" (exit 2) and never as a pass.

Every planted phase is an in-process phase: its boundary (breaker, caps), its stub
providers and its embedded fault proxy all run in this process (chaos.run.here.run_here),
and only the agents are child processes. So each regression is planted with
pytest's monkeypatch on the real class or function, the phase runs through the real
runner (chaos.gameday.runner.game_day), and the patch is gone when the test ends.
No test hook in the harness is needed; a phase whose run were in a child process
(mode: subprocess, or a supervisor-killing fault) could not be planted this way.
"""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass(frozen=True)
class Mutant:
    plant: object
    phase: str
    catches: frozenset[str]  # checks that must fail (others may fail too)

    @property
    def id(self) -> str:
        return self.plant.__name__


OPENED = "the breaker opened"
CYCLE = "the whole cycle is in the ledger"
MUTANTS = [
    Mutant(breaker_never_opens, "circuit-breaker", frozenset({OPENED, CYCLE})),
    Mutant(status_503_not_a_failure, "circuit-breaker", frozenset({OPENED, CYCLE})),
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
    ),
    Mutant(
        in_flight_ignored,
        "runaway-loop:deny",
        frozenset({"no more calls were in flight than the cap holds at their worst case (7)"}),
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
    ),
    Mutant(
        timeout_passes_data,
        "partition",
        frozenset({"the black hole shows as calls that timed out at the boundary"}),
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
    ),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_a_planted_regression_fails_its_phase(mutant, monkeypatch):
    (phase,) = load_phases([mutant.phase])
    mutant.plant(monkeypatch)
    result = game_day([phase])
    assert not result.interrupted
    (judged,) = result.phases
    by_verdict = {
        v: {c.check.name for c in judged.checks if c.verdict == v} for v in (FAIL, UNKNOWN)
    }
    shown = {c.check.name: (c.verdict, c.check.reason) for c in judged.checks}
    assert result.exit_code == EXIT_FAIL, shown
    assert judged.verdict == FAIL
    assert mutant.catches <= by_verdict[FAIL], shown
    # A regression is read as an observation: nothing in these phases is left unjudged.
    assert by_verdict[UNKNOWN] == set(), shown


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
