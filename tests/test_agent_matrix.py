"""Agents written the way teams write them, through the game-day phases.

Each shape in examples/agents/ is a real program (the openai or anthropic SDK,
streaming or not, raw httpx, asyncio) run by `docket game-day --agent-command
"python examples/agents/X.py" --agent-findings warn`. Two claims per cell
(shape x phase):

- **Docket's verdict does not depend on the agent's shape**: no check of the
  phase FAILs (a FAIL is a boundary invariant broken, whatever the agent did);
- **the agent's findings are the ones its code earns**: the checks that come out
  `finding` are exactly the ones named next to the shape below (`maybe` lists the
  few that depend on timing, each with why).

The suite runs the short form (a few shapes x one phase, about 30 s). The full
matrix (every shape x the nine phases, several minutes) runs under
`nox -s gameday-agents`, or `DOCKET_AGENT_MATRIX=full pytest tests/test_agent_matrix.py`,
or by hand: `python tests/test_agent_matrix.py [--shape NAME] [--phase NAME]
[--json FILE]`, which prints the table shape x phase -> Docket's verdict, the
agent's findings. Each run's report stays under the folder given by
DOCKET_AGENT_MATRIX_OUT (default: a temporary folder) for reading afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "examples" / "agents"
PHASES = (
    "upstream-failure",
    "upstream-latency",
    "circuit-breaker",
    "partition",
    "retry-storm",
    "runaway-loop",
    "ledger-pressure",
    "evidence-loss",
    "supervisor-killed",
)
DAY_TIMEOUT_S = 600  # one shape through all nine phases: a bound on a hung day, not a target


@dataclass(frozen=True)
class Shape:
    """An agent program and the findings its code earns."""

    script: str  # examples/agents/NAME
    about: str
    # check -> the phases (or PHASE:RUN, one run of a phase) where its code earns that
    # finding: in each, every run in which the agent made a call and the check was shown
    # must say `finding` (and the full matrix must show it at least once)
    earns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # check -> why it may come out `finding` or not (timing, the phase), in any phase
    maybe: Mapping[str, str] = field(default_factory=dict)

    def command(self, tree: Path) -> str:
        where = "examples/agents" if tree == ROOT else str(AGENTS)
        return f"{sys.executable} {where}/{self.script}"


# The SDKs wait out a Retry-After before their own retry of that request; after their last
# retry the application's next task goes at once, so a hint on a call's last failure is
# not waited for. Whether a call fails all three tries is up to the phase's seed and timing.
SDK_HINT = "the SDK honours a Retry-After for its own retry, not across the app's next task"
# A cap's 403 is not retried by an SDK, but each of these goes on to its next task, which
# the cap denies again: the finding its code earns (where its calls meet the cap at all).
GOES_ON = {"no_retry_on_cap_denial": ("runaway-loop",)}

SHAPES: dict[str, Shape] = {
    "openai-sdk": Shape(
        "openai_sdk.py",
        "openai SDK, non-streaming, SDK retries at their default, a failed task skipped",
        earns=GOES_ON,
        maybe={"honours_retry_after": SDK_HINT},
    ),
    "openai-sdk-stream": Shape(
        "openai_sdk_stream.py",
        "openai SDK, stream=True on every call, no stream_options; a cut stream is an "
        "APIConnectionError, which its except catches",
        earns=GOES_ON,
        maybe={"honours_retry_after": SDK_HINT},
    ),
    "anthropic-sdk": Shape(
        "anthropic_sdk.py",
        "anthropic SDK, messages.create",
        earns=GOES_ON,
        maybe={"honours_retry_after": SDK_HINT},
    ),
    "anthropic-sdk-stream": Shape(
        "anthropic_sdk_stream.py",
        "anthropic SDK, messages.stream, `except anthropic.APIError` like the openai one",
        # upstream-failure cuts its first stream: this SDK raises the transport's own
        # RemoteProtocolError, which its except does not catch, and the program crashes
        earns={
            **GOES_ON,
            "handles_cut_stream": ("upstream-failure",),
            "runs_to_the_end": ("upstream-failure",),
        },
        maybe={"honours_retry_after": SDK_HINT},
    ),
    "httpx-retry": Shape(
        "httpx_retry.py",
        "raw httpx, its own retry loop: full jitter, Retry-After as a floor, stops on a 403",
        # earns nothing: the careful agent the resilience guides describe
    ),
    "gives-up": Shape(
        "gives_up.py",
        "raw httpx, raise_for_status: exit 1 at its first error",
        # its first 503 (upstream-failure, circuit-breaker), its first timeout
        # (upstream-latency), the cap's refusal (runaway-loop's deny run)
        earns={
            "runs_to_the_end": (
                "upstream-failure",
                "upstream-latency",
                "circuit-breaker",
                "runaway-loop:deny",
            ),
        },
        maybe={
            "runs_to_the_end": "wherever else an error meets it first (partition's black "
            "hole, retry-storm's 429, when its calls fall in their window; runaway-loop's "
            "kill run, where the cap's SIGTERM may reach it before any refusal does)",
        },  # fmt: skip
    ),
    "fixed-time": Shape(
        "fixed_time.py",
        "openai SDK, ignores DOCKET_AGENT_* and calls every 100 ms for 3 s",
        maybe={
            "honours_retry_after": SDK_HINT,
            "no_retry_on_cap_denial": "it goes on after a 403, but runs 3 s from its own "
            "start: whether its calls meet the cap is timing",
        },
    ),
    "fanout-8": Shape(
        "fanout.py",
        "asyncio + AsyncOpenAI, eight calls in flight",
        earns=GOES_ON,
        maybe={
            "honours_retry_after": "the SDK waits out a hint for that request's own retry; "
            "the other seven workers go on starting calls, and the check reads the agent whole",
        },
    ),
    "hammer": Shape(
        "hammer.py",
        "raw httpx, four threads, retries at once up to ten times, never reads Retry-After",
        earns={
            "honours_retry_after": (
                "upstream-failure",
                "upstream-latency",
                "circuit-breaker",
                "retry-storm",
            ),
            "no_retry_on_cap_denial": ("runaway-loop",),
        },  # fmt: skip
        maybe={
            "backs_off_with_jitter": "its retries come at once, but most of its failures "
            "carry a Retry-After, which this check leaves to honours_retry_after",
            "max_attempts": "ten tries, but a call's attempts are counted up to its last "
            "forwarded one (a refusal carries no body digest): a finding only where five of "
            "one call's tries were forwarded and failed (seen in partition, circuit-breaker)",
        },
    ),
}


# ---------------------------------------------------------------- running a day


@dataclass
class Cell:
    """One shape through one phase: Docket's verdict and the agent's findings."""

    shape: str
    phase: str
    verdict: str  # the phase's: pass | fail | unknown | missing
    failed: list[str] = field(default_factory=list)  # Docket's checks that FAILed
    unknown: list[str] = field(default_factory=list)  # checks not judged, with the reason
    findings: list[str] = field(default_factory=list)  # agent checks that came out `finding`
    # per run of the phase: {"run", "calls", "exit", "checks": {check: verdict}}
    runs: list[dict] = field(default_factory=list)
    why_not: str = ""  # the phase took no user agent, and why
    error: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


def tree() -> Path:
    """The source tree whose Docket is judged: this checkout, or DOCKET_AGENT_MATRIX_TREE
    (e.g. `git archive COMMIT` unpacked: a committed state while the checkout is being
    edited); the agents are always this checkout's."""
    return Path(os.environ.get("DOCKET_AGENT_MATRIX_TREE") or ROOT).resolve()


def game_day(shape: Shape, phases: Sequence[str], report: Path) -> tuple[int, dict, str]:
    """`docket game-day` with the shape's program as the agent; (exit, gameday.json, output)."""
    here = tree()
    args = [sys.executable, "-m", "docket", "game-day", "--report", str(report)]
    for phase in phases:
        args += ["--phase", phase]
    args += ["--agent-command", shape.command(here), "--agent-findings", "warn"]
    env = dict(os.environ)
    if here != ROOT:  # every python -m the day starts imports that tree's docket and chaos
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(here), env.get("PYTHONPATH")]))
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=DAY_TIMEOUT_S, cwd=here, env=env,
        check=False,
    )  # fmt: skip
    path = report / "gameday.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    return done.returncode, data, done.stdout + done.stderr


def cells_of(name: str, phases: Sequence[str], data: Mapping, output: str) -> list[Cell]:
    by_name = {p["name"]: p for p in data.get("phases", ())}
    out = []
    for phase in phases:
        p = by_name.get(phase)
        if p is None:
            out.append(Cell(name, phase, "missing", error=output.strip()[-300:]))
            continue
        cell = Cell(name, phase, p["verdict"], error=p.get("error") or "")
        for check in p["checks"]:
            label = (
                check["name"]
                if check.get("run", "run") == "run"
                else f"{check['run']}: {check['name']}"
            )
            if check["verdict"] == "fail":
                cell.failed.append(label)
            elif check["verdict"] == "unknown":
                cell.unknown.append(f"{label} ({check.get('reason', '')[:160]})")
        cell.why_not = (p.get("your_agent") or {}).get("why_not", "")
        for run in p.get("runs", ()):
            yours = run.get("your_agent") or {}
            checks = {f["check"]: f["verdict"] for f in yours.get("findings", ())}
            cell.runs.append(
                {"run": run["name"], "calls": yours.get("calls"),
                 "exit": yours.get("exit"), "checks": checks}
            )  # fmt: skip
            for check, verdict in checks.items():
                if verdict == "finding" and check not in cell.findings:
                    cell.findings.append(check)
            if run.get("error") and not cell.error:
                cell.error = run["error"]
        out.append(cell)
    return out


def run_shape(name: str, phases: Sequence[str], folder: Path) -> list[Cell]:
    shape = SHAPES[name]
    _, data, output = game_day(shape, phases, folder / name)
    return cells_of(name, phases, data, output)


def problems(cell: Cell) -> list[str]:
    """What is wrong with a cell: a Docket FAIL, an unknown, findings not earned or missing."""
    shape = SHAPES[cell.shape]
    out = []
    where = f"{cell.shape} x {cell.phase}"
    if cell.verdict == "fail":
        out.append(f"{where}: Docket FAIL: {'; '.join(cell.failed)}")
    elif cell.verdict != "pass":
        why = "; ".join(cell.unknown[:2]) or cell.error
        out.append(f"{where}: {cell.verdict.upper()}: {why}"[:400])
    for run in cell.runs:
        at = where if run["run"] == "run" else f"{where} ({run['run']})"

        here = (cell.phase, f"{cell.phase}:{run['run']}")  # the phase, or this run of it

        def earned_in(phases: Sequence[str], here: tuple[str, str] = here) -> bool:
            return any(p in phases for p in here)

        for check, verdict in run["checks"].items():
            earned = earned_in(shape.earns.get(check, ()))
            if verdict == "finding" and not earned and check not in shape.maybe:
                out.append(f"{at}: {check} is a finding its code does not earn ({run})")
        missing = [
            check
            for check, phases in shape.earns.items()
            if earned_in(phases)
            and run["calls"]
            and run["checks"].get(check, "not_shown") not in ("finding", "not_shown")
        ]
        if missing:
            out.append(f"{at}: findings its code earns, not found: {', '.join(missing)} ({run})")
    return out


def never_shown(cells: Sequence[Cell]) -> list[str]:
    """Findings a shape earns that no cell of the matrix showed: the matrix never drove them."""
    out = []
    for name in dict.fromkeys(c.shape for c in cells):
        found = {f for c in cells if c.shape == name for f in c.findings}
        for check in SHAPES[name].earns:
            if check not in found:
                out.append(f"{name}: earns {check}, but no phase showed it")
    return out


# ---------------------------------------------------------------- the table


def table(cells: Sequence[Cell]) -> str:
    """Markdown: one row per shape, one column per phase: verdict; findings."""
    phases = [p for p in PHASES if any(c.phase == p for c in cells)]
    shapes = list(dict.fromkeys(c.shape for c in cells))
    at = {(c.shape, c.phase): c for c in cells}
    lines = [
        "| shape | " + " | ".join(phases) + " |",
        "|---|" + "---|" * len(phases),
    ]
    for s in shapes:
        row = []
        for p in phases:
            c = at.get((s, p))
            if c is None:
                row.append("")
                continue
            text = c.verdict.upper()
            if c.failed:
                text += f" ({len(c.failed)} failed)"
            if c.why_not:
                text += " (own agents)"
            if c.findings:
                text += ": " + ", ".join(c.findings)
            row.append(text)
        lines.append(f"| {s} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def matrix(shapes: Sequence[str], phases: Sequence[str], folder: Path) -> list[Cell]:
    cells: list[Cell] = []
    for name in shapes:
        cells += run_shape(name, phases, folder)
        print(table([c for c in cells if c.shape == name]).splitlines()[-1], flush=True)
    return cells


def _folder() -> Path:
    out = os.environ.get("DOCKET_AGENT_MATRIX_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        return Path(out)
    return Path(tempfile.mkdtemp(prefix="agent-matrix-"))


# ---------------------------------------------------------------- the tests

# The short form: three shapes whose code differs most, each through the phase that tells
# it apart (under 30 s on 2 idle cores). The streaming openai agent's body-for-body FAIL and
# the anthropic agent on create are in tests/test_gameday_your_agent.py and the full matrix.
SHORT = [
    pytest.param("hammer", "retry-storm", id="hammer-retry-storm"),
    pytest.param("gives-up", "circuit-breaker", id="gives-up-circuit-breaker"),
    pytest.param("anthropic-sdk-stream", "upstream-failure", id="anthropic-stream-cut"),
]


@pytest.mark.parametrize(("name", "phase"), SHORT)
def test_a_shape_through_a_phase(tmp_path: Path, name: str, phase: str):
    (cell,) = run_shape(name, [phase], tmp_path)
    assert problems(cell) == [], json.dumps(cell.to_json(), indent=1)
    earned = {
        c for c, phases in SHAPES[name].earns.items()
        if phase in phases or any(p.startswith(f"{phase}:") for p in phases)
    }  # fmt: skip
    ran = [r for r in cell.runs if r["calls"]]
    if earned and ran:  # what its code earns is named, and was found
        assert earned <= set(cell.findings), json.dumps(cell.to_json(), indent=1)


def test_every_shape_is_a_program_that_ends_by_itself():
    """Each shape exists, is bounded (a call count or a time), and imports its SDK itself."""
    for name, shape in SHAPES.items():
        text = (AGENTS / shape.script).read_text()
        assert "DOCKET_AGENT_CALLS" in text or "RUN_FOR_S" in text, name
        assert "raise SystemExit(" in text, name  # an exit status of its own
    assert len(SHAPES) >= 7
    from chaos.gameday.agent_checks import CHECKS

    for name, shape in SHAPES.items():
        assert set(shape.earns) | set(shape.maybe) <= set(CHECKS), name
        named = {p.split(":")[0] for phases in shape.earns.values() for p in phases}
        assert named <= set(PHASES), name


def _openai_sdk_through_an_open_breaker() -> list[dict]:
    """The openai-sdk shape in circuit-breaker, as its ledger had it (seqs 6-18): the SDK's
    three tries of one call fail, the breaker opens, and the NEXT call's first try
    (x-stainless-retry-count 0, recorded as client_attempt 0 on the refusal) is refused."""
    sha_a, sha_b = "a" * 64, "b" * 64

    def request(seq, ms, call, attempt, sha):
        return {"seq": seq, "mono_ms": ms, "type": "model.request", "provider": "openai",
                "call_id": call, "client_attempt": attempt, "request_sha256": sha}  # fmt: skip

    def error(seq, ms, call):
        return {"seq": seq, "mono_ms": ms, "type": "model.error", "provider": "openai",
                "call_id": call, "status": 503, "reason": "upstream_status"}  # fmt: skip

    return [
        request(6, 879, "c1", 0, sha_a), error(8, 882, "c1"),
        request(9, 1327, "c2", 1, sha_a), error(11, 1330, "c2"),
        request(12, 2261, "c3", 2, sha_a), error(14, 2263, "c3"),
        {"seq": 16, "mono_ms": 2266, "type": "x-docket.breaker-open", "provider": "openai",
         "client_attempt": 0, "retry_after_s": 0.297, "status": 503},
        request(18, 3270, "c4", 1, sha_b), error(20, 3272, "c4"),
    ]  # fmt: skip


def test_a_refused_first_try_is_a_new_call_not_a_retry():
    """Found by the matrix (openai-sdk x circuit-breaker: a false backs_off_with_jitter
    finding, 'retry 3 at seq 16: 0.003 s after the failure at seq 14'). The SDK gave up
    after its three tries and the app moved on: no retry came at once."""
    from chaos.gameday.agent_checks import FINDING, backs_off_with_jitter

    found = backs_off_with_jitter(_openai_sdk_through_an_open_breaker(), ["openai"])
    assert found.verdict != FINDING, found


def test_a_deferral_retried_is_not_a_cap_denial_retried():
    """Found by the matrix (httpx-retry x runaway-loop deny, its ledger's seqs 324 and 330):
    the agent's call was deferred (429, would_fit_after_settle), it waited and retried as
    told, was denied (403), and stopped. It never retried a denial."""
    from chaos.gameday.agent_checks import FINDING, no_retry_on_cap_denial

    def refusal(seq, ms, error_type, fits):
        return {"seq": seq, "mono_ms": ms, "type": "policy.denied", "provider": "your-openai",
                "rule": "caps.max_usd", "cap": "max_usd", "error_type": error_type,
                "would_fit_after_settle": fits}  # fmt: skip

    events = [
        refusal(324, 6476, "docket_caps_pending", True),
        refusal(330, 7504, "docket_policy_denied", False),
    ]
    found = no_retry_on_cap_denial(events, ["your-openai"])
    assert found.verdict != FINDING, found


@pytest.mark.skipif(
    os.environ.get("DOCKET_AGENT_MATRIX") != "full",
    reason="the full matrix (9 shapes x 9 phases, minutes): nox -s gameday-agents",
)
def test_the_full_matrix():
    folder = _folder()
    cells = matrix(list(SHAPES), PHASES, folder)
    (folder / "agent-matrix.json").write_text(json.dumps([c.to_json() for c in cells], indent=1))
    (folder / "agent-matrix.md").write_text(table(cells) + "\n")
    print("\n" + table(cells))
    wrong = [p for c in cells for p in problems(c)] + never_shown(cells)
    assert wrong == [], "\n".join(wrong)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="agent shapes x game-day phases")
    parser.add_argument("--shape", action="append", choices=list(SHAPES))
    parser.add_argument("--phase", action="append", choices=list(PHASES))
    parser.add_argument("--json", help="write the cells here as JSON")
    args = parser.parse_args(argv)
    folder = _folder()
    cells = matrix(args.shape or list(SHAPES), args.phase or list(PHASES), folder)
    print("\n" + table(cells))
    wrong = [p for c in cells for p in problems(c)]
    if not args.shape and not args.phase:
        wrong += never_shown(cells)
    print("\n".join(["", f"{len(wrong)} problems:", *wrong]) if wrong else "\nno problems")
    print(f"reports: {folder}")
    if args.json:
        Path(args.json).write_text(json.dumps([c.to_json() for c in cells], indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
