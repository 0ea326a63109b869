"""Bad inputs to explain, show and diff: one line naming the problem, exit 2, no traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from reading_ledgers import Script, seal

from docket.cli import main


@pytest.fixture
def good(tmp_path) -> Path:
    s = Script()
    for i in range(3):
        s.call(body=f"q {i}")
    return s.end().write(tmp_path / "ledger.jsonl")


def _tampered(good: Path) -> bytes:
    data = bytearray(good.read_bytes())
    at = data.index(b'"input_tokens":7')
    data[at + 15] = ord("9")  # still JSON: the chain catches it at the next line
    return bytes(data)


def _line(event: bytes) -> bytes:
    return b'{"v":1,"seq":0,"ts":"t","mono_ms":0,"type":"x","prev":"' + b"0" * 64 + event


LEDGERS = {
    "missing": (None, "no such file"),
    "empty": (b"", "is empty"),
    "binary": (b"\x00\x01\x02\xff" * 100, "not a docket ledger"),
    "json, not a ledger": (b'{"hello": "world"}\n', "not a docket ledger"),
    "malformed line": (b'{"v":1,"seq":0,"ts":"t",,,\n', "malformed_line at seq 0"),
    "500 deep": (b'{"v":' + b"[" * 500 + b"]" * 500 + b"}\n", "nested more than 64"),
    "common field missing": (b'{"v":1,"seq":0}\n', "missing field"),
    "duplicate key": (_line(b'","type":"y"}\n'), "duplicate key"),
    "bad event": (
        _line(b'","cost_nusd":"1"}\n').replace(b'"x"', b'"model.error"'),
        "malformed event at seq 0",
    ),
}


def _make(tmp_path: Path, good: Path, name: str) -> Path:
    path = tmp_path / "bad.jsonl"
    if name in LEDGERS:
        data = LEDGERS[name][0]
        if data is not None:
            path.write_bytes(data)
    elif name == "torn":
        path.write_bytes(good.read_bytes()[:-20])
    elif name == "tampered":
        path.write_bytes(_tampered(good))
    elif name == "huge line":
        with open(path, "wb") as f:  # a line past the reader's 64 MiB bound, never held whole
            f.write(b'{"v":1,"s":"')
            f.write(b"x" * (65 << 20))
    elif name == "folder without a ledger":
        path = tmp_path / "run"
        path.mkdir()
    return path


CASES = [
    *LEDGERS,
    "torn",
    "tampered",
    "folder without a ledger",
]
EXPECT = {name: problem for name, (_, problem) in LEDGERS.items()} | {
    "torn": "torn tail",
    "tampered": "chain_break at seq 3",
    "huge line": "longer than 67108864 bytes",
    "folder without a ledger": "no ledger.jsonl",
}


def _one_line_exit_2(capsys, argv: list[str], problem: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("docket: ") and err.count("\n") == 1, err
    assert problem in err and "Traceback" not in err


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("verb", ["explain", "show"])
def test_a_bad_ledger(tmp_path, good, capsys, verb, name):
    path = _make(tmp_path, good, name)
    _one_line_exit_2(capsys, [verb, str(path)], EXPECT[name])


@pytest.mark.parametrize("verb", ["explain", "show"])
def test_a_line_past_the_length_bound(tmp_path, good, capsys, verb):
    path = _make(tmp_path, good, "huge line")
    _one_line_exit_2(capsys, [verb, str(path)], EXPECT["huge line"])


def test_show_prints_the_lines_before_a_break_then_names_it(tmp_path, good, capsys):
    path = _make(tmp_path, good, "tampered")
    assert main(["show", str(path)]) == 2
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 3 and "chain_break at seq 3" in captured.err


RECEIPTS = {
    "missing": (None, "no such file"),
    "empty": (b"", "is empty"),
    "binary": (b"\x00\xff" * 10, "binary data"),
    "not JSON": (b"{receipt", "not JSON"),
    "not a receipt": (b'{"hello": 1}', "not a docket receipt"),
    "huge": (b" " * (17 << 20), "MiB a receipt may be"),
}


@pytest.mark.parametrize("name", RECEIPTS)
@pytest.mark.parametrize("side", [0, 1])
def test_diff_a_bad_receipt(tmp_path, good, capsys, name, side):
    receipt = seal(good)
    bad = tmp_path / "bad.json"
    data, problem = RECEIPTS[name]
    if data is not None:
        bad.write_bytes(data)
    pair = [str(receipt), str(bad)] if side else [str(bad), str(receipt)]
    _one_line_exit_2(capsys, ["diff", *pair], problem)


def test_diff_a_receipt_whose_claims_were_edited(tmp_path, good, capsys):
    receipt = seal(good)
    other = tmp_path / "other"
    other.mkdir()
    (other / "ledger.jsonl").write_bytes(good.read_bytes())
    text = receipt.read_text().replace('"model_calls": 3', '"model_calls": 2', 1)
    (other / "receipt.json").write_text(text)
    _one_line_exit_2(capsys, ["diff", str(receipt), str(other / "receipt.json")], "does not verify")


@pytest.mark.parametrize("damage", ["tampered", "torn", "missing"])
def test_diff_a_receipt_whose_ledger_is_damaged(tmp_path, good, capsys, damage):
    receipt = seal(good)
    other = tmp_path / "other"
    other.mkdir()
    (other / "receipt.json").write_bytes(receipt.read_bytes())
    if damage == "tampered":
        (other / "ledger.jsonl").write_bytes(_tampered(good))
    elif damage == "torn":
        (other / "ledger.jsonl").write_bytes(good.read_bytes()[:-20])
    problem = {"tampered": "chain_break", "torn": "torn_tail", "missing": "no such file"}[damage]
    _one_line_exit_2(capsys, ["diff", str(receipt), str(other / "receipt.json")], problem)


@pytest.mark.parametrize("verb", ["explain", "show"])
def test_a_line_being_written_under_a_live_writers_lock_is_not_a_tear(tmp_path, good, capsys, verb):
    from docket.ledger.lock import LedgerLock

    path = tmp_path / "live.jsonl"
    path.write_bytes(good.read_bytes()[:-20])  # the last line's write, in progress
    with LedgerLock(path):  # the writer is alive: it holds the ledger's lock
        assert main([verb, str(path), *(["--json"] if verb == "explain" else [])]) == 0
    out = capsys.readouterr().out
    if verb == "explain":
        assert '"live_writer_pid": ' + str(os.getpid()) in out
    else:
        assert len(out.splitlines()) == 7  # every complete line; the partial one waits
    assert main([verb, str(path)]) == 2  # no writer: the same bytes are a torn tail
    assert "torn tail" in capsys.readouterr().err
