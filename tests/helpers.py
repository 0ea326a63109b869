"""Helpers several test files share, kept here so each exists once.

Plain functions (no fixtures: those live in conftest.py): waiting on a condition
with a deadline, reading a ledger back from its bytes, a TCP echo handler, and
running a server in a nursery of its own for the length of a block.
"""

from __future__ import annotations

import importlib
import os
import resource
import select
import signal
import sys
import time
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio
from hypothesis import settings

from docket.ledger.chain import ChainVerifier
from docket.ledger.reader import iter_lines


class LazyModule:
    """A module imported at its first attribute, not at collection: the openai and
    anthropic SDKs take seconds to import on a loaded 2-core machine, and under
    pytest-xdist every worker collects every file. `openai = LazyModule("openai")`."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


def io_examples() -> int:
    """How many examples a property runs when each example does real I/O (a server, a
    process, a file written and synced): a quarter of the loaded hypothesis profile's
    (tests/conftest.py: `ci` 12, `thorough` 250). Called where the test's @settings is
    built, at collection, once the profile is loaded."""
    return max(10, settings.default.max_examples // 4)


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


@dataclass(frozen=True)
class CliResult:
    """What a `docket` command line did: its exit code and the bytes it wrote."""

    returncode: int
    stdout: bytes
    stderr: bytes


def docket_forked(
    argv: list[str],
    *,
    cwd: str | Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    memory: int | None = None,
) -> CliResult:
    """`docket ARGV` as a process forked from this one: the CLI's `main(argv)` in a child
    with its own cwd, environment, file descriptors 1 and 2, and (with `memory`) at most
    that many bytes of address space beyond what it inherits. What only a process shows
    is still shown (an exit code, the bytes on stderr, a memory bound, a hang killed at
    `timeout`), without starting an interpreter and importing Docket for every row:
    `python -m docket` costs ~0.4 s a row on an idle 2-core machine, a fork ~10 ms.
    The few rows that are about the interpreter's start (the console script, -m) keep
    a real `python -m docket` (tests/test_hostile_inputs.py says which)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        code = 70
        try:
            os.close(out_r)
            os.close(err_r)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.chdir(cwd)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            if memory is not None:
                limit = _address_space() + memory
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115
            from docket.cli import main

            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else 2
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - shown on the child's stderr, exit 70
            os.write(2, traceback.format_exc().encode("utf-8", "replace"))
        finally:
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    deadline = time.monotonic() + timeout
    open_fds = [out_r, err_r]
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"docket {' '.join(argv)[:200]} did not end within {timeout} s")
            ready, _, _ = select.select(open_fds, [], [], left)
            for fd in ready:
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    open_fds.remove(fd)
    finally:
        os.close(out_r)
        os.close(err_r)
    _, status = os.waitpid(pid, 0)
    return CliResult(
        os.waitstatus_to_exitcode(status), b"".join(chunks[out_r]), b"".join(chunks[err_r])
    )


def _address_space() -> int:
    """This process's virtual memory size in bytes (VmSize), the base a memory bound adds to."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")
