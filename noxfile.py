"""Sessions: `nox -s tests` (the suite), `lint`, `bench`, `demo` (the main job for now).

Each session makes its own virtualenv and installs what it needs, so a fresh
machine with only Python and pip runs any of them after `pip install nox`.
"""

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
    """The long loops in full (kill-anywhere, soak)."""
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-m", "slow", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")  # pinned: formatting must not drift between machines
    session.run("ruff", "check", "docket", "chaos", "tests", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "docket", "chaos", "tests", "benchmarks", "noxfile.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks under benchmarks/; each writes JSON to benchmarks/results/."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job until the game day exists: record, verify, tamper, watch verify name the break."""
    session.install("-e", ".")
    session.run("docket", "demo", *session.posargs)
