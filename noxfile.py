"""Sessions: `nox -s gameday` (the main job), `tests` (the suite), `lint`, `bench`,
`report-check` (the game-day report in a headless browser), `demo`, `slow`,
`gameday-load` (the nine phases N times under CPU load), `gameday-toxiproxy` (a game
day and a chaos scenario against the real Toxiproxy server).

Each session makes its own virtualenv and installs what it needs, so a fresh
machine with only Python and pip runs any of them after `pip install nox`.
"""

import os
import shutil

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """The suite, including short versions of the long loops. Under ten minutes on 2 cores."""
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-m", "not slow", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    """The long loops in full (tests/test_slow_loops.py: the supervisor killed at 200
    points; the nine phases under two CPU hogs, DOCKET_LOAD_RUNS times, default 3)."""
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-m", "slow", *session.posargs)


@nox.session(name="gameday-load")
def gameday_load(session: nox.Session) -> None:
    """The nine phases N times (default 20) while two processes spin on the CPU; per
    phase, how many runs gave each verdict. Fails if any phase's verdict changed.
    `nox -s gameday-load -- --runs 2`, `-- --phase partition`, `-- --keep DIR`."""
    session.install(".")
    session.run("python", "-m", "chaos.gameday.load", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")  # pinned: formatting must not drift between machines
    session.run("ruff", "check", "docket", "chaos", "tests", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "docket", "chaos", "tests", "benchmarks", "noxfile.py")


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


@nox.session(name="report-check")
def report_check(session: nox.Session) -> None:
    """Open the game-day report in a real headless browser (Debian's chromium, installed
    here when missing) and check that it renders and that every internal link resolves."""
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
    session.run("python", "-m", "chaos.gameday.browser_check", report, "--browser", browser)


@nox.session
def demo(session: nox.Session) -> None:
    """Record, verify, tamper, watch verify name the break (a tour of the recorder alone)."""
    session.install("-e", ".")
    session.run("docket", "demo", *session.posargs)


@nox.session
def compare(session: nox.Session) -> None:
    """Two revisions of the boundary side by side in one run: `nox -s compare -- REV`
    (against the working tree; see docs/performance.md for why never across runs)."""
    session.install("-e", ".[test,fast]")
    session.run("python", "-m", "benchmarks.compare", *session.posargs)
