"""Sessions: `nox -s gameday` (the main job), `tests` (the suite), `coverage` (the
suite's traced tests, held to the coverage floors), `lint`, `bench`,
`report-check` (the game-day report in a headless browser), `demo`, `slow`, `attack`,
`mutants` (a regression planted per game-day claim, each failing its phase),
`gameday-load` (the nine phases N times under CPU load), `gameday-toxiproxy` (a game
day and a chaos scenario against the real Toxiproxy server), `verifiers` (the Python,
JavaScript and Go verifiers over the vectors and 1,000 mutations), `peers` (Docket's
boundary beside LiteLLM's proxy, from PyPI), `soak` (the boundary's memory over run length),
`otel` (a chaos run exported to a real Arize Phoenix, from PyPI, and read back).
`fleet` (the fleet partition scenario and the fleet budget's long tests, against a
PostgreSQL they start).

Each session makes its own virtualenv and installs what it needs, so a fresh
machine with only Python and pip runs any of them after `pip install nox`.
"""

import os
import shutil
import time

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


# Branch-coverage floors, in percent, of the rooms whose every line is evidence: `nox -s
# coverage` fails below them. Measured on the whole suite at d0da5b2 (2026-12-01): ledger 92.6,
# guards 98.5, receipts 95.5; each floor sits half a point under, since a few branches
# (a short write, a lock held by another process) are taken only under some timings.
COVERAGE_FLOORS = {"docket/ledger": 92.0, "docket/guards": 98.0, "docket/receipts": 95.0}


def busy_cores(window_s: float = 1.0) -> float:
    """How many cores other work keeps busy now: /proc/stat's non-idle time over a short
    window, in cores (0.0 where /proc/stat cannot be read)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values) - idle, sum(values)

    try:
        busy0, total0 = sample()
        time.sleep(window_s)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError) as exc:
        print(f"nox: cannot read /proc/stat ({exc}): sizing the suite for an idle machine")
        return 0.0
    if total1 <= total0:
        return 0.0
    return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def test_workers() -> int:
    """pytest-xdist workers for the suite: one per core on an idle machine, and one more
    for every two cores other work keeps busy (up to twice the cores). Measured on the
    2-core machine (docs/testing.md): idle, two workers took 268-300 s and four 294-321 s
    (more CPU, to contention); beside two CPU hogs, two workers took 541-605 s, three
    476 s and four 410-412 s, but with four the game day's timing-bound phases failed
    one run in two (an agent's 2 s read timeout, a retry window), so three it is: a
    worker waiting on a process or a timeout leaves its core to the hogs, and the third
    keeps the suite's share. DOCKET_TEST_WORKERS=N fixes the count."""
    fixed = os.environ.get("DOCKET_TEST_WORKERS", "")
    if fixed:
        if not fixed.isdigit() or not 1 <= int(fixed) <= 64:
            raise SystemExit(f"DOCKET_TEST_WORKERS must be a whole number 1-64, got {fixed!r}")
        return int(fixed)
    cores = os.cpu_count() or 1
    return min(2 * cores, cores + round(busy_cores() / 2))


@nox.session
def tests(session: nox.Session) -> None:
    """The suite, including short versions of the long loops, in pytest-xdist workers
    (work stealing): one per core, and one more per two cores other work keeps busy
    (test_workers; docs/testing.md has the figures for 2, 3 and 4 workers). Untraced:
    `nox -s coverage` holds the floors (CI runs both), since branch tracing made the
    traced tests ~26% slower (154.6 s without, 194.8 s with, 2026-12-03).
    `nox -s tests -- tests/test_x.py` runs a part, in one process unless given `-n 2`."""
    session.install("-e", ".[test]")
    # The suite starts hundreds of Python processes (docket run, its launcher, agents):
    # with PYTHONDONTWRITEBYTECODE set (some shells and CI images set it), each compiled
    # docket from source, 0.15 s of CPU a `docket run`, and each worker re-rewrote every
    # test module's asserts. Bytecode goes to __pycache__ (git-ignored) once instead.
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    if session.posargs:
        session.run("pytest", "-q", "-m", "not slow", *session.posargs)
        return
    workers = test_workers()
    session.log(
        f"{workers} workers (test_workers: the cores, plus one per two other work keeps busy)"
    )
    session.run("pytest", "-q", "-m", "not slow", "-n", str(workers), "--dist", "worksteal")


@nox.session
def coverage(session: nox.Session) -> None:
    """Branch coverage of the rooms whose every line is evidence, held to COVERAGE_FLOORS:
    the suite's tests that trace them (DOCKET_COVERAGE_RUN leaves out the files
    tests/conftest.py UNTRACED lists, which would run untraced anyway), under pytest-cov.
    CI runs it beside `tests`."""
    session.install("-e", ".[test]", "pytest-cov>=5")
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    session.env["DOCKET_COVERAGE_RUN"] = "1"
    rooms = [f"--cov={folder.replace('/', '.')}" for folder in COVERAGE_FLOORS]
    session.run(
        "pytest", "-q", "-m", "not slow", "-n", str(test_workers()), "--dist", "worksteal",
        *rooms, "--cov-branch", "--cov-report=",
    )  # fmt: skip
    for folder, floor in COVERAGE_FLOORS.items():
        session.log(f"branch coverage of {folder} (floor {floor:g}%):")
        session.run(
            "coverage", "report", f"--include={folder}/*", "--format=total", "--precision=1",
            f"--fail-under={floor}",
        )  # fmt: skip


@nox.session
def slow(session: nox.Session) -> None:
    """The long loops in full (tests/test_slow_loops.py: the supervisor killed at 200
    points; the nine phases under two CPU hogs, DOCKET_LOAD_RUNS times, default 3), then
    every hypothesis property again under the `thorough` profile (twenty times the suite's
    examples: tests/conftest.py)."""
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-m", "slow", *session.posargs)
    session.run(
        "pytest", "-q", "-n", "2", "-m", "hypothesis and not slow",
        "--hypothesis-profile", "thorough", *session.posargs,
    )  # fmt: skip


@nox.session
def fleet(session: nox.Session) -> None:
    """The fleet budget from one command: the partition scenario (four `docket run`
    boundaries under one cap while the database is slowed, reset, black-holed for 10 s
    and restarted: `python -m chaos.fleet scenarios/fleet-partition.yaml`, exit 1 when a
    check fails), then the fleet's long tests (tests/test_fleet_runs.py and
    tests/test_fleet_faults.py, slow: eight callers per boundary, one boundary
    SIGKILLed, two budgets in one database, a 10 s black hole, a restart under four
    boundaries) and every fleet test beside them, against PostgreSQL clusters they start
    themselves (chaos/fleet/postgres.py; the tests skip without initdb)."""
    session.install("-e", ".[test]")
    run = os.path.join(session.create_tmp(), time.strftime("fleet-partition-%Y%m%dT%H%M%S"))
    session.run("python", "-m", "chaos.fleet", "scenarios/fleet-partition.yaml", "--dir", run)
    session.run(
        "pytest", "-q", "-s", "tests/test_fleet_runs.py", "tests/test_fleet_store.py",
        "tests/test_fleet_escrow.py", "tests/test_fleet_boundary.py",
        "tests/test_fleet_command.py", "tests/test_fleet_policy.py", "tests/test_fleet_faults.py",
        "tests/test_fleet_settle.py", "tests/test_fleet_store_model.py",
        "tests/test_fleet_scenario.py",
        *session.posargs,
    )  # fmt: skip


@nox.session
def verifiers(session: nox.Session) -> None:
    """The three verifiers of spec/docket-receipt-1.md: `go test` in verify-go/ (its own
    run over the vectors), then tests/test_verifiers_differential.py with 1,000 seeded
    mutations of real pairs (the suite runs 200) plus every vector through node and the
    Go binary, and tests/test_vectors.py for Python. A verifier whose folder or tool is
    missing is skipped with the reason (pytest's summary names it); disagreements are
    written under vector-candidates/. DOCKET_DIFFERENTIAL_CASES=N for another count."""
    session.install("-e", ".[test]")
    cases = os.environ.get("DOCKET_DIFFERENTIAL_CASES", "1000")
    go = shutil.which("go")
    if go and os.path.isdir("verify-go"):
        with session.chdir("verify-go"):
            session.run(go, "test", "./...", external=True, env={"GOPROXY": "off"})
    else:
        why = (
            "no verify-go/ in this tree" if go else "go is not on PATH (apt-get install golang-go)"
        )
        session.log(f"go test skipped: {why}")
    session.run(
        "pytest", "-q", "-s", "tests/test_verifiers_differential.py", "tests/test_vectors.py",
        *session.posargs, env={"DOCKET_DIFFERENTIAL_CASES": cases},
    )  # fmt: skip


@nox.session(name="gameday-load")
def gameday_load(session: nox.Session) -> None:
    """The nine phases N times (default 20) while two processes spin on the CPU; per
    phase, how many runs gave each verdict. Fails if any phase's verdict changed.
    `nox -s gameday-load -- --runs 2`, `-- --phase partition`, `-- --keep DIR`."""
    session.install(".")
    session.run("python", "-m", "chaos.gameday.load", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, then mypy over docket/ and chaos/ ([tool.mypy] in pyproject.toml). Both pinned:
    a new release's rules must not fail a tree nobody changed. mypy needs Docket's own
    dependencies installed to see their types (trio, h11, httpx...), and the optional ones
    its rooms import (opentelemetry for docket/export, pytest for the replay plugin,
    psycopg for docket/fleet): the test extra holds them all, so mypy reads the same
    libraries here as in a developer's venv."""
    session.install("ruff==0.17.6", "mypy==2.4.1", "-e", ".[test]")
    session.run("ruff", "check", "docket", "chaos", "tests", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "docket", "chaos", "tests", "benchmarks", "noxfile.py")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks under benchmarks/; each writes JSON to benchmarks/results/ (with the h11
    in use: the [fast] extra's compiled one, since the figures are the best Docket does)."""
    session.install("-e", ".[test,fast]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def gameday(session: nox.Session) -> None:
    """The main job: the nine game-day phases, judged from the evidence, and the report.

    Installs Docket as a wheel (not editable), so the packaged phase files, templates
    and FMEA table are the ones exercised. The report lands in gameday-report/.
    """
    session.install(".")
    session.run("docket", "game-day", "--report", "gameday-report", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """The oracle tested: every regression in tests/test_gameday_mutants.py, one per
    claim a game-day phase makes about Docket (the FMEA rows it stands for), each
    planted in real code (docket/, or the harness's stub and proxy where the claim is
    theirs) and run through its phase, which must end FAIL with exit 1 naming the
    aimed checks, none unknown. One phase at a time: 2-10 s each, ~2 min in all
    (docs/testing.md has the figures). The suite runs a short form of the three
    cheapest (tests/test_gameday_mutants.py SHORT). `nox -s mutants -- -k partition`."""
    session.install("-e", ".[test]")
    session.run(
        "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
        "tests/test_gameday_mutants.py", *session.posargs, env={"DOCKET_MUTANTS": "full"},
    )  # fmt: skip


@nox.session(name="gameday-agents")
def gameday_agents(session: nox.Session) -> None:
    """Agents as teams write them (examples/agents/: the openai and anthropic SDKs,
    streaming or not, raw httpx, a fan-out of 8, a hammer...) x the nine phases, with
    `--agent-findings warn`: no Docket check FAILs for any of them, and each agent's
    findings are the ones its code earns (tests/test_agent_matrix.py). Prints the table
    and leaves it, with every run's report, in .nox/gameday-agents/tmp/agent-matrix/
    (agent-matrix.md, agent-matrix.json)."""
    session.install("-e", ".[test]")
    out = os.path.join(session.create_tmp(), "agent-matrix")
    session.run(
        "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_agent_matrix.py",
        "-k", "full_matrix", *session.posargs,
        env={"DOCKET_AGENT_MATRIX": "full", "DOCKET_AGENT_MATRIX_OUT": out},
    )  # fmt: skip


@nox.session(name="gameday-toxiproxy")
def gameday_toxiproxy(session: nox.Session) -> None:
    """The game day and a chaos scenario against the real Toxiproxy server (Shopify's
    toxiproxy-server: $TOXIPROXY_SERVER, or ../shared/tools/toxiproxy/ beside the clone),
    started on a free port of 127.0.0.1 and stopped by its pid afterwards. Everything
    else keeps the embedded proxy. Fails (exit 3, one line) where the server is absent.
    The report lands in gameday-report-toxiproxy/."""
    session.install(".")
    tmp = session.create_tmp()
    run_dir = os.path.join(tmp, f"partition-{time.time_ns()}")
    session.run(
        "python", "-m", "chaos.toxiproxy.real", "--log", os.path.join(tmp, "toxiproxy.log"), "--",
        "docket", "game-day", "--toxiproxy", "{url}", "--report", "gameday-report-toxiproxy",
        ";;",
        "docket", "chaos", "--scenario", "scenarios/partition.yaml", "--toxiproxy", "{url}",
        "--dir", run_dir,
    )  # fmt: skip
    # the scenario's exit says the run ended well, not that the fault acted: check that
    # its toxic was added and lifted on the real server, and that the receipt verifies
    session.run("python", "-c", _PERFORMED, os.path.join(run_dir, "injected.jsonl"))
    session.run("docket", "verify", os.path.join(run_dir, "receipt.json"))


_PERFORMED = """
import json, sys
actions = [json.loads(line).get("action") for line in open(sys.argv[1])]
if actions.count("toxic_added") < 1 or actions.count("toxic_removed") < 1:
    sys.exit(f"the partition scenario performed no fault on the real Toxiproxy: {actions}")
print(f"faults performed on the real Toxiproxy: {actions}")
"""


@nox.session
def otel(session: nox.Session) -> None:
    """`docket export otel` against a real Arize Phoenix (arize-phoenix from PyPI, started
    offline on 127.0.0.1 by chaos/phoenix.py and stopped by its pid): the runs of a game
    day (all nine phases, their kept folders) exported twice each, their spans read back
    from Phoenix's API and held to the ledgers (docs/export.md)."""
    session.install(".[otel]", "arize-phoenix")
    work = os.path.join(session.create_tmp(), f"otel-{time.time_ns()}")
    keep, report = os.path.join(work, "keep"), os.path.join(work, "report")
    # a day whose verdicts are not all PASS still has runs to export: 1 is not this session's failure
    session.run("docket", "game-day", "--keep", keep, "--report", report, success_codes=[0, 1])
    session.run("python", "-m", "chaos.phoenix", keep)


@nox.session(name="report-check")
def report_check(session: nox.Session) -> None:
    """Open the game-day report in a real headless browser (Debian's chromium, installed
    here when missing) and check that it renders, that every internal link resolves and
    that no table cell reaches past a 1366 px window (a long value wraps)."""
    session.install(".")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        session.run("apt-get", "update", "-q", external=True)
        session.run(
            "apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium", external=True
        )
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
    report = "gameday-report/index.html"
    if not os.path.exists(report) or "--fresh" in session.posargs:
        # a report is a report whatever its verdicts: exit 1 or 2 is not this session's failure
        session.run("docket", "game-day", "--report", "gameday-report", success_codes=[0, 1, 2])
    # the layout check's picture: the first phase that did not pass, at 1366x900
    shot = os.path.join(session.create_tmp(), "failing-phase-1366.png")
    session.run(
        "python", "-m", "chaos.gameday.browser_check", report, "--browser", browser,
        "--wide-screenshot", shot,
    )  # fmt: skip


@nox.session
def attack(session: nox.Session) -> None:
    """The attack suite in full (chaos/attack/): malformed HTTP, ledger and receipt
    mutations, planted secrets, bad inputs, a disk filled mid-run (root only). Prints
    each family's figures (tried / good) and every failure's reproduction, writes
    attack-results.json; exit 1 when a probe failed. A few minutes on 2 cores."""
    session.install(".")
    session.run("python", "-m", "chaos.attack", "--json", "attack-results.json", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """Record, verify, tamper, watch verify name the break (a tour of the recorder alone)."""
    session.install("-e", ".")
    session.run("docket", "demo", *session.posargs)


@nox.session
def selftest(session: nox.Session) -> None:
    """`docket selftest` from a real (not editable) install: every check, and the spec's
    vectors as the wheel ships them (docket.selftest.vectors). Seconds."""
    session.install(".")
    session.run("docket", "selftest", *session.posargs)


@nox.session
def compare(session: nox.Session) -> None:
    """Two revisions of the boundary side by side in one run: `nox -s compare -- REV`
    (against the working tree; see docs/performance.md for why never across runs)."""
    session.install("-e", ".[test,fast]")
    session.run("python", "-m", "benchmarks.compare", *session.posargs)


# The peer measured against, pinned to the version the committed figures were taken with
# (docs/measurements/2026-12-01-2core/load.md): a newer LiteLLM is a new measurement.
LITELLM = "litellm[proxy]==1.108.7"


@nox.session
def peers(session: nox.Session) -> None:
    """Docket's boundary beside LiteLLM's proxy over one stub, in one run: added latency
    (alternating calls), calls/s at 32 clients, Docket at 1/8/32 clients. Needs PyPI (it
    installs LiteLLM), so CI does not run it. Writes benchmarks/results/peers.{json,md};
    `nox -s peers -- --report DIR` also DIR/load.{md,json}; `-- --quick` for a smoke run."""
    session.install("-e", ".[fast]", LITELLM)
    session.run("python", "-m", "benchmarks.bench_peers", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """The boundary's resident memory over runs of 5k, 10k and 30k calls (a 6x range):
    exit 1 if it grows per event. Writes benchmarks/results/soak.{json,md}; `nox -s soak
    -- --report DIR` also DIR/soak.{md,json}; `-- --lengths 500,1000,3000` for a short one."""
    session.install("-e", ".[fast]")
    session.run("python", "-m", "benchmarks.bench_soak", *session.posargs)
