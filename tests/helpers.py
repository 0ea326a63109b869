"""Helpers several test files share, kept here so each exists once.

Plain functions (no fixtures: those live in conftest.py): waiting on a condition
with a deadline, reading a ledger back from its bytes, a TCP echo handler, and
running a server in a nursery of its own for the length of a block.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio

from docket.ledger.chain import ChainVerifier
from docket.ledger.reader import iter_lines


def wait_until(predicate, timeout: float, what: str):
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def running(pid: int) -> bool:
    """True while pid exists and is not a zombie (a zombie is dead, only unreaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def read_events(path: str | Path, *, whole_file: bool = False) -> list[dict]:
    """Every event in a ledger file, read from its bytes; the chain must verify and
    the file must end on a complete line. With `whole_file`, the verifier must also
    have consumed every byte of the file."""
    verifier = ChainVerifier()
    events = []
    for line in iter_lines(path):
        assert line.complete, f"torn tail at byte {line.offset} of {path}"
        events.append(verifier.feed(line.data))
    if whole_file:
        assert verifier.offset == Path(path).stat().st_size
    return events


def read_chain(path: Path) -> list[dict]:
    """Every line of the file, each checked against the chain; fails on any flaw."""
    return read_events(path, whole_file=True)


async def append_from_tasks(ledger, tasks: int, each: int) -> None:
    """`tasks` concurrent tasks each append `each` model.request events to `ledger`
    (call id "TASK-K", both counted from 0), so appends from many tasks interleave."""

    async def appender(n: int) -> None:
        for k in range(each):
            await ledger.append("model.request", call_id=f"{n}-{k}")

    async with trio.open_nursery() as nursery:
        for n in range(tasks):
            nursery.start_soon(appender, n)


async def tcp_echo(stream: trio.SocketStream) -> None:
    """A trio.serve_tcp handler that sends back what it receives until EOF."""
    async with stream:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            return  # the client went away mid-echo: nothing to answer


async def read_head(stream: trio.abc.Stream) -> bytes:
    """Read a request's head off a raw stream: up to the blank line, or EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
    return data


async def start_raw(nursery: trio.Nursery, behave) -> int:
    """A raw TCP server on 127.0.0.1 running `behave(stream)` per connection; its port."""
    listeners = await nursery.start(partial(trio.serve_tcp, behave, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


def _started_and_cancel(started, cancel):
    return started, cancel


@asynccontextmanager
async def serving(start: Callable, wrap: Callable = _started_and_cancel) -> AsyncIterator:
    """Run `start(task_status=...)` in a nursery, yield wrap(what it reported, a
    function that stops it early) (by default the pair itself), and stop it on exit.

    The body's own exception is re-raised outside the nursery, so a failed
    assertion reaches pytest as itself, not inside an exception group.
    """
    failure: BaseException | None = None
    server_scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        with server_scope:
            await start(task_status=task_status)

    async with trio.open_nursery() as nursery:
        started = await nursery.start(run)
        try:
            yield wrap(started, server_scope.cancel)
        except Exception as exc:  # noqa: BLE001 - re-raised below, outside the nursery
            failure = exc
        finally:
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


# Set, so a run's stderr is only its last line: an unset provider key is a warning
# line at start (tests/test_keys_start.py). These runs make no call upstream.
KEYS_SET = {
    "OPENAI_API_KEY": "sk-test-not-a-real-key-0000",
    "ANTHROPIC_API_KEY": "sk-ant-test-0000",
}


def with_keys(env: dict | None) -> dict:
    return KEYS_SET | (dict(os.environ) if env is None else env)
