"""Processes and clients for benchmarks that put real HTTP traffic through the boundary.

- `Service`: a child process that prints one line once it listens and takes
  commands on stdin; closing stdin stops it (so a dying parent stops it too),
  and `stop()` waits for its last line.
- `Stub`: `docket stub` (the OpenAI-shaped stub provider) in its own process.
- `spawn_boundary`: a boundary with a durable ledger in its own process
  (`boundary_main` below is what runs there); `stats()` reads the ledger's
  counters (events, fsyncs, bytes) while it serves.
- Clients that are cheap enough not to be what is measured: `Connection`, one
  blocking keep-alive socket for call-by-call timing, and `load`, a selectors
  loop over N keep-alive sockets that keeps each one busy. Both speak just
  enough HTTP/1.1 for a content-length answer; streamed answers go through h11
  (`StreamConnection`), which costs the same on both paths being compared.

Everything listens and connects on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import h11

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
STUB_KEY_ENV = "DOCKET_BENCH_UPSTREAM_KEY"


# ---------------------------------------------------------------- child processes


class Service:
    """A child process that announces itself with one line and answers stdin commands."""

    def __init__(
        self, argv: list[str], name: str, *, startup_s: float = 30.0, cwd: Path = ROOT
    ) -> None:
        self.name = name
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, cwd=cwd
        )
        self._pending = b""
        self.first_line = self._read_line(startup_s)

    def _read_line(self, timeout_s: float) -> str:
        """The child's next line of output, within timeout_s."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        ready = selectors.DefaultSelector()
        ready.register(self.process.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or not ready.select(left):
                    self.kill()
                    raise RuntimeError(f"{self.name}: no answer within {timeout_s:g}s")
                data = os.read(self.process.stdout.fileno(), 65536)
                if not data:
                    code = self.process.wait(timeout=10)
                    raise RuntimeError(f"{self.name} exited with status {code} before answering")
                self._pending += data
        finally:
            ready.close()
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode().strip()

    def ask(self, command: str, timeout_s: float = 30.0) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        return json.loads(self._read_line(timeout_s))

    def stop(self, timeout_s: float = 60.0) -> str:
        """Close stdin (the child's cue to finish) and return its last line of output."""
        # communicate() with no input closes stdin, then reads to EOF.
        try:
            out, _ = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.name} did not stop within {timeout_s:g}s") from None
        if self.process.returncode != 0:
            raise RuntimeError(f"{self.name} exited with status {self.process.returncode}")
        lines = (self._pending + out).decode().strip().splitlines()
        return lines[-1] if lines else ""

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()  # after a clean stop() this finds the process gone and does nothing


class Stub(Service):
    """`docket stub`: it stops on SIGTERM rather than on a closed stdin."""

    def __init__(self, token_delay: str = "0") -> None:
        argv = [sys.executable, "-m", "docket", "stub", "--kind", "openai", "--port", "0"]
        super().__init__([*argv, "--token-delay", token_delay], f"stub (token delay {token_delay})")
        if " listening on " not in self.first_line:
            self.kill()
            raise RuntimeError(f"{self.name} did not start: {self.first_line!r}")
        self.url = self.first_line.rsplit(" ", 1)[1]

    def stop(self, timeout_s: float = 10.0) -> str:
        self.process.terminate()
        try:
            self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.name} did not stop within {timeout_s:g}s") from None
        if self.process.returncode != 0:
            raise RuntimeError(f"{self.name} exited with status {self.process.returncode}")
        return ""


class BoundaryProcess(Service):
    """`tree`: the source tree the boundary runs from (another checkout, to compare two)."""

    def __init__(self, config: dict, tree: Path = ROOT) -> None:
        code = (
            f"import sys; sys.path.insert(0, {str(tree)!r}); "
            "from benchmarks._harness import boundary_main; boundary_main(sys.argv[1])"
        )
        argv = [sys.executable, "-c", code, json.dumps(config)]
        super().__init__(argv, f"boundary ({tree})", cwd=tree)
        self.url = json.loads(self.first_line)["url"]

    def stats(self) -> dict:
        """The ledger's counters now: count, fsyncs, bytes, complete, stops."""
        return self.ask("stats")

    def stop(self, timeout_s: float = 120.0) -> dict:
        """Stop serving, close the ledger; its final counters."""
        return json.loads(super().stop(timeout_s))


def spawn_boundary(
    ledger: Path,
    upstreams: dict[str, str],
    token: str,
    profile: Path | None = None,
    tree: Path = ROOT,
    policy: dict | None = None,
    replay_key: str | None = None,
) -> BoundaryProcess:
    """A boundary whose provider NAME (kind openai) forwards to upstreams[NAME];
    `policy`: more policy tables (e.g. {"cache": {...}}); `replay_key`: the routes go
    to a replay upstream holding that key (docket/boundary/replayed.py)."""
    providers = {
        name: {"kind": "openai", "base_url": url, "key_env": STUB_KEY_ENV}
        for name, url in upstreams.items()
    }
    config = {
        "ledger": str(ledger),
        "token": token,
        "providers": providers,
        "profile": str(profile) if profile else None,
    }
    if policy:
        config["policy"] = policy
    if replay_key:
        config["replay_key"] = replay_key
    return BoundaryProcess(config, tree)


def boundary_main(config_json: str) -> None:
    """The boundary's process: serve until stdin closes, then print the ledger's counters.

    Commands on stdin, one a line: `stats` prints the counters as one JSON line.
    With config["profile"], the whole run is under cProfile, dumped there. Its
    timer is the main thread's CPU clock, so time spent waiting (for the
    network, for an fdatasync in the ledger's thread) is not counted as work.
    """
    import trio

    config = json.loads(config_json)
    if config.get("profile"):
        import cProfile

        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        try:
            final = trio.run(_boundary_session, config)
        finally:
            profiler.disable()
            profiler.dump_stats(config["profile"])
    else:
        final = trio.run(_boundary_session, config)
    _say(final)


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _boundary_session(config: dict) -> dict:
    import trio

    from docket.boundary.app import Boundary
    from docket.clock import Clock
    from docket.ledger.limits import LedgerLimits
    from docket.ledger.writer import open_ledger
    from docket.policy import policy_from_dict

    tables = {**config.get("policy", {}), "providers": config["providers"]}
    policy = policy_from_dict(tables, source="benchmark")
    stops: list[str] = []  # a stop request is a finding: reported, never acted on silently
    limits = LedgerLimits(max_ledger_bytes=1 << 36)

    def counters(ledger) -> dict:
        return {
            "count": ledger.count,
            "fsyncs": ledger.fsyncs,
            "bytes": ledger.bytes,
            "complete": ledger.stats.ledger_complete,
            "stops": list(stops),
        }

    async with open_ledger(config["ledger"], limits=limits) as ledger:
        boundary = Boundary(
            policy,
            ledger,
            token=config["token"],
            clock=Clock(),
            stop=lambda request: stops.append(request.reason),
            env={STUB_KEY_ENV: "sk-docket-bench"},
            **({"replay_key": config["replay_key"]} if config.get("replay_key") else {}),
        )
        async with trio.open_nursery() as nursery:
            url = await nursery.start(boundary.serve)
            _say({"url": url})
            commands = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            pending = b""
            async with commands:
                while True:
                    data = await commands.receive_some(4096)
                    if not data:
                        break  # stdin closed: the parent is done with us
                    pending += data
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        if line.strip() == b"stats":
                            _say(counters(ledger))
                        else:
                            _say({"error": f"unknown command {line!r}"})
            nursery.cancel_scope.cancel()
    return counters(ledger)


def make_report_folders(tool: str, folders: list[Path]) -> bool:
    """Create the folders a report goes to, before minutes of measuring rather than
    after; False, with one line on stderr naming the folder, when one cannot be."""
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(
                f"{tool}: cannot write reports to {folder}: {exc.strerror or exc}", file=sys.stderr
            )
            return False
    return True


def how_run(session: str, module: str, args: list[str]) -> str:
    """The command line that ran a benchmark, as a report quotes it: the nox session
    when nox ran it (nox names the session in NOX_CURRENT_SESSION), else the module."""
    if os.environ.get("NOX_CURRENT_SESSION") == session:
        return " ".join([f"nox -s {session}", *(["--", *args] if args else [])])
    return " ".join([f"python -m {module}", *args])


# ---------------------------------------------------------------- requests


def address(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").partition(":")
    if host != LOOPBACK:
        raise ValueError(f"benchmarks only talk to {LOOPBACK}, not {url}")
    return host, int(port.rstrip("/"))


def chat_body(*, stream: bool, max_tokens: int = 16, model: str = "gpt-4o-mini") -> bytes:
    body: dict = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": max_tokens,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body, separators=(",", ":")).encode()


def request_bytes(url: str, path: str, token: str, body: bytes) -> bytes:
    host, port = address(url)
    return (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\nauthorization: Bearer {token}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _connect(url: str) -> socket.socket:
    sock = socket.create_connection(address(url), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def complete_response(buf: bytes | bytearray) -> tuple[int, int] | None:
    """(status, length of the whole response) once `buf` holds a content-length
    answer in full, else None. Chunked or close-delimited answers are refused."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = bytes(buf[:head_end]).lower()
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        raise ValueError(f"answer without content-length: {bytes(buf[:200])!r}")
    end_of_line = head.find(b"\r\n", at + 2)
    length = int(head[at + 17 : end_of_line if end_of_line > 0 else len(head)])
    total = head_end + 4 + length
    if len(buf) < total:
        return None
    return int(head[9:12]), total


class Connection:
    """One blocking keep-alive connection that times whole non-streamed calls."""

    def __init__(self, url: str) -> None:
        self.sock = _connect(url)
        self.buf = bytearray()

    def call(self, request: bytes) -> tuple[int, float, bytes]:
        """(status, seconds from the first byte sent to the last byte received, answer)."""
        started = time.perf_counter()
        self.sock.sendall(request)
        while True:
            done = complete_response(self.buf)
            if done is not None:
                break
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed a kept-alive connection")
            self.buf += data
        elapsed = time.perf_counter() - started
        status, total = done
        answer = bytes(self.buf[:total])
        del self.buf[:total]
        return status, elapsed, answer

    def close(self) -> None:
        self.sock.close()


@dataclass
class StreamTiming:
    status: int
    head_s: float  # request sent -> status line and headers in
    first_body_s: float  # request sent -> first body bytes in (the first SSE event)
    total_s: float
    frames: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival s, SSE frame)


class StreamConnection:
    """One blocking keep-alive connection (h11) for streamed calls, each SSE frame
    timed on arrival."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        host, port = address(url)
        self.host_header = f"{host}:{port}"
        self.sock = _connect(url)
        self.sock.settimeout(timeout_s)
        self.h11 = h11.Connection(h11.CLIENT)

    def call(self, path: str, token: str, body: bytes) -> StreamTiming:
        conn = self.h11
        if conn.our_state is h11.DONE:
            conn.start_next_cycle()
        headers = [
            ("host", self.host_header),
            ("authorization", f"Bearer {token}"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
        ]
        out = conn.send(h11.Request(method="POST", target=path, headers=headers))
        out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        started = time.perf_counter()
        self.sock.sendall(out)
        timing = StreamTiming(status=0, head_s=0.0, first_body_s=0.0, total_s=0.0)
        pending = b""
        arrived = started
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = self.sock.recv(65536)
                arrived = time.perf_counter()
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                timing.status, timing.head_s = event.status_code, arrived - started
            elif isinstance(event, h11.Data):
                if not timing.first_body_s:
                    timing.first_body_s = arrived - started
                pending += bytes(event.data)
                *frames, pending = pending.split(b"\n\n")
                timing.frames += [(arrived - started, frame) for frame in frames]
            elif isinstance(event, h11.EndOfMessage):
                timing.total_s = arrived - started
                return timing
            else:
                raise ConnectionError(f"stream ended by {type(event).__name__}")

    def close(self) -> None:
        self.sock.close()


def token_arrivals(timing: StreamTiming) -> list[tuple[float, str]]:
    """(arrival s, text) of each SSE frame that carries a content token."""
    out = []
    for arrived, frame in timing.frames:
        if not frame.startswith(b"data: {"):
            continue
        for choice in json.loads(frame[6:]).get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                out.append((arrived, text))
    return out


# ---------------------------------------------------------------- load


def load(url: str, request: bytes, *, concurrency: int, calls: int, timeout_s: float) -> dict:
    """`calls` calls over `concurrency` keep-alive connections, each sending its
    next request as soon as its previous answer is in. Every answer must be 200."""
    selector = selectors.DefaultSelector()
    socks = [_connect(url) for _ in range(concurrency)]
    buffers = {s: bytearray() for s in socks}
    started_at: dict[socket.socket, float] = {}
    latencies: list[float] = []
    issued = 0
    bad: dict[int, int] = {}

    def send(sock: socket.socket) -> None:
        nonlocal issued
        issued += 1
        started_at[sock] = time.perf_counter()
        if sock.send(request) != len(request):  # an idle socket's buffer takes a small request
            raise ConnectionError("a request did not fit the socket's send buffer")

    try:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        began = time.perf_counter()
        deadline = began + timeout_s
        for sock in socks[: min(concurrency, calls)]:
            send(sock)
        while len(latencies) < calls:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"load: {len(latencies)} of {calls} calls in {timeout_s:g}s")
            for key, _ in selector.select(1.0):
                sock = key.fileobj
                data = sock.recv(262144)
                if not data:
                    raise ConnectionError("the server closed a kept-alive connection")
                buf = buffers[sock]
                buf += data
                done = complete_response(buf)
                if done is None:
                    continue
                now = time.perf_counter()
                status, total = done
                if total != len(buf):
                    raise ConnectionError("bytes after a complete answer on an idle connection")
                buf.clear()
                latencies.append(now - started_at.pop(sock))
                if status != 200:
                    bad[status] = bad.get(status, 0) + 1
                if issued < calls:
                    send(sock)
        elapsed = time.perf_counter() - began
    finally:
        selector.close()
        for sock in socks:
            sock.close()
    return {
        "calls": calls,
        "concurrency": concurrency,
        "elapsed_s": round(elapsed, 3),
        "calls_per_s": round(calls / elapsed, 1),
        "non_200": bad,
        "latency_ms": percentiles(latencies),
    }


def percentiles(seconds: list[float]) -> dict:
    """Nearest-rank percentiles of a sample, in milliseconds."""
    if not seconds:
        return {}
    ordered = sorted(seconds)
    n = len(ordered)

    def at(q: float) -> float:
        return round(ordered[max(0, math.ceil(q * n) - 1)] * 1000, 3)

    return {
        "n": n,
        "min": round(ordered[0] * 1000, 3),
        "p50": at(0.50),
        "p90": at(0.90),
        "p95": at(0.95),
        "p99": at(0.99),
        "p99.9": at(0.999),
        "max": round(ordered[-1] * 1000, 3),
        "mean": round(sum(ordered) / n * 1000, 3),
    }


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time a process (or one of its threads) has used so far (Linux /proc)."""
    where = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    with open(where, "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    # after the command name: state is field 3, utime 14 and stime 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fdatasync_probe(folder: Path, count: int) -> dict:
    """The disk's own figure now: write+fdatasync of a ledger-sized line, timed.
    On a shared machine this moves a lot; the added latency has two of these in it."""
    path = folder / "fdatasync-probe"
    line = b"x" * 330 + b"\n"
    took = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, line)
            os.fdatasync(fd)
            took.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return percentiles(took)


def python_speed_probe() -> float:
    """Microseconds for sum(range(1000)), best of 5: how fast this machine's
    CPUs are for us right now (on this VM it has ranged from 13 to 34)."""
    import timeit

    return round(min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6, 1)
