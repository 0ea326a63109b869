"""The evidence guard: write failures injected through the fault hook, and a real ENOSPC.

Every check reads the file back: whatever fails, what is on disk stays a valid
chain, the loss is disclosed in the stats, and once writing works again an
evidence.gap record precedes the next events.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys

import pytest
import trio
from helpers import append_from_tasks, read_chain

from docket.ledger.faults import FailNext, FailOrdinals, TornWrite, fail_always, os_error
from docket.ledger.limits import EvidenceLost, LedgerLimits
from docket.ledger.sync import write_durably
from docket.ledger.writer import open_ledger


@pytest.mark.parametrize(
    ("code", "name"),
    [(errno.ENOSPC, "ENOSPC"), (errno.EIO, "EIO"), (errno.EBADF, "EBADF")],
)
async def test_a_failed_range_is_disclosed_and_recorded_as_a_gap(tmp_path, code, name):
    path = tmp_path / "ledger.jsonl"
    faults = FailOrdinals(code, 5, 9)  # the 6th to 9th events offered fail
    with trio.fail_after(10):
        async with open_ledger(path, faults=faults) as ledger:
            seqs = []
            for n in range(12):
                kind = "model.response" if n % 2 else "model.request"
                seqs.append(await ledger.append(kind, call_id=f"c{n}"))
            stats = ledger.stats
    assert seqs == [0, 1, 2, 3, 4, None, None, None, None, 6, 7, 8]
    assert faults.injected == 4
    assert stats.ledger_complete is False
    assert stats.unwritten_events == 4
    assert stats.first_failing_seq == 5
    assert stats.write_failures == 4
    assert stats.unwritten_by_type == {"model.request": 2, "model.response": 2}
    assert stats.last_error.startswith(f"{name}: ")
    events = read_chain(path)
    assert [e["seq"] for e in events] == list(range(9))
    gap = events[5]
    assert gap["type"] == "evidence.gap"
    assert gap["lost"] == 4 and gap["first_failing_seq"] == 5 and gap["write_failures"] == 4
    assert gap["lost_by_type"] == {"model.request": 2, "model.response": 2}
    assert gap["error"] == f"{name}: {os.strerror(code)}"
    assert [e.get("call_id") for e in events] == [
        "c0",
        "c1",
        "c2",
        "c3",
        "c4",
        None,
        "c9",
        "c10",
        "c11",
    ]
    assert sum(e["type"] == "evidence.gap" for e in events) == 1
    assert stats.as_dict()["unwritten_events"] == 4


async def test_the_same_events_are_lost_whatever_the_batching(tmp_path):
    """Faults name events by ordinal, so 16 concurrent appenders lose exactly those."""
    path = tmp_path / "ledger.jsonl"
    faults = FailOrdinals(errno.ENOSPC, 40, 70)
    with trio.fail_after(20):
        async with open_ledger(path, faults=faults) as ledger:
            await append_from_tasks(ledger, tasks=16, each=10)
            stats = ledger.stats
    events = read_chain(path)
    assert stats.unwritten_events == 30 and stats.first_failing_seq == 40
    gaps = [e for e in events if e["type"] == "evidence.gap"]
    assert len(gaps) == 1 and gaps[0]["seq"] == 40 and gaps[0]["lost"] == 30
    assert len(events) == 160 - 30 + 1


async def test_a_gap_owed_at_close_is_written_then(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path, faults=FailNext(errno.EIO, 3)) as ledger:
            assert await ledger.append("session.start") is None
            assert await ledger.append("model.request") is None
            assert await ledger.append("session.end") is None
    # The disk works again by the time the ledger closes, so the loss is on record.
    events = read_chain(path)
    assert [e["type"] for e in events] == ["evidence.gap"]
    assert events[0]["lost"] == 3 and events[0]["first_failing_seq"] == 0
    assert events[0]["lost_by_type"] == {"model.request": 1, "session.end": 1, "session.start": 1}


async def test_a_disk_that_never_recovers_leaves_the_prefix_and_the_stats(tmp_path):
    path = tmp_path / "ledger.jsonl"
    faults = FailOrdinals(errno.ENOSPC, 3)
    with trio.fail_after(10):
        async with open_ledger(path, faults=faults) as ledger:
            for n in range(6):
                await ledger.append("model.request", call_id=f"c{n}")
            stats = ledger.stats
    events = read_chain(path)
    # At close the gap record is offered as the next ordinal, and fails like the rest.
    assert [e["call_id"] for e in events] == ["c0", "c1", "c2"]
    assert stats.unwritten_events == 3 and stats.first_failing_seq == 3


async def test_fail_fast_makes_the_first_failure_fatal(tmp_path):
    path = tmp_path / "ledger.jsonl"
    limits = LedgerLimits(fail_fast_evidence=True)
    with trio.fail_after(10):
        async with open_ledger(path, limits=limits, faults=FailOrdinals(errno.EIO, 2, 3)) as ledger:
            await ledger.append("model.request", call_id="c0")
            await ledger.append("model.request", call_id="c1")
            with pytest.raises(EvidenceLost, match="EIO"):
                await ledger.append("model.request", call_id="c2")
            # The fault is over, but the run is not allowed to carry on unrecorded.
            with pytest.raises(EvidenceLost):
                await ledger.append("session.end", reason="done")
            with pytest.raises(EvidenceLost):
                ledger.check_room("model.request")  # a probe: nothing was offered
            stats = ledger.stats
    assert [e["call_id"] for e in read_chain(path)] == ["c0", "c1"]
    # c2 failed; session.end was refused after it and never reached the disk either
    assert (stats.ledger_complete, stats.unwritten_events, stats.first_failing_seq) == (False, 2, 2)
    assert stats.unwritten_by_type == {"model.request": 1, "session.end": 1}


async def test_fail_fast_refuses_every_waiting_appender(tmp_path):
    path = tmp_path / "ledger.jsonl"
    limits = LedgerLimits(fail_fast_evidence=True)
    outcomes: list[str] = []
    with trio.fail_after(10):
        async with open_ledger(path, limits=limits, faults=FailOrdinals(errno.EIO, 20)) as ledger:

            async def appender(n: int) -> None:
                for k in range(10):
                    try:
                        await ledger.append("model.request", call_id=f"{n}-{k}")
                    except EvidenceLost:
                        outcomes.append("lost")
                        return
                outcomes.append("done")

            async with trio.open_nursery() as nursery:
                for n in range(8):
                    nursery.start_soon(appender, n)
            stats = ledger.stats
    assert outcomes == ["lost"] * 8
    events = read_chain(path)
    assert len(events) == 20 and stats.first_failing_seq == 20
    assert stats.unwritten_events >= 1


async def test_a_hook_answering_nonsense_is_a_loud_error(tmp_path):
    class Broken:
        def before_write(self, ordinal, type):
            return "ENOSPC"

    with trio.fail_after(10):
        with pytest.raises(TypeError, match="an OSError, a TornWrite or None"):
            async with open_ledger(tmp_path / "ledger.jsonl", faults=Broken()) as ledger:
                await ledger.append("model.request")


def test_the_fault_helpers():
    assert FailOrdinals(errno.EIO, 2, 4).before_write(1, "x") is None
    error = FailOrdinals(errno.EIO, 2, 4).before_write(3, "x")
    assert isinstance(error, OSError) and error.errno == errno.EIO
    once = FailNext(errno.ENOSPC, 1)
    assert once.before_write(10, "x").errno == errno.ENOSPC
    assert once.before_write(11, "x") is None
    assert fail_always().before_write(10**9, "x").errno == errno.EIO
    assert os_error(errno.EBADF).strerror == os.strerror(errno.EBADF)


def test_a_torn_write_that_cannot_be_cut_back_breaks_the_ledger():
    """A pipe takes part of the batch, then refuses; ftruncate cannot shorten a pipe."""
    r, w = os.pipe()
    try:
        os.set_blocking(w, False)
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        result = write_durably(w, b"x" * 20000, 0)
        assert result.error is not None and result.error.errno == errno.EAGAIN
        assert result.broken is not None and "cut back" in result.broken
        assert len(os.read(r, 65536)) > 0  # it really did write part of it
    finally:
        os.close(r)
        os.close(w)


# ---------------------------------------------------------------------------
# a real full filesystem


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs, mounted for the test and always unmounted; skipped where we cannot."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if not shutil.which("mount"):
        pytest.skip("no mount(8) on this machine")
    folder = tmp_path / "small"
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True, timeout=10)


async def test_a_real_full_disk(small_tmpfs, monkeypatch):
    cut_back_to: list[int] = []
    real_ftruncate = os.ftruncate

    def watched_ftruncate(fd: int, length: int) -> None:
        cut_back_to.append(length)
        real_ftruncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", watched_ftruncate)
    path = small_tmpfs / "ledger.jsonl"
    filler = small_tmpfs / "filler"
    pad = "x" * 1500  # lines that straddle pages, so the last write is cut short
    # No disk reserve: this is the writer's cut-back on a write the kernel took only
    # part of (with a reserve, tests/test_disk_full.py, ordinary writes stop first).
    limits = LedgerLimits(max_ledger_bytes=1 << 30, disk_reserve_bytes=0)
    with trio.fail_after(20):
        async with open_ledger(path, limits=limits) as ledger:
            await ledger.append("session.start", run_id="full-disk")
            # Take nearly all the free space, leaving a page or so for the ledger.
            free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
            filler.write_bytes(b"\0" * (free - 6000))
            written = []
            for n in range(12):
                written.append(await ledger.append("model.request", call_id=f"c{n}", pad=pad))
            assert written[0] is not None and None in written
            stats = ledger.stats
            assert stats.last_error.startswith("ENOSPC")
            assert stats.unwritten_events == written.count(None)
            # Mid-flight, what is on disk is already a valid chain: the kernel took
            # part of a batch, and the writer cut it back to the last durable line.
            assert len(read_chain(path)) == ledger.count
            assert ledger.bytes in cut_back_to
            filler.unlink()  # room again
            after = await ledger.append("model.request", call_id="after", pad=pad)
            assert after is not None
            await ledger.append("session.end", reason="done")
            stats = ledger.stats
    events = read_chain(path)
    gaps = [e for e in events if e["type"] == "evidence.gap"]
    assert len(gaps) == 1
    assert gaps[0]["lost"] == stats.unwritten_events == written.count(None)
    assert gaps[0]["error"].startswith("ENOSPC")
    assert gaps[0]["seq"] == stats.first_failing_seq
    assert events[gaps[0]["seq"] + 1]["call_id"] == "after"
    assert events[-1]["type"] == "session.end"


# ---------------------------------------------------------------------------
# a torn write: the process dies mid-line


class TearAt:
    """Tear the write of ordinal `at` after `keep` bytes; `crash` is what the harness does."""

    def __init__(self, at: int, keep: int, crash) -> None:
        self.at, self.keep, self.crash = at, keep, crash

    def before_write(self, ordinal, type):
        return TornWrite(self.keep, self.crash) if ordinal == self.at else None


async def test_a_torn_write_leaves_the_lines_before_it_and_part_of_its_own(tmp_path):
    path = tmp_path / "ledger.jsonl"
    crashed = []
    with trio.fail_after(10):
        async with open_ledger(path, faults=TearAt(3, 25, lambda: crashed.append(True))) as ledger:
            for n in range(3):
                await ledger.append("model.request", call_id=f"c{n}")
            # the crash "returned" (a test's stand-in): the ledger refuses to splice after it
            assert await ledger.append("model.request", call_id="c3") is None
            assert await ledger.append("model.request", call_id="c4") is None
            stats = ledger.stats
    assert crashed == [True]
    data = path.read_bytes()
    whole, _, tail = data.rpartition(b"\n")
    assert len(tail) == 25 and tail.startswith(b'{"v":1,"seq":3,')  # torn, no newline
    assert [e["call_id"] for e in read_chain_bytes(whole + b"\n")] == ["c0", "c1", "c2"]
    assert (stats.unwritten_events, stats.first_failing_seq) == (2, 3)


def read_chain_bytes(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.splitlines()]


TORN_CHILD = """
import os, signal, sys, trio
from docket.ledger.faults import TornWrite
from docket.ledger.writer import open_ledger

class Tear:
    def before_write(self, ordinal, type):
        if ordinal == 5:
            return TornWrite(40, lambda: os.kill(os.getpid(), signal.SIGKILL))
        return None

async def main():
    async with open_ledger(sys.argv[1], faults=Tear()) as ledger:
        for n in range(10):
            await ledger.append("model.request", call_id=f"c{n}")

trio.run(main)
"""


def test_a_real_crash_mid_write_leaves_a_torn_tail_doctor_quarantines(tmp_path):
    """The process SIGKILLs itself mid-line; doctor names the torn tail's offset and
    quarantine leaves a prefix that verifies (bytes read from disk throughout)."""
    path = tmp_path / "ledger.jsonl"
    child = subprocess.run(
        [sys.executable, "-c", TORN_CHILD, str(path)], capture_output=True, timeout=60
    )
    assert child.returncode == -9, child.stderr.decode()
    data = path.read_bytes()
    cut = data.rindex(b"\n") + 1
    assert len(data) - cut == 40 and data[cut:].startswith(b'{"v":1,"seq":5,')
    doctor = subprocess.run(
        [sys.executable, "-m", "docket", "doctor", "--json", str(path)],
        capture_output=True,
        timeout=60,
    )
    report = json.loads(doctor.stdout)
    assert report["verdict"] == "torn_tail", report
    assert report["tail"] == {"offset": cut, "length": 40, "whole_event": False}, report
    assert (report["events"], report["verified_bytes"]) == (5, cut), report
    quarantined = subprocess.run(
        [sys.executable, "-m", "docket", "doctor", "--quarantine-torn-tail", str(path)],
        capture_output=True,
        timeout=60,
    )
    assert quarantined.returncode == 0, quarantined.stderr.decode()
    assert path.read_bytes() == data  # the original is evidence: never rewritten
    assert (tmp_path / f"ledger.jsonl.torn-{cut}").read_bytes() == data[cut:]
    repaired = tmp_path / "ledger.jsonl.repaired"
    assert repaired.read_bytes() == data[:cut]
    clean = subprocess.run(
        [sys.executable, "-m", "docket", "doctor", "--json", str(repaired)],
        capture_output=True,
        timeout=60,
    )
    assert json.loads(clean.stdout)["verdict"] == "clean"
