"""One writer per ledger: a second writer, in this process or another, is refused by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import trio
from helpers import read_events

from docket.ledger.lock import LedgerLock, LedgerLocked, holder_pid
from docket.ledger.writer import open_ledger

# A second process that opens the ledger, records one event, says so, and
# holds the lock until its stdin closes.
HOLDER = """
import sys, trio
from docket.ledger.writer import open_ledger

async def main():
    async with open_ledger(sys.argv[1]) as ledger:
        await ledger.append("session.start", run_id="holder")
        print("holding", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)

trio.run(main)
"""

# A second process that tries to open the ledger and reports what happened.
CONTENDER = """
import sys, trio
from docket.ledger.lock import LedgerLocked
from docket.ledger.writer import open_ledger

async def main():
    try:
        async with open_ledger(sys.argv[1]):
            print("opened")
    except LedgerLocked as exc:
        print(exc)
        sys.exit(3)

trio.run(main)
"""


def chain_length(path) -> int:
    return len(read_events(path))


class Holder:
    """The HOLDER script as a real process, owned by one test."""

    def __init__(self, path) -> None:
        self.path = path
        self.process: trio.Process | None = None

    async def start(self) -> trio.Process:
        self.process = await trio.lowlevel.open_process(
            [sys.executable, "-c", HOLDER, str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        said = b""
        while b"\n" not in said:
            chunk = await self.process.stdout.receive_some(64)
            assert chunk, "the holder exited before taking the lock"
            said += chunk
        assert said.strip() == b"holding"
        return self.process

    async def release(self) -> int:
        assert self.process is not None
        await self.process.stdin.aclose()
        return await self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


async def test_a_second_writer_in_this_process_is_refused_by_pid(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path) as ledger:
            await ledger.append("session.start")
            with pytest.raises(LedgerLocked) as caught:
                async with open_ledger(path):
                    pytest.fail("two writers on one ledger")
            assert holder_pid(path) == os.getpid()
            await ledger.append("session.end")
        assert str(caught.value) == f"ledger {path} is locked by pid {os.getpid()}"
        assert holder_pid(path) is None
        # Released: a new writer continues the chain.
        async with open_ledger(path) as ledger:
            assert await ledger.append("session.start") == 2
    assert chain_length(path) == 3


async def test_a_writer_in_another_process_is_refused_by_its_pid(tmp_path):
    path = tmp_path / "ledger.jsonl"
    holder = Holder(path)
    try:
        with trio.fail_after(30):
            child = await holder.start()
            with pytest.raises(LedgerLocked, match=f"locked by pid {child.pid}$"):
                async with open_ledger(path):
                    pytest.fail("two writers on one ledger")
            assert holder_pid(path) == child.pid
            assert await holder.release() == 0
            async with open_ledger(path) as ledger:
                assert await ledger.append("session.end") == 1
    finally:
        holder.kill()
    assert chain_length(path) == 2


async def test_another_process_is_refused_while_we_hold_it(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(30):
        async with open_ledger(path) as ledger:
            await ledger.append("session.start")
            done = await trio.run_process(
                [sys.executable, "-c", CONTENDER, str(path)], capture_stdout=True, check=False
            )
            await ledger.append("session.end")
    assert done.returncode == 3
    assert done.stdout.decode().strip() == f"ledger {path} is locked by pid {os.getpid()}"
    assert chain_length(path) == 2


async def test_a_killed_holder_does_not_block_the_next_writer(tmp_path):
    path = tmp_path / "ledger.jsonl"
    holder = Holder(path)
    try:
        with trio.fail_after(30):
            child = await holder.start()
            os.kill(child.pid, signal.SIGKILL)
            assert await child.wait() == -signal.SIGKILL
            assert holder_pid(path) is None  # the kernel dropped the lock with its holder
            async with open_ledger(path) as ledger:
                assert await ledger.append("session.end", reason="holder killed") == 1
    finally:
        holder.kill()
    assert chain_length(path) == 2


async def test_the_lock_is_released_when_the_block_fails(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        with pytest.raises(ZeroDivisionError):
            async with open_ledger(path) as ledger:
                await ledger.append("session.start")
                1 / 0  # noqa: B018 - the failure under test
        assert holder_pid(path) is None
        async with open_ledger(path) as ledger:
            assert ledger.count == 1


def test_a_refused_lock_leaves_the_holder_alone(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with LedgerLock(path):
        with pytest.raises(LedgerLocked):
            LedgerLock(path).acquire()
        assert holder_pid(path) == os.getpid()  # the refused attempt did not rewrite the pid
    assert holder_pid(path) is None


def test_holder_pid_only_observes_it_never_takes_the_lock(tmp_path, monkeypatch):
    # Taking the lock to look, even for an instant, would refuse a writer starting then.
    import os

    from docket.ledger import lock as lock_module

    ledger = tmp_path / "ledger.jsonl"
    held = lock_module.LedgerLock(ledger)
    held.acquire()
    try:

        def no_flock(*args):
            raise AssertionError("holder_pid took a lock")

        monkeypatch.setattr(lock_module.fcntl, "flock", no_flock)
        assert lock_module.holder_pid(ledger) == os.getpid()
    finally:
        monkeypatch.undo()
        held.release()
    assert lock_module.holder_pid(ledger) is None


def test_a_second_docket_run_on_a_used_ledger_dir_is_refused_and_writes_nothing(tmp_path):
    """FMEA F23 at the command line: a run pointed at a folder that already holds a
    ledger (a restart over a live one, a copied command line) refuses to start, in one
    line with exit 2, and the first run's ledger and receipt are left byte for byte."""
    folder = tmp_path / "runs"
    argv = [sys.executable, "-m", "docket", "run", "--ledger-dir", str(folder), "--", "true"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2
    assert second.stderr.strip().splitlines()[-1] == (
        f"docket: ledger {folder / 'ledger.jsonl'} already exists: give --ledger-dir a new folder"
    )
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
