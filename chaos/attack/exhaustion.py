"""Family `exhaustion`: run the boundary out of connections and descriptors.

A real `docket run` (its boundary in the supervisor's process) with a small
`[boundary] max_connections` and a short `request_head_timeout` is sent, on raw
sockets from this process:

- idle connections past the cap (they send nothing and stay open);
- slowloris heads: connections that trickle a header line at a steady pace, each
  read well inside the per-read timeout, so only the head's total deadline ends them;
- half-open bodies: a head announcing a body that never finishes coming;
- EMFILE: the run's soft RLIMIT_NOFILE lowered (prlimit, from outside) to a few
  descriptors above what it holds, then idle connections until accept() fails.

During each, a real call is made on a connection of its own. Held, per probe: that
call answered 200 (and so recorded). Then, from the ledger on disk and the run's
stderr: every real call has its model.response, each kind of pressure the probes
caused is on record as connection.pressure events (few: one per episode, never one
per connection), and stderr holds no traceback.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from collections.abc import Callable
from pathlib import Path

from chaos.attack import Figures
from chaos.attack.http import RequestProbe, chat, exchange, request
from chaos.attack.rig import live_run

# Connections opened per probe, the boundary's cap, and the slowloris timings (seconds).
QUICK = {"cap": 16, "idle": 40, "slow": 24, "half": 6, "emfile": 30}
FULL = {"cap": 64, "idle": 300, "slow": 1000, "half": 30, "emfile": 200}
TIMES = {True: {"head": 0.5, "pace": 0.1}, False: {"head": 2.0, "pace": 2.0}}


def connect(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return None  # refused or reset at once: the boundary may close past its cap


def real_call(port: int, token: str) -> int | None:
    """One model call on its own connection: its status (None: no answer)."""
    body = json.dumps(chat()).encode()
    statuses, _ = exchange(port, RequestProbe("real call", request(token, body), timeout=15))
    return statuses[-1] if statuses else None


def closed(sock: socket.socket) -> bool:
    """Whether the boundary has closed (or answered and closed) this connection."""
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""  # an answer (a 408) is read past; the close follows
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def close_all(socks) -> None:
    for sock in socks:
        if sock is not None:
            sock.close()


def idle_past_cap(port: int, token: str, n: int) -> tuple[bool, str]:
    socks = [connect(port) for _ in range(n)]
    try:
        status = real_call(port, token)
    finally:
        close_all(socks)
    return status == 200, f"{n} idle connections held open, then a real call: {status}"


def slowloris(port: int, token: str, n: int, pace: float, head: float) -> tuple[bool, str]:
    socks = [s for s in (connect(port) for _ in range(n)) if s is not None]
    for sock in socks:
        try:
            sock.sendall(b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            continue  # closed past the cap at once: that is one way to hold
    started = time.monotonic()
    deadline = started + head * 3 + max(pace * 2, 2.0)
    status = None
    line = 0
    open_ = list(socks)
    try:
        while open_ and time.monotonic() < deadline:
            line += 1
            still = []
            for sock in open_:
                try:
                    sock.sendall(b"X-Slow-%d: y\r\n" % line)
                except OSError:
                    continue
                if not closed(sock):
                    still.append(sock)
            open_ = still
            if status is None:
                status = real_call(port, token)  # while the heads trickle
            time.sleep(pace)  # the attack's pace: a header line every `pace` seconds
    finally:
        close_all(socks)
    took = time.monotonic() - started
    return status == 200 and not open_, (
        f"{len(socks)} heads trickled a line every {pace}s (head deadline {head}s): "
        f"{len(open_)} still open after {took:.1f}s; real call {status}"
    )


def half_open_bodies(port: int, token: str, n: int) -> tuple[bool, str]:
    socks = []
    for _ in range(n):
        sock = connect(port)
        if sock is None:
            continue
        head = request(token, b"", headers=[b"Content-Length: 100000"], length=False)
        try:
            sock.sendall(head + b'{"model": "gpt-4o-mini", "messages": [')
        except OSError:
            pass  # closed at once: its answer is what counts, and there is none to wait for
        socks.append(sock)
    try:
        status = real_call(port, token)
    finally:
        close_all(socks)
    return status == 200, f"{n} bodies announced 100000 bytes and stopped; a real call: {status}"


def emfile(port: int, token: str, pid: int, n: int) -> tuple[bool, str]:
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    used = len(os.listdir(f"/proc/{pid}/fd"))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (used + 6, before[1]))
    socks: list[socket.socket | None] = []
    try:
        socks = [connect(port) for _ in range(n)]
        status = real_call(port, token)
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
        close_all(socks)
    return status == 200, (
        f"soft NOFILE lowered to {used + 6} ({used} in use), {n} idle connections, "
        f"then a real call: {status}"
    )


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("exhaustion")
    size = QUICK if quick else FULL
    times = TIMES[quick]
    policy = (
        f"[boundary]\nmax_connections = {size['cap']}\nrequest_head_timeout = {times['head']}\n"
    )
    probes: list[tuple[str, Callable[..., tuple[bool, str]]]] = []
    with live_run(folder / "exhaustion", policy_extra=policy) as live:
        port, token = live.port, live.token
        warm = real_call(port, token)  # the upstream pool holds a connection from here on
        probes = [
            ("idle past the cap", lambda: idle_past_cap(port, token, size["idle"])),
            (
                "slowloris heads",
                lambda: slowloris(port, token, size["slow"], times["pace"], times["head"]),
            ),  # fmt: skip
            ("half-open bodies", lambda: half_open_bodies(port, token, size["half"])),
            (
                "EMFILE under a lowered NOFILE",
                lambda: emfile(port, token, live.process.pid, size["emfile"]),
            ),  # fmt: skip
        ]
        calls = 1 if warm == 200 else 0
        for name, probe in probes:
            ok, what = probe()
            calls += ok
            figures.add(ok, f"exhaustion {name}: {what}")
    events = [json.loads(line) for line in (live.run_dir / "ledger.jsonl").read_text().splitlines()]
    responses = sum(e["type"] == "model.response" for e in events)
    figures.add(responses >= calls, f"exhaustion: {calls} real calls answered, "
                                    f"{responses} model.response on record")  # fmt: skip
    pressure = [e for e in events if e["type"] == "connection.pressure"]
    kinds = {e["kind"] for e in pressure}
    for kind in ("idle_closed", "head_timeout", "accept_failed"):
        figures.add(kind in kinds, f"exhaustion: no connection.pressure {kind} on record "
                                   f"(have {sorted(kinds)})")  # fmt: skip
    connections = size["idle"] + size["slow"] + size["half"] + size["emfile"]
    figures.add(len(pressure) <= 4 * len(probes), f"exhaustion: {len(pressure)} pressure events "
                                                  f"for {connections} connections")  # fmt: skip
    stderr = live.result.get("stderr", "")
    figures.add("Traceback" not in stderr, f"exhaustion: a traceback on stderr: {stderr[-600:]}")
    figures.add(live.result.get("exit") == 0, f"exhaustion: run exit {live.result.get('exit')}")
    counted: dict[str, int] = {}
    for e in pressure:
        counted[e["kind"]] = counted.get(e["kind"], 0) + e["count"]
    figures.extra = {
        "pressure_events": len(pressure),
        "pressure_counted": counted,
        "connections_opened": connections,
        "run_exit": live.result.get("exit"),
    }
    return figures
