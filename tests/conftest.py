"""Shared rigs for tests that drive the boundary over real sockets on 127.0.0.1.

Each rig is an async context manager that starts its servers in a nursery of its
own and stops them on the way out, so a test bounds everything with one
trio.fail_after around it:

    async def test_x(stub_server, boundary_rig):
        with trio.fail_after(DEADLINE):
            async with stub_server("openai") as stub, boundary_rig({"openai": stub}) as rig:
                async with rig.client() as http:
                    r = await http.post("/openai/v1/chat/completions", json=...)
            events = rig.events()        # read from the bytes on disk, chain verified

Fixtures: `json_parser` (each of strict_json's parsers in turn), `tls_files` (a self-signed certificate and key for 127.0.0.1),
`stub_server(kind, choose=None, **StubConfig)`, `upstream_server(handler)`
(any docket.http.server handler, for upstream behaviour the stub lacks) and
`boundary_rig(providers, policy=None, ...)` (rig.cancel() stops the boundary early,
cancelling the calls in flight). Constants: TOKEN (the run token the
agent holds), REAL_KEY (the provider key the boundary sends upstream).
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import trio
from helpers import read_events, serving
from hypothesis import settings
from postgres_server import fleet_dsn, postgres_cluster  # noqa: F401  (fixtures)

from chaos.stub.server import Stub, StubConfig
from docket.boundary.app import Boundary
from docket.clock import Clock
from docket.http.server import Listening, serve
from docket.ledger import strict_json
from docket.ledger.writer import Ledger, open_ledger
from docket.policy import policy_from_dict

# Hypothesis profiles: the suite runs `ci` (sized for its five minutes); `nox -s slow`
# runs every property again under `thorough` (--hypothesis-profile thorough), twenty
# times the examples. No test names its own count: a property whose every example does I/O
# takes helpers.io_examples(), a quarter of the profile's. DOCKET_HYPOTHESIS picks one
# for a plain pytest run. Deadlines are off: a 2-core machine under load is no clock.
# `ci` is derandomized: the suite draws the same examples every run, so a change fails it,
# never the draw (on 2026-12-02 three of thirteen suite runs drew a new example that a
# test's own oracle had not foreseen, each a real gap, found and fixed: e559ff7 and the
# commit that set this). `thorough` stays random: `nox -s slow` goes looking for more.
# `ci` draws 50 (hypothesis's default is 100): the suite's 173 properties took 78.6 s of
# CPU of the suite's ~620 at 100 (a per-test getrusage plugin, 2026-12-03), the largest
# share any one kind of test had, and the suite was past its five minutes; as the
# draws are fixed, the suite's examples are regression cases, and the search for new
# ones is `thorough`'s (twenty times as many, random).
settings.register_profile("ci", max_examples=50, deadline=None, print_blob=True, derandomize=True)
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("DOCKET_HYPOTHESIS", "ci"))

TOKEN = "dkt-test-run-token-0123456789abcdef"
REAL_KEY = "sk-real-upstream-key-fedcba9876543210"
KEY_ENV = "STUB_KEY"


@dataclass
class Upstream:
    """A server a provider route can point at: a stub (with its request log) or a
    custom handler."""

    url: str
    kind: str | None = None
    stub: Stub | None = None

    @property
    def log(self) -> list[dict]:
        assert self.stub is not None, "only a stub keeps a request log"
        return self.stub.log.entries()


@dataclass
class Rig:
    """A running boundary over a ledger in tmp_path; usable after the rig closes
    for reading what it left on disk."""

    url: str
    boundary: Boundary
    ledger: Ledger
    ledger_path: Path
    token: str = TOKEN
    stops: list = field(default_factory=list)  # StopRequests the boundary made
    cancel: Callable[[], None] = lambda: None  # stop serving (calls in flight are cancelled)

    def client(self, *, token: str | None = TOKEN, timeout: float = 10.0) -> httpx.AsyncClient:
        """An httpx client on the boundary, presenting `token` as a bearer (None: no token)."""
        headers = {"authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)

    def events(self, type: str | None = None) -> list[dict]:
        events = read_events(self.ledger_path)
        return events if type is None else [e for e in events if e["type"] == type]

    def raw(self) -> bytes:
        return self.ledger_path.read_bytes()


@pytest.fixture
def stub_server():
    """`async with stub_server("openai", choose=..., **config) as upstream:` a chaos.stub."""

    def open_stub(kind: str = "openai", *, choose=None, **config):
        stub = Stub(StubConfig(kind=kind, **config), choose=choose)
        return serving(stub.serve, lambda listening, _: Upstream(listening.url, kind, stub))

    return open_stub


@pytest.fixture
def upstream_server():
    """`async with upstream_server(handler, kind) as upstream:` a custom h11 upstream."""

    def open_upstream(handler, kind: str | None = None):
        async def start(task_status=trio.TASK_STATUS_IGNORED):
            await serve(handler, task_status=task_status)

        def wrap(listening: Listening, _) -> Upstream:
            return Upstream(listening.url, kind)

        return serving(start, wrap)

    return open_upstream


def rig_policy(providers: dict, policy: dict | None = None):
    """A Policy whose providers point at the given upstreams, keyed by KEY_ENV.

    `providers` maps a route name to an Upstream (its kind is the stub's) or to
    (kind, base_url); `policy` supplies the other sections.
    """
    data = copy.deepcopy(policy or {})
    table = {}
    for name, target in providers.items():
        kind, url = (target.kind, target.url) if isinstance(target, Upstream) else target
        table[name] = {"kind": kind, "base_url": url, "key_env": KEY_ENV}
    data["providers"] = table
    return policy_from_dict(data, source="<test>")


@pytest.fixture
def boundary_rig(tmp_path):
    """`async with boundary_rig({"openai": upstream}, policy={...}) as rig:` a Boundary
    serving on 127.0.0.1 in-process, its ledger at tmp_path/<name>.jsonl."""
    counter = iter(range(1_000_000))

    @asynccontextmanager
    async def open_rig(
        providers: dict,
        policy: dict | None = None,
        *,
        env: dict | None = None,
        clock: Clock | None = None,
        token: str = TOKEN,
        observers=(),
        fleet=None,
    ) -> AsyncIterator[Rig]:
        resolved = rig_policy(providers, policy)
        path = tmp_path / f"ledger-{next(counter)}.jsonl"
        clock = clock or Clock()
        async with open_ledger(
            path, limits=resolved.ledger_limits(), clock=clock, observers=observers
        ) as ledger:
            stops: list = []
            boundary = Boundary(
                resolved,
                ledger,
                token=token,
                clock=clock,
                stop=stops.append,
                env={KEY_ENV: REAL_KEY} if env is None else env,
                fleet=fleet,
            )
            async with serving(
                boundary.serve,
                lambda url, cancel: Rig(url, boundary, ledger, path, token, stops, cancel),
            ) as rig:
                yield rig

    return open_rig


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """(cert.pem, key.pem): a self-signed certificate for 127.0.0.1, made by openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return cert, key


@pytest.fixture(params=["jiter", "stdlib"])
def json_parser(request, monkeypatch):
    """Each JSON parser in turn: jiter (when installed), then the standard library's."""
    if request.param == "jiter" and strict_json.JITER is None:
        pytest.skip("jiter is not installed")
    if request.param == "stdlib":
        monkeypatch.setattr(strict_json, "parsers", strict_json.STDLIB)
    return request.param


@pytest.fixture(scope="session")
def go_verifier(tmp_path_factory):
    """verify-go/ built once for the whole session (chaos.verifiers.find_go: absent,
    broken or runnable, with the reason), shared by test_verify_go.py and the
    differential, so the suite pays for one `go build`."""
    from chaos.verifiers import find_go

    return find_go(build_dir=tmp_path_factory.mktemp("verify-go-build"))


@dataclass(frozen=True)
class GameDayRun:
    """The nine phases, run once: the report folder (report/evidence holds each run's
    receipt and ledger) and the kept evidence (--keep), with what the command said."""

    report: Path
    keep: Path
    returncode: int
    output: str
    pubkey: Path  # the report is signed (--attest) with this key pair's private half
    journal: Path  # a Chaos Toolkit journal per phase (--journal): PHASE.journal.json


def _gameday_folder(base: Path) -> Path:
    """Where the session's one game day lives: the base folder every xdist worker shares
    (popen-gwN's parent), or the session's own without xdist."""
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _run_gameday_once(base: Path) -> None:
    """Run the nine phases into base/gameday-run unless someone did, under base's lock:
    whoever takes the lock first runs it, and everyone after reads what it left."""
    root = base / "gameday-run"
    with open(base / "gameday-run.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released on close
        said = root / "said.json"
        if said.exists():
            return
        root.mkdir(exist_ok=True)
        key = root / "attest-key.pem"  # the report is signed too: --attest's real run
        if not key.exists():
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            from docket.attest.keys import private_pem, public_pem

            signer = Ed25519PrivateKey.generate()
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(private_pem(signer))
            Path(f"{key}.pub").write_bytes(public_pem(signer.public_key()))
        # Under tests/reaper.py: what a phase orphans is reaped there, not by this worker.
        reaper = [sys.executable, str(Path(__file__).with_name("reaper.py")), "--"]
        argv = [*reaper, sys.executable, "-m", "docket", "game-day", "--report", str(root / "report"),
                "--keep", str(root / "keep"), "--attest", str(key),
                "--journal", str(root / "journal")]  # fmt: skip
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=400, check=False)
            told = {"returncode": done.returncode, "output": done.stdout + done.stderr}
        except subprocess.TimeoutExpired as exc:
            told = {"returncode": -1, "output": f"the game day did not end within {exc.timeout} s"}
        said.write_text(json.dumps(told))


_early_gameday: list[threading.Thread] = []


# The harness's own tests (game days, chaos runs, attack families, the agent matrix) run
# untraced by coverage (pytest-cov's `no_cover`): they drive the recorder from outside as a
# user does and are judged by their own assertions, and which branches a game day takes
# depends on its timing, so floors that counted them would move with the machine's load.
# The floors (noxfile.py COVERAGE_FLOORS) are the recorder's tests' coverage of the recorder.
HARNESS = frozenset(
    {
        "test_agent_matrix.py",
        "test_attack.py",
        "test_chaos_cli.py",
        "test_chaos_run.py",
        "test_gameday_evidence.py",
        "test_gameday_mutants.py",
        "test_gameday_runner.py",
        "test_gameday_your_agent.py",
        "test_slow_loops.py",
        "test_staging_hosts.py",
        "test_toxiproxy_names.py",
        "test_traffic_anchored.py",
    }
)
# And the tests that run no line of the floored rooms at all (docket/ledger, guards,
# receipts): measured with `pytest --cov-context=test` on 2026-12-02, no context of theirs
# held an arc there. Tracing costs them as much as it would anyone (the tracer sees every
# call): these five alone took 9.0 s of CPU untraced, 17.2 s traced (test_toxiproxy_api,
# test_layout, test_gameday_phase, test_sse, test_reading_properties). A file here that
# comes to test the recorder moves out of this list, or its lines do not count.
NO_FLOORED_CODE = frozenset(
    {
        "test_agent.py",
        "test_agent_unsent.py",
        "test_backoff.py",
        "test_bench_peers.py",
        "test_chaos_summary.py",
        "test_chaos_upstreams.py",
        "test_clock.py",
        "test_demo.py",
        "test_durable.py",
        "test_faults_net.py",
        "test_faults_upstream.py",
        "test_fmea.py",
        "test_gameday_agent_checks.py",
        "test_gameday_assertions.py",
        "test_gameday_derive.py",
        "test_gameday_phase.py",
        "test_gameday_preconditions.py",
        "test_gameday_report.py",
        "test_grammar.py",
        "test_http_batches.py",
        "test_http_client.py",
        "test_http_server.py",
        "test_http_sockio.py",
        "test_http_watch.py",
        "test_http_wire.py",
        "test_isolation.py",
        "test_launch.py",
        "test_layout.py",
        "test_outbound_door.py",
        "test_packaging.py",
        "test_pid_namespace.py",
        "test_pricing.py",
        "test_providers.py",
        "test_reading_properties.py",
        "test_scenario.py",
        "test_schedule.py",
        "test_snapshot_escape.py",
        "test_sse.py",
        "test_stub.py",
        "test_toxics.py",
        "test_toxiproxy_api.py",
        "test_values.py",
        "test_verify_go.py",
        "test_yamldoc.py",
    }
)
UNTRACED = HARNESS | NO_FLOORED_CODE


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Start the session's game day as soon as the tests are known, if any test reads it:
    its nine phases mostly wait (agents' timeouts, breaker cooldowns, budgets), so they run
    beside the other tests instead of holding a worker when the first reader asks. One
    worker (gw0, or the only process) starts it; the fixture waits on the same lock."""
    # Its readers go last (a stable sort, the same in every worker, as xdist requires), so
    # by the time one asks, the day has had the whole rest of the suite to finish.
    if os.environ.get("DOCKET_COVERAGE_RUN"):  # nox -s coverage: only what it counts
        left_out = [item for item in items if item.path.name in UNTRACED]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if item.path.name not in UNTRACED]
    items.sort(key=lambda item: "gameday_run" in getattr(item, "fixturenames", ()))
    for item in items:
        if item.path.name in UNTRACED:
            item.add_marker(pytest.mark.no_cover)
    if config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    if not any("gameday_run" in getattr(item, "fixturenames", ()) for item in items):
        return
    base = _gameday_folder(config._tmp_path_factory.getbasetemp())  # pytest's own tmp factory
    thread = threading.Thread(target=_run_gameday_once, args=(base,), name="gameday-run")
    thread.start()
    _early_gameday.append(thread)


def pytest_sessionfinish(session, exitstatus) -> None:
    for thread in _early_gameday:  # nothing outlives the session that started it
        thread.join()


@pytest.fixture(scope="session")
def gameday_run(tmp_path_factory) -> GameDayRun:
    """`docket game-day --keep --journal` over the nine shipped phases, once for the whole suite
    (~30 s; started early, beside other tests: pytest_collection_modifyitems): the tests
    that read real game-day ledgers (explain, the verifiers' differential) share it rather
    than each running its own."""
    base = _gameday_folder(tmp_path_factory.getbasetemp())
    _run_gameday_once(base)  # waits for the early run, or runs it if none was started
    root = base / "gameday-run"
    told = json.loads((root / "said.json").read_text())
    return GameDayRun(
        root / "report", root / "keep", told["returncode"], told["output"],
        root / "attest-key.pem.pub", root / "journal",
    )  # fmt: skip
