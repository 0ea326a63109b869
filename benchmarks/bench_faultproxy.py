"""The embedded Toxiproxy-compatible fault proxy: what it costs, and that latency
does not throttle.

The proxy and an echo server run in a child process (one trio loop, like the
harness runs them); this process measures with blocking sockets on 127.0.0.1.

- added round-trip latency: 64-byte echoes, direct to the echo server and through
  a proxy with no toxic, alternating, on two kept-open connections; the figure
  is p50(proxy) - p50(direct). Target: <= 0.5 ms.
- throughput: a bulk echo through the proxy with no toxic, then with a 50 ms
  downstream latency toxic, alternating. The steady rate (first received byte to
  last) must not drop with the toxic; the total time grows by about 50 ms.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time

import toxiproxy

LOOPBACK = "127.0.0.1"

CHILD = """
import sys, trio
from functools import partial
from chaos.toxiproxy import serve_toxiproxy

async def echo(stream):
    async with stream:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            return

async def main():
    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(serve_toxiproxy, port=0))
        listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
        print(server.listening.port, listeners[0].socket.getsockname()[1], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # closing stdin stops us
        nursery.cancel_scope.cancel()

trio.run(main)
"""


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def echo_once(sock: socket.socket, payload: bytes) -> float:
    start = time.perf_counter()
    sock.sendall(payload)
    got = 0
    while got < len(payload):
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("echo connection closed")
        got += len(data)
    return time.perf_counter() - start


def bulk(port: int, size: int) -> dict:
    """Send `size` bytes and read the echo; times to first byte and to last."""
    sock = connect(port)
    payload = b"x" * size
    sender = threading.Thread(target=sock.sendall, args=(payload,))
    start = time.perf_counter()
    sender.start()
    got, first = 0, None
    while got < size:
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError(f"bulk connection closed after {got} bytes")
        if first is None:
            first = time.perf_counter()
        got += len(data)
    end = time.perf_counter()
    sender.join()
    sock.close()
    return {
        "total_s": end - start,
        "first_byte_s": first - start,
        "steady_mb_s": size / (end - first) / 1e6,
    }


def run(quick: bool) -> dict:
    rounds = 500 if quick else 5000
    bulk_size = (8 if quick else 64) * 1024 * 1024
    bulk_rounds = 2 if quick else 5
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        api_port, echo_port = map(int, child.stdout.readline().split())
        client = toxiproxy.Toxiproxy()
        client.update_api_consumer(LOOPBACK, api_port)
        proxy = client.create(upstream=f"{LOOPBACK}:{echo_port}", name="bench")
        proxy_port = int(proxy.listen.rpartition(":")[2])

        direct, proxied = connect(echo_port), connect(proxy_port)
        payload = b"p" * 64
        for _ in range(50):  # warm up both paths
            echo_once(direct, payload), echo_once(proxied, payload)
        direct_s, proxied_s = [], []
        for _ in range(rounds):
            direct_s.append(echo_once(direct, payload))
            proxied_s.append(echo_once(proxied, payload))
        direct.close()
        proxied.close()

        plain, delayed = [], []
        for _ in range(bulk_rounds):
            plain.append(bulk(proxy_port, bulk_size))
            proxy.add_toxic(name="lat", type="latency", attributes={"latency": 50})
            delayed.append(bulk(proxy_port, bulk_size))
            proxy.destroy_toxic("lat")
    finally:
        child.stdin.close()
        child.wait(timeout=10)

    def p(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[q - 1] * 1000

    added_p50 = p(proxied_s, 50) - p(direct_s, 50)
    plain_rate = statistics.median(r["steady_mb_s"] for r in plain)
    delayed_rate = statistics.median(r["steady_mb_s"] for r in delayed)
    return {
        "rounds": rounds,
        "bulk_bytes": bulk_size,
        "direct_ms": {"p50": p(direct_s, 50), "p99": p(direct_s, 99)},
        "proxied_ms": {"p50": p(proxied_s, 50), "p99": p(proxied_s, 99)},
        "bulk_no_toxic": plain,
        "bulk_latency_50ms": delayed,
        "summary": {
            "added_p50_ms": round(added_p50, 3),
            "added_p50_within_0.5ms": added_p50 <= 0.5,
            "bulk_mb_s_no_toxic": round(plain_rate, 1),
            "bulk_mb_s_latency_50ms": round(delayed_rate, 1),
            "latency_rate_ratio": round(delayed_rate / plain_rate, 3),
            "first_byte_ms_latency_50ms": round(
                statistics.median(r["first_byte_s"] for r in delayed) * 1000, 1
            ),
        },
    }
