"""`docket stub`: run one stub provider on 127.0.0.1 until SIGINT or SIGTERM.

Prints one line, `stub openai listening on http://127.0.0.1:PORT`, once the
socket is bound (a harness waits for it), then serves; a signal ends it with 0.
"""

from __future__ import annotations

import argparse
import signal
from functools import partial

import trio

from chaos.stub.server import RequestLog, Stub, StubConfig
from docket.errors import InputError
from docket.values import ValueProblem, duration_text


def parse_duration(text: str, option: str) -> float:
    """`50ms`, `1.5s`, `2m`, `1h` or a bare number of seconds, as seconds (docket.values'
    grammar, read as command-line text by docket.values.duration_text)."""
    try:
        return duration_text(text).seconds
    except ValueProblem as exc:
        raise InputError(
            f"{option} {text!r}: not a duration (like 50ms, 1.5s, 2m, 1h; at most ten years): "
            f"{exc.reason}"
        ) from None


def stub_command(args: argparse.Namespace) -> int:
    latency = parse_duration(args.latency, "--latency")
    token_delay = parse_duration(args.token_delay, "--token-delay")
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port {args.port}: not a port number (0 picks a free one)")
    config = StubConfig(kind=args.kind, latency=latency, token_delay=token_delay)
    try:
        log = RequestLog(config.log_capacity, args.log)
    except OSError as exc:
        raise InputError(f"--log {args.log}: cannot append ({exc.strerror})") from None
    try:
        trio.run(_serve_until_signalled, Stub(config, log=log), args.port)
    except ExceptionGroup as group:
        refused, other = group.split(InputError)
        if refused is None or other is not None:
            raise
        raise _first_leaf(refused) from None
    finally:
        log.close()
    return 0


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _serve_until_signalled(stub: Stub, port: int) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            try:
                listening = await nursery.start(partial(stub.serve, port=port))
            except OSError as exc:
                raise InputError(f"--port {port}: cannot listen ({exc.strerror})") from None
            print(f"stub {stub.config.kind} listening on {listening.url}", flush=True)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()
