"""docket show: one line per event, filters, --json, and --follow on a ledger a real
process is still writing."""

from __future__ import annotations

import io
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reading_ledgers import Script

from benchmarks.bench_show import PEAK  # the child's own VmHWM, as the benchmark reads it
from docket.cli import main

TESTS = Path(__file__).parent


@pytest.fixture
def ledger(tmp_path) -> Path:
    s = Script()
    s.call(model="gpt-4o-mini")
    s.call(model="claude-3-5-haiku-20241022", fail="reset", status=200)
    s.refusal("x-docket.rate-limited", retry_after_s=0.5)
    s.call(model="gpt-4o-mini")
    return s.end().write(tmp_path / "ledger.jsonl")


def show(capsys, *args: str) -> tuple[int, list[str]]:
    rc = main(["show", *args])
    return rc, capsys.readouterr().out.splitlines()


def test_one_line_per_event_with_its_columns(ledger, capsys):
    rc, lines = show(capsys, str(ledger))
    assert rc == 0 and len(lines) == 9
    first_response = lines[2].split()
    # seq, time, type, provider/model, tokens, cost, status
    assert first_response[0] == "2" and first_response[2] == "model.response"
    assert first_response[3] == "openai/gpt-4o-mini"
    assert first_response[4:7] == ["7+16", "tok", "$0.000010650"]
    assert first_response[-1] == "200"
    assert lines[4].split()[2:4] == ["model.error", "anthropic/claude-3-5-haiku-20241022"]
    assert lines[4].endswith("200 reset")


def test_filters(ledger, capsys):
    assert [ln.split()[2] for ln in show(capsys, str(ledger), "--type", "model")[1]] == [
        "model.request",
        "model.response",
        "model.request",
        "model.error",
        "model.request",
        "model.response",
    ]
    assert [ln.split()[2] for ln in show(capsys, str(ledger), "--type", "x-docket.*")[1]] == [
        "x-docket.rate-limited"
    ]
    providers = show(capsys, str(ledger), "--provider", "anthropic")[1]
    assert [ln.split()[0] for ln in providers] == ["3", "4"]
    assert [ln.split()[0] for ln in show(capsys, str(ledger), "--seq", "2..4")[1]] == [
        "2",
        "3",
        "4",
    ]
    assert [ln.split()[0] for ln in show(capsys, str(ledger), "--seq", "6..")[1]] == ["6", "7", "8"]
    assert [ln.split()[0] for ln in show(capsys, str(ledger), "--seq", "..1")[1]] == ["0", "1"]
    errors = show(capsys, str(ledger), "--errors")[1]
    assert [ln.split()[2] for ln in errors] == ["model.error", "x-docket.rate-limited"]
    both = show(capsys, str(ledger), "--errors", "--provider", "openai")[1]
    assert [ln.split()[2] for ln in both] == ["x-docket.rate-limited"]


def test_json_is_the_ledgers_own_lines(ledger, capsys):
    rc, lines = show(capsys, str(ledger), "--json", "--type", "model.response")
    assert rc == 0
    on_disk = [ln for ln in ledger.read_text().splitlines() if '"type":"model.response"' in ln]
    assert lines == on_disk and json.loads(lines[0])["seq"] == 2


@pytest.mark.parametrize("bad", ["5..2", "a..b", "..", "1..2..3", "-1"])
def test_a_bad_seq_range_is_one_line_and_exit_2(ledger, capsys, bad):
    assert main(["show", str(ledger), "--seq", bad]) == 2
    assert "--seq" in capsys.readouterr().err


def test_terminal_escapes_in_a_field_never_reach_the_terminal(tmp_path, capsys):
    s = Script()
    s.refusal("policy.denied", rule="caps.\x1b[2Jmax_usd", reason="line\nbreak")
    path = s.end().write(tmp_path / "ledger.jsonl")
    out = show(capsys, str(path))[1]
    assert len(out) == 3 and "\x1b" not in "".join(out) and "\\x1b[2J" in out[1]


def _spawn_writer(path: Path, calls: int, gap_s: float, end: bool) -> subprocess.Popen:
    code = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); from reading_ledgers import slow_write; "
        f"slow_write({str(path)!r}, {calls}, {gap_s}, {end})"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_for_first_line(path: Path, timeout_s: float = 20.0) -> None:
    """Until the writer's first line is on disk (show --follow needs the file to
    exist); a writer that never writes fails the test here, naming what it waited for."""
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.stat().st_size):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no line in {path} after {timeout_s:g} s")
        time.sleep(0.02)  # polling the condition, with the deadline above


def _spawn_show(*args: str) -> subprocess.Popen:
    """`docket show` as from a user's shell: SIGINT at its default. A pytest-xdist
    worker may hold SIGINT ignored (the controller takes Ctrl-C), and an ignored
    signal stays ignored across exec: Python then never raises KeyboardInterrupt,
    and the follow waited out its timeout (found on 2026-12-02)."""
    before = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "docket", "show", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    finally:
        signal.signal(signal.SIGINT, before)


class _Lines:
    """A child's stdout, a line at a time, with a timeout (raw reads: a buffered
    readline would hold lines the selector no longer sees)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def next(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.fd, selectors.EVENT_READ)
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0 and sel.select(left), f"no line from show within {timeout} s"
            chunk = os.read(self.fd, 65536)
            assert chunk, "show closed its output"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line + b"\n"

    def rest(self, proc: subprocess.Popen, timeout: float) -> list[bytes]:
        out, _ = proc.communicate(timeout=timeout)
        return (self.buffer + out).splitlines(keepends=True)


def test_follow_prints_a_live_run_as_it_is_written_and_stops_at_its_end(tmp_path):
    path = tmp_path / "ledger.jsonl"
    writer = _spawn_writer(path, calls=8, gap_s=0.3, end=True)
    try:
        _wait_for_first_line(path)
        follower = _spawn_show(str(path), "--follow")
        out = _Lines(follower)
        seen = [out.next(10)]
        assert b"session.start" in seen[0]
        # A call's request is printed while the writer is still at work.
        while b"model.request" not in seen[-1]:
            seen.append(out.next(10))
        assert writer.poll() is None, "the writer finished before show printed a live line"
        lines = seen + out.rest(follower, 20)
        assert follower.returncode == 0, follower.stderr.read() if follower.stderr else ""
        assert b"session.end" in lines[-1]
        assert len(lines) == 1 + 8 * 2 + 1
        assert [int(ln.split()[0]) for ln in lines] == list(range(18))
    finally:
        writer.wait(timeout=20)


def test_follow_stops_on_ctrl_c_when_the_run_has_not_ended(tmp_path):
    path = tmp_path / "ledger.jsonl"
    writer = _spawn_writer(path, calls=2, gap_s=0.01, end=False)
    follower = None
    try:
        _wait_for_first_line(path)
        follower = _spawn_show(str(path), "--follow", "--type", "model.response")
        out = _Lines(follower)
        for _ in range(2):
            assert b"model.response" in out.next(10)
        follower.send_signal(signal.SIGINT)
        rest, err = follower.communicate(timeout=10)
        assert follower.returncode == 0, err
        assert err == b"" and rest == b""
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()  # a failed test leaves no follower behind
            follower.wait(timeout=20)
        os.kill(writer.pid, signal.SIGTERM)
        writer.wait(timeout=20)


def test_follow_stops_at_the_end_of_the_seq_range(tmp_path, capsys):
    path = tmp_path / "ledger.jsonl"
    writer = _spawn_writer(path, calls=2, gap_s=0.01, end=False)  # never ends on its own
    try:
        _wait_for_first_line(path)
        follower = _spawn_show(str(path), "--follow", "--seq", "1..3")
        out, err = follower.communicate(timeout=20)
        assert follower.returncode == 0, err
        assert [int(ln.split()[0]) for ln in out.splitlines()] == [1, 2, 3]
    finally:
        os.kill(writer.pid, signal.SIGTERM)
        writer.wait(timeout=20)


def test_follow_refuses_a_tampered_line_as_it_arrives(tmp_path, capsys):
    path = Script().call().call().end().write(tmp_path / "ledger.jsonl")
    data = bytearray(path.read_bytes())
    at = data.index(b'"input_tokens":7')
    data[at + 15] = ord("8")  # a well-formed edit: the next line's prev no longer matches
    path.write_bytes(bytes(data))
    assert main(["show", str(path), "--follow"]) == 2
    captured = capsys.readouterr()
    assert "chain_break at seq 3" in captured.err
    assert len(captured.out.splitlines()) == 3  # the lines before the break


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_terminal_form_is_styled_and_still_escapes_fields(tmp_path):
    from docket.reading.show import Filter, show_command

    s = Script()
    s.call(model="gpt-4o-mini").call(fail="reset")
    s.refusal("policy.denied", rule="caps.\x1b[2Jmax_usd")
    path = s.end().write(tmp_path / "ledger.jsonl")
    out = _Terminal()
    assert show_command(str(path), Filter(), as_json=False, follow=False, out=out) == 0
    text = out.getvalue()
    assert "\x1b[31m" in text or "\x1b[1;31m" in text  # the failure and the refusal in red
    assert "\x1b[2J" not in text and "\\x1b[2J" in text
    assert "model.error" in text and len(text.splitlines()) == 7


def _peak_rss_kib(argv: list[str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PEAK, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stderr.split()[-1])


def test_memory_does_not_grow_with_the_ledger(tmp_path):
    from reading_ledgers import bulk

    small = bulk(tmp_path / "small.jsonl", 500)
    big = bulk(tmp_path / "big.jsonl", 10_000)
    assert big.stat().st_size > 10 * 1_000_000 > 10 * small.stat().st_size
    rss = {p.name: _peak_rss_kib(["show", str(p)]) for p in (small, big)}
    # 20x the ledger, the same memory (within 4 MiB of allocator noise)
    assert rss["big.jsonl"] - rss["small.jsonl"] < 4096, rss


def test_a_type_that_matches_nothing_is_one_line_naming_the_known_ones(ledger, capsys):
    """Failed before: `--type nonsense` printed nothing and exited 0, like a clean run."""
    assert main(["show", str(ledger), "--type", "nonsense"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("docket: --type 'nonsense': no event type matches it;")
    assert "model, net, policy" in err and "x-docket.*" in err
    for fine in ("model", "model.", "cache.*", "x-docket.breaker-open", "x-vendor.thing"):
        assert main(["show", str(ledger), "--type", fine]) == 0, fine
    capsys.readouterr()
