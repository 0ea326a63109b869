"""The pytest plugin: an agent's tests run against a recorded run, offline and free.

    @pytest.mark.docket_replay("tests/runs/greet", policy="tests/runs/docket.toml")
    def test_greets(docket_replay):
        assert agent.greet("Ada").startswith("Hello")

For each marked test the plugin starts `docket replay RUN --ledger-dir DIR -- python -m
docket.replay.hold ...` (the real command, with all its checks: the recording's
receipt verified, a boundary, a ledger, a receipt) and gives the test the environment
docket gives its agent: OPENAI_BASE_URL / ANTHROPIC_BASE_URL at the boundary, the run
token as the API key, DOCKET_RUN_TOKEN, the proxy variables. The test process is the
agent in fact (docket/replay/hold.py only holds the run open until the test is done),
so the code under test must make its SDK client after the fixture has set these (in
the test, or in a fixture that uses `docket_replay`).

`pytest --docket-record` records instead: `docket run` against the policy's real
providers, with record_bodies on (the policy must say `record_bodies = true`; it is
checked first), into the marker's folder, replacing the recording there once the run
ended well.

A test whose request has no recorded answer fails: the SDK gets the replay's
`docket_replay_miss` error, and the test's report carries a "docket replay" section
with the first divergence as a JSON diff against the nearest recorded call. A test that
passes although its replay diverged (the agent caught the error) is failed at teardown
with that diff. Each test's replay folder (ledger, receipt, the command's output) is
`<tmp_path>/docket/run`: removed when the test passes, kept on failure (pytest keeps the
last three runs' tmp_path folders) and named in the report.

Imports nothing heavy: the standard library and pytest; docket itself runs in the
subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

MARKER = "docket_replay"
START_SECONDS = 60.0  # docket replay verifying a recording and starting, on a loaded machine
STOP_SECONDS = 60.0
_POLL_SECONDS = 0.02
_SESSION = pytest.StashKey["ReplaySession"]()
_REPORTS = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("docket")
    group.addoption(
        "--docket-record",
        action="store_true",
        help="re-record each docket_replay test's run against the real providers "
        "(docket run, record_bodies on) instead of replaying it",
    )
    parser.addini("docket_policy", "the docket.toml recordings are made and replayed under")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(run, policy=None, match='exact', on_miss='fail', check=False): serve the "
        "test's model calls from a recorded run (docket replay); see docs/replay.md",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # the marker alone is enough: it brings its fixture
        names = getattr(item, "fixturenames", None)  # a test function's (not every Item's)
        marked = item.get_closest_marker(MARKER) is not None
        if marked and names is not None and MARKER not in names:
            names.append(MARKER)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    session = item.stash.get(_SESSION, None)
    if report.when == "call" and report.failed and session is not None:
        session.finish()
        report.sections.append(("docket replay", session.explain()))


@pytest.fixture
def docket_replay(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        pytest.fail(
            f"the {MARKER} fixture needs @pytest.mark.{MARKER}('tests/runs/NAME')", pytrace=False
        )
    session = ReplaySession.of(request.config, marker, tmp_path / "docket")
    session.start()
    request.node.stash[_SESSION] = session
    for name, value in session.agent_env().items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    yield session
    session.finish()
    failed = any(r.failed for r in request.node.stash.get(_REPORTS, {}).values())
    if failed:
        return  # the call's report has the docket replay section; the folder is kept
    if session.returncode != 0:
        pytest.fail(session.explain(), pytrace=False)
    session.settle()


class ReplaySession:
    """One test's `docket replay` (or, recording, `docket run`) subprocess."""

    def __init__(
        self,
        run: Path,
        work: Path,
        *,
        policy: Path | None,
        record: bool,
        match: str = "exact",
        on_miss: str = "fail",
        check: bool = False,
    ) -> None:
        self.run, self.work, self.policy, self.record = run, work, policy, record
        self.match, self.on_miss, self.check = match, on_miss, check
        self.folder = work / ("recording" if record else "run")  # the new run's ledger
        self.returncode: int | None = None
        self.stderr = ""
        self._proc: subprocess.Popen | None = None
        self._launched_env: dict[str, str] = {}
        self._held_env: dict[str, str] = {}

    @classmethod
    def of(cls, config: pytest.Config, marker: pytest.Mark, work: Path) -> ReplaySession:
        if len(marker.args) != 1 or not isinstance(marker.args[0], (str, os.PathLike)):
            pytest.fail(f"@{MARKER}: give the recorded run's folder, once", pytrace=False)
        root = config.rootpath
        policy = marker.kwargs.get("policy") or config.getini("docket_policy") or None
        return cls(
            root / marker.args[0],
            work,
            policy=None if policy is None else root / policy,
            record=bool(config.getoption("docket_record")),
            match=marker.kwargs.get("match", "exact"),
            on_miss=marker.kwargs.get("on_miss", "fail"),
            check=bool(marker.kwargs.get("check", False)),
        )

    def argv(self, hold: list[str]) -> list[str]:
        policy = ["--policy", str(self.policy)] if self.policy is not None else []
        if self.record:
            return [
                sys.executable,
                "-m",
                "docket",
                "run",
                *policy,
                "--ledger-dir",
                str(self.folder),
            ]
        argv = [sys.executable, "-m", "docket", "replay", str(self.run), *policy]
        argv += ["--ledger-dir", str(self.folder), "--match", self.match, "--on-miss", self.on_miss]
        return argv + (["--check"] if self.check else [])

    def start(self) -> None:
        if self.record:
            self._check_records_bodies()
        self.work.mkdir(parents=True, exist_ok=True)
        env_file, self._release = self.work / "agent-env.json", self.work / "release"
        hold = [sys.executable, "-m", "docket.replay.hold", str(env_file), str(self._release)]
        self._launched_env = dict(os.environ)
        self._err = (self.work / "docket.err").open("w+", encoding="utf-8")
        self._proc = subprocess.Popen(
            [*self.argv(hold), "--", *hold],
            stdin=subprocess.DEVNULL,
            stdout=self._err,
            stderr=self._err,
            env=self._launched_env,
        )
        deadline = time.monotonic() + START_SECONDS
        while not env_file.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.finish()
                pytest.fail(self.explain(starting=True), pytrace=False)
            time.sleep(_POLL_SECONDS)
        self._held_env = json.loads(env_file.read_text(encoding="utf-8"))
        env_file.unlink()  # it holds the run token: not left on disk

    def agent_env(self) -> dict[str, str | None]:
        """What docket changed in its agent's environment: set (a value) or removed (None)."""
        changes: dict[str, str | None] = {
            k: v for k, v in self._held_env.items() if self._launched_env.get(k) != v
        }
        changes.update({k: None for k in self._launched_env if k not in self._held_env})
        return changes

    def finish(self) -> None:
        """Release the hold and wait for the command's end (once)."""
        if self._proc is None or self.returncode is not None:
            return
        self._release.touch()
        try:
            self.returncode = self._proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self.returncode = self._proc.wait()
        self._err.seek(0)
        self.stderr = self._err.read()
        self._err.close()

    def divergence(self) -> str | None:
        said = self.stderr.partition("the first divergence:\n")[2]
        return said[: said.rindex("}") + 1] if "}" in said else None

    def explain(self, *, starting: bool = False) -> str:
        verb = "docket run (recording)" if self.record else f"docket replay of {self.run}"
        if starting:
            return f"{verb} did not start (exit {self.returncode}):\n{self.stderr.strip()}"
        diff = self.divergence()
        lines = [f"{verb}: exit {self.returncode}"]
        if diff is not None:
            lines += ["the first request with no recorded answer, against the nearest:", diff]
        else:
            lines += [line for line in self.stderr.splitlines() if line.startswith("docket")][-4:]
        lines.append(f"the run (ledger, receipt, output in docket.err) is kept in {self.work}")
        return "\n".join(lines)

    def settle(self) -> None:
        """A passed test: a recording replaces the one in the marker's folder; a replay's
        folder is removed."""
        if not self.record:
            shutil.rmtree(self.work)
            return
        old = self.run.with_name(self.run.name + ".replaced")
        if self.run.exists():
            self.run.rename(old)
        self.run.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.folder), str(self.run))
        if old.exists():
            shutil.rmtree(old)

    def _check_records_bodies(self) -> None:
        if self.policy is None:
            pytest.fail("--docket-record: give the policy (marker policy= or ini docket_policy)")
        try:
            ledger = tomllib.loads(self.policy.read_text(encoding="utf-8")).get("ledger", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            pytest.fail(f"--docket-record: {self.policy}: {exc}", pytrace=False)
        if ledger.get("record_bodies") is not True:
            pytest.fail(
                f"--docket-record: {self.policy} must set record_bodies = true under [ledger] "
                "(a recording without bodies cannot be replayed)",
                pytrace=False,
            )
