"""docket doctor on real files: each kind of damage at its seq and byte offset,
torn tails at every cut, a lock held by a real second process, and quarantine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reading_ledgers import Script

from docket.errors import CheckFailed, InputError
from docket.ledger import doctor, reader
from docket.ledger.chain import (
    CHAIN_BREAK,
    COMMON_FIELDS,
    GENESIS,
    MALFORMED_LINE,
    MONO_REGRESSION,
    SEQ_GAP,
    TORN_TAIL,
    ChainVerifier,
    encode_body,
    encode_line,
    line_hash,
)
from docket.ledger.doctor import CLEAN, classify, doctor_command, quarantine_torn_tail

TS = "2026-11-29T21:52:28.123Z"

# What a short run records: enough variety (unicode, nesting, numbers) that a cut
# lands inside strings, numbers, escapes and multi-byte characters.
BODIES = [
    ("session.start", {"run_id": "r-7f3a", "argv": ["python", "agent.py"], "policy": "sha256:ab"}),
    ("process.spawn", {"pid": 4242, "argv": ["python", "agent.py"]}),
    (
        "model.request",
        {
            "call": 1,
            "provider": "openai",
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": 'Résumé of "naïve" 日本語 text'}],
            "max_tokens": 256,
        },
    ),
    (
        "model.response",
        {
            "call": 1,
            "status": 200,
            "usage": {"input_tokens": 31, "output_tokens": 112},
            "usd": 0.0000714,
            "latency_ms": 842,
            "text": "Voilà — a short answer.\nWith a newline escaped ✓",
        },
    ),
]


def build(n: int, *, seq=None, mono=None, prev=None) -> list[bytes]:
    """n chained lines (without newlines); `seq`/`mono`/`prev` map an index to a wrong value."""
    seq, mono, prev = seq or {}, mono or {}, prev or {}
    lines: list[bytes] = []
    head = GENESIS
    for i in range(n):
        kind, fields = BODIES[min(i, 2) if i < 3 else 2 + (i % 2)]
        line = encode_line(
            seq=seq.get(i, i),
            ts=TS,
            mono_ms=mono.get(i, 10 * i),
            type=kind,
            prev=prev.get(i, head),
            body=encode_body(fields),
        )
        lines.append(line)
        head = line_hash(line)
    return lines


def joined(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def offset_of(lines: list[bytes], index: int) -> int:
    return len(joined(lines[:index]))


def write(tmp_path, data: bytes, name: str = "ledger.jsonl"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def verify_bytes(data: bytes) -> ChainVerifier:
    """An independent pass of the pure verifier over whole lines."""
    verifier = ChainVerifier()
    assert data.endswith(b"\n") or not data
    for line in data.split(b"\n")[:-1]:
        verifier.feed(line)
    return verifier


def test_clean_ledger(tmp_path):
    lines = build(6)
    path = write(tmp_path, joined(lines))
    d = classify(path)
    assert (d.verdict, d.state, d.exit_code) == (CLEAN, CLEAN, 0)
    assert (d.events, d.lines, d.head) == (6, 6, line_hash(lines[-1]))
    assert d.verified_bytes == d.size == path.stat().st_size
    assert d.problem is None and d.tail is None and not d.locked


def test_tail_torn_at_every_byte_of_the_last_line(tmp_path):
    lines = build(6)
    prefix, last = joined(lines[:-1]), lines[-1] + b"\n"
    assert "✓".encode() in last  # cuts fall inside multi-byte characters too
    path = tmp_path / "ledger.jsonl"
    for cut in range(len(last) + 1):
        path.write_bytes(prefix + last[:cut])
        d = classify(path)
        if cut in (0, len(last)):  # a cut on a line boundary leaves a clean ledger
            assert d.state == CLEAN, cut
            assert d.events == (5 if cut == 0 else 6)
            continue
        assert (d.state, d.exit_code) == (TORN_TAIL, 1), cut
        assert d.tail == doctor.Tail(len(prefix), cut, whole_event=cut == len(last) - 1)
        assert (d.problem.seq, d.problem.offset) == (5, len(prefix))
        assert (d.events, d.verified_bytes) == (5, len(prefix))
        assert d.head == line_hash(lines[4])
        prefix_check = verify_bytes(path.read_bytes()[: d.tail.offset])
        assert (prefix_check.count, prefix_check.head) == (5, d.head)


json_leaf = st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=12), st.booleans(), st.none())
json_body = st.dictionaries(
    st.text(min_size=1, max_size=6).filter(lambda k: k not in COMMON_FIELDS),
    st.recursive(json_leaf, lambda kids: st.lists(kids, max_size=3), max_leaves=6),
    max_size=4,
)


@st.composite
def ledgers(draw):
    bodies = draw(st.lists(json_body, min_size=1, max_size=6))
    lines, head = [], GENESIS
    for i, fields in enumerate(bodies):
        line = encode_line(
            seq=i,
            ts=TS,
            mono_ms=draw(st.integers(0, 5)) + 5 * i,
            type="model.request",
            prev=head,
            body=encode_body(fields),
        )
        lines.append(line)
        head = line_hash(line)
    data = joined(lines)
    return lines, data, draw(st.integers(1, len(data)))


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=ledgers())
def test_any_cut_is_torn_at_the_start_of_the_cut_line(tmp_path, case):
    lines, data, cut = case
    path = write(tmp_path, data[:cut])
    boundaries = [offset_of(lines, i) for i in range(len(lines) + 1)]
    d = classify(path)
    if cut in boundaries:
        assert (d.state, d.events, d.tail) == (CLEAN, boundaries.index(cut), None)
        return
    index = max(i for i, b in enumerate(boundaries) if b < cut)
    assert d.state == TORN_TAIL
    assert (d.tail.offset, d.tail.length) == (boundaries[index], cut - boundaries[index])
    assert d.tail.whole_event == (cut == boundaries[index + 1] - 1)
    assert (d.events, d.head) == (index, line_hash(lines[index - 1]) if index else GENESIS)
    assert verify_bytes(data[: d.tail.offset]).count == index


def reference_lines(data: bytes) -> list[reader.Line]:
    pieces, lines, offset = data.split(b"\n"), [], 0
    for piece in pieces[:-1]:
        lines.append(reader.Line(offset, piece, True))
        offset += len(piece) + 1
    if pieces[-1]:
        lines.append(reader.Line(offset, pieces[-1], False))
    return lines


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(st.sampled_from([b"\n", b"a", b'{"v":', b"\xc3\xa9", b"\n\n", b"xyz" * 5])).map(
        b"".join
    ),
    chunk=st.integers(1, 17),
)
def test_iter_lines_matches_a_plain_split_at_any_chunk_size(tmp_path, data, chunk):
    path = write(tmp_path, data)
    assert list(reader.iter_lines(path, chunk=chunk)) == reference_lines(data)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(st.sampled_from([b"\n", b"a", b"bcdef", b"\n\n", b"xyz" * 3])).map(b"".join),
    chunk=st.integers(1, 17),
)
def test_no_line_longer_than_the_limit_is_read_at_any_chunk_size(
    tmp_path, monkeypatch, data, chunk
):
    # verify, doctor and the writer all read through reader.Lines: a line (or a
    # tail) over the limit stops the reading at its offset, whatever the blocks.
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 8)
    path = write(tmp_path, data)
    expected = reference_lines(data)
    too_long = next((line for line in expected if len(line.data) > 8), None)
    got = []
    if too_long is None:
        got.extend(reader.iter_lines(path, chunk=chunk))
        assert got == expected
        return
    with pytest.raises(reader.LineTooLong) as caught:
        got.extend(reader.iter_lines(path, chunk=chunk))
    assert caught.value.offset == too_long.offset
    assert got == [line for line in expected if line.offset < too_long.offset]


@pytest.mark.parametrize(
    ("damage", "code", "seq"),
    [
        ("garbled", MALFORMED_LINE, 3),
        ("bad_utf8", MALFORMED_LINE, 3),
        ("missing_field", MALFORMED_LINE, 3),
        ("prev", CHAIN_BREAK, 3),
        ("flipped_byte_in_line_2", CHAIN_BREAK, 3),
        ("seq_jump", SEQ_GAP, 3),
        ("line_removed", SEQ_GAP, 3),
        ("mono", MONO_REGRESSION, 3),
        ("garbled_last_complete_line", MALFORMED_LINE, 6),
    ],
)
def test_damage_is_named_with_its_seq_and_offset(tmp_path, damage, code, seq):
    lines = build(7)
    if damage == "garbled":
        lines[3] = b'{"v":1,"seq":3,"ts":"2026-11-29T2'
    elif damage == "bad_utf8":
        lines[3] = lines[3].replace("Voilà".encode(), b"Voil\xe0")
    elif damage == "missing_field":
        lines[3] = lines[3].replace(b'"mono_ms"', b'"mono_xx"')
    elif damage == "prev":
        lines = build(7, prev={3: "f" * 64})
    elif damage == "flipped_byte_in_line_2":
        lines[2] = lines[2].replace(b"gpt-4o-mini", b"gpt-4o-mjni")
    elif damage == "seq_jump":
        lines = build(7, seq={3: 4, 4: 5, 5: 6, 6: 7})
    elif damage == "line_removed":
        del lines[3]
    elif damage == "mono":
        lines = build(7, mono={3: 5})
    elif damage == "garbled_last_complete_line":
        lines[6] = lines[6][:40]
    path = write(tmp_path, joined(lines))
    d = classify(path)
    assert (d.verdict, d.state, d.exit_code) == (code, code, 1)
    assert (d.problem.code, d.problem.seq, d.problem.offset) == (code, seq, offset_of(lines, seq))
    assert (d.events, d.verified_bytes) == (seq, offset_of(lines, seq))
    assert d.head == line_hash(lines[seq - 1])
    assert d.lines == len(lines) and d.tail is None
    text = "\n".join(doctor.describe(d))
    assert f"seq {seq}, byte {offset_of(lines, seq)}" in text


@pytest.mark.parametrize(
    ("tail", "code"),
    [
        (b"hello, not a ledger line", MALFORMED_LINE),  # not the start of any event
        (b'{"v":1,"seq":9,"ts"', MALFORMED_LINE),  # the start of a different event
        (b"WHOLE_WRONG_PREV", CHAIN_BREAK),  # a whole event, but not the next one
    ],
)
def test_incomplete_last_line_that_is_not_a_cut_of_the_next_event_is_corrupt(tmp_path, tail, code):
    lines = build(4)
    if tail == b"WHOLE_WRONG_PREV":
        tail = build(4, prev={3: "a" * 64})[3]
    path = write(tmp_path, joined(lines[:3]) + tail)
    d = classify(path)
    assert d.state == code
    assert (d.problem.seq, d.problem.offset) == (3, offset_of(lines, 3))
    assert (d.tail.offset, d.tail.length) == (offset_of(lines, 3), len(tail))


def test_earlier_damage_wins_over_a_torn_tail_and_both_are_reported(tmp_path):
    lines = build(6, prev={2: "0" * 63 + "1"})
    path = write(tmp_path, joined(lines[:5]) + lines[5][:50])
    d = classify(path)
    assert (d.state, d.problem.seq, d.problem.offset) == (CHAIN_BREAK, 2, offset_of(lines, 2))
    assert (d.tail.offset, d.tail.length) == (offset_of(lines, 5), 50)
    text = "\n".join(doctor.describe(d))
    assert f"also: the last line (byte {offset_of(lines, 5)}, 50 bytes) has no newline" in text
    assert "2 whole lines after it not checked" in text


def test_a_line_longer_than_any_writer_makes_is_corrupt(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 4096)
    lines = build(3)
    huge = b'{"v":1,"seq":3,' + b"x" * 3 * reader.CHUNK
    path = write(tmp_path, joined(lines) + huge + b"\n")
    d = classify(path)
    assert (d.state, d.problem.seq, d.problem.offset) == (MALFORMED_LINE, 3, offset_of(lines, 3))
    assert "longer than 4096 bytes" in d.problem.detail


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no such file"),
        ("dir", "is a directory"),
        (b"", "is empty"),
        (bytes(range(256)) * 8, "not a docket ledger"),
        (b'{"hello": "world"}\n', "not a docket ledger"),
        (b'{"v":1}\n', "its first line is not a ledger line"),
        (b'{"v":2,"seq":0}\n', "its first line is not a ledger line"),
        (b'{"v":1,"seq":0,"ts":"x","mono_ms":0,"type":"t","prev":"zz"}\n', "prev must be"),
    ],
)
def test_not_a_ledger_is_an_input_error(tmp_path, content, says):
    path = tmp_path / "ledger.jsonl"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError, match=says) as caught:
        classify(path)
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


def test_a_cut_first_write_is_a_torn_tail_with_nothing_to_keep(tmp_path):
    first = build(1)[0]
    for cut in (1, 3, 5, 40):
        path = write(tmp_path, first[:cut])
        d = classify(path)
        assert (d.state, d.events, d.tail.offset, d.tail.length) == (TORN_TAIL, 0, 0, cut)
        with pytest.raises(CheckFailed, match="no readable prefix"):
            quarantine_torn_tail(d)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.jsonl"]


# --- locked by a live writer ------------------------------------------------------

HOLD_LOCK = """
import sys
from docket.ledger.lock import LedgerLock
with LedgerLock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()  # hold until the test closes our stdin
"""


async def _hold_lock_in_another_process(path):
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", HOLD_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    seen = b""
    with trio.fail_after(30):
        while b"locked\n" not in seen:
            chunk = await proc.stdout.receive_some()
            assert chunk, "the lock holder exited before taking the lock"
            seen += chunk
    return proc


async def _release(proc):
    with trio.fail_after(30):
        await proc.stdin.aclose()
        await proc.wait()


async def test_locked_by_a_live_writer_then_not_once_it_exits(tmp_path):
    path = write(tmp_path, joined(build(4)))
    proc = await _hold_lock_in_another_process(path)
    try:
        d = classify(path)
        assert (d.verdict, d.locked, d.locked_by, d.exit_code) == ("locked", True, proc.pid, 1)
        assert (d.state, d.events) == (CLEAN, 4)  # the content is still read
        with trio.fail_after(60):
            cli = await trio.run_process(
                [sys.executable, "-m", "docket", "doctor", str(path)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert cli.returncode == 1
        assert f"held by a live writer, pid {proc.pid}" in cli.stdout.decode()
        assert cli.stderr == b""
    finally:
        await _release(proc)
    assert proc.returncode == 0
    d = classify(path)
    assert (d.verdict, d.locked, d.locked_by, d.exit_code) == (CLEAN, False, None, 0)


async def test_locked_ledger_with_a_short_last_line_is_not_quarantined(tmp_path):
    lines = build(4)
    path = write(tmp_path, joined(lines[:3]) + lines[3][:30])
    proc = await _hold_lock_in_another_process(path)
    before = sorted(p.name for p in tmp_path.iterdir())  # the ledger and the writer's .lock
    try:
        d = classify(path)
        assert (d.verdict, d.state, d.locked_by) == ("locked", TORN_TAIL, proc.pid)
        assert "may be a write in progress" in "\n".join(doctor.describe(d))
        with pytest.raises(CheckFailed, match=f"locked by pid {proc.pid}"):
            doctor_command(str(path), quarantine=True)
    finally:
        await _release(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# --- quarantine -----------------------------------------------------------------------


def _snapshot(folder):
    return {
        p.name: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()
    }


@pytest.mark.parametrize("cut", [1, 77, -1], ids=["one_byte", "mid_line", "all_but_newline"])
def test_quarantine_sets_the_torn_bytes_aside_and_keeps_the_prefix(tmp_path, capsys, cut):
    lines = build(5)
    prefix = joined(lines[:4])
    torn = (lines[4] + b"\n")[:cut]
    original = prefix + torn
    path = write(tmp_path, original)
    path.chmod(0o640)
    before = path.stat()

    assert doctor_command(str(path), quarantine=True) == 0
    out = capsys.readouterr().out
    assert out.count("(written") == 2 and f"original {path} unchanged" in out
    sidecar = tmp_path / f"ledger.jsonl.torn-{len(prefix)}"
    repaired = tmp_path / "ledger.jsonl.repaired"
    assert sidecar.read_bytes() == torn
    assert repaired.read_bytes() == prefix
    assert path.read_bytes() == original
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sidecar.stat().st_mode & 0o777 == repaired.stat().st_mode & 0o777 == 0o640
    again = classify(repaired)
    assert (again.verdict, again.events, again.head) == (CLEAN, 4, line_hash(lines[3]))
    assert verify_bytes(repaired.read_bytes()).count == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ledger.jsonl",
        "ledger.jsonl.repaired",
        f"ledger.jsonl.torn-{len(prefix)}",
    ]

    # A second run finds both outputs as it would write them and changes nothing.
    first = _snapshot(tmp_path)
    assert doctor_command(str(path), quarantine=True) == 0
    assert capsys.readouterr().out.count("already there, same bytes") == 2
    assert _snapshot(tmp_path) == first


@pytest.mark.parametrize("which", ["repaired", "torn"])
def test_quarantine_never_overwrites_an_output_with_other_bytes(tmp_path, which):
    lines = build(4)
    path = write(tmp_path, joined(lines[:3]) + lines[3][:60])
    offset = offset_of(lines, 3)
    squatter = tmp_path / (
        "ledger.jsonl.repaired" if which == "repaired" else f"ledger.jsonl.torn-{offset}"
    )
    squatter.write_bytes(b"someone else's bytes\n")
    before = _snapshot(tmp_path)
    with pytest.raises(CheckFailed, match="already exists with different content") as caught:
        quarantine_torn_tail(classify(path))
    assert str(squatter) in str(caught.value)
    assert _snapshot(tmp_path) == before  # nothing written, nothing left behind


@pytest.mark.parametrize("kind", ["corrupt", "chain_break", "seq_gap"])
def test_quarantine_refuses_any_damage_but_a_torn_tail(tmp_path, kind):
    lines = {
        "corrupt": build(5)[:2] + [b"{not json"] + build(5)[3:],
        "chain_break": build(5, prev={2: "e" * 64}),
        "seq_gap": build(5, seq={2: 3, 3: 4, 4: 5}),
    }[kind]
    path = write(tmp_path, joined(lines) + lines[-1][:20])
    before = _snapshot(tmp_path)
    with pytest.raises(CheckFailed, match=f"at seq 2, byte {offset_of(lines, 2)}.*not a torn tail"):
        doctor_command(str(path), quarantine=True)
    assert _snapshot(tmp_path) == before


def test_quarantine_of_a_clean_ledger_does_nothing(tmp_path, capsys):
    path = write(tmp_path, joined(build(3)))
    before = _snapshot(tmp_path)
    assert doctor_command(str(path), quarantine=True) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert _snapshot(tmp_path) == before


def test_quarantine_syncs_both_files_and_the_folder(tmp_path, monkeypatch):
    lines = build(4)
    path = write(tmp_path, joined(lines[:3]) + lines[3][:10])
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    quarantine_torn_tail(classify(path))
    temp_files = [s for s in synced if ".tmp-" in s]
    assert any("ledger.jsonl.torn-" in s for s in temp_files)
    assert any("ledger.jsonl.repaired" in s for s in temp_files)
    assert synced.count(os.path.realpath(tmp_path)) == 2  # once after each link


def test_json_verdict_for_machines(tmp_path, capsys):
    lines = build(4)
    path = write(tmp_path, joined(lines[:3]) + lines[3][:25])
    assert doctor_command(str(path), quarantine=False, as_json=True) == 1
    (line,) = capsys.readouterr().out.splitlines()
    verdict = json.loads(line)
    assert verdict["verdict"] == TORN_TAIL and verdict["exit_code"] == 1
    assert verdict["tail"] == {"offset": offset_of(lines, 3), "length": 25, "whole_event": False}
    assert verdict["problem"]["seq"] == 3 and verdict["head"] == line_hash(lines[2])

    assert doctor_command(str(path), quarantine=True, as_json=True) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["quarantine"]["repaired"]["verdict"] == CLEAN
    assert done["quarantine"]["torn_written"] is True


def test_cli_exit_codes_and_summary(tmp_path):
    lines = build(4)
    path = write(tmp_path, joined(lines[:3]) + lines[3][:25])

    def docket(*args):
        return subprocess.run(
            [sys.executable, "-m", "docket", *args], capture_output=True, timeout=60, check=False
        )

    torn = docket("doctor", str(path))
    assert (torn.returncode, torn.stderr) == (1, b"")
    assert f"torn tail at byte {offset_of(lines, 3)}" in torn.stdout.decode()
    fixed = docket("doctor", str(path), "--quarantine-torn-tail")
    assert (fixed.returncode, fixed.stderr) == (0, b"")
    clean = docket("doctor", str(tmp_path / "ledger.jsonl.repaired"))
    assert clean.returncode == 0 and "verdict  clean" in clean.stdout.decode()


def test_a_chain_break_before_session_end_says_the_end_is_there_unverified(tmp_path, capsys):
    """Failed before: a ledger tampered mid-way, whose session.end is its last line, was
    said to have none ("the run was killed")."""
    s = Script()
    for i in range(3):
        s.call(body=f"q {i}")
    path = s.end().write(tmp_path / "ledger.jsonl")
    data = bytearray(path.read_bytes())
    at = data.index(b'"input_tokens":7')
    data[at + 15] = ord("9")
    path.write_bytes(bytes(data))
    assert doctor_command(str(path), quarantine=False) == 1
    out = capsys.readouterr().out
    assert "chain" in out
    assert "a session.end is the last line, but past the chain's problem: not verified" in out
    assert "killed" not in out
    assert doctor_command(str(path), quarantine=False, as_json=True) == 1
    evidence = json.loads(capsys.readouterr().out)["evidence"]
    assert evidence["session_end"] is False and evidence["session_end_unverified"] is True
