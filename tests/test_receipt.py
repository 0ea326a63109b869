"""The tally, the receipt (build, write, every claim checked) and `docket verify`'s inputs.

Ledgers are built with the pure chain.encode_line and written to tmp_path; the
expected totals below are worked out by hand from the events, not by the tally.
"""

from __future__ import annotations

import copy
import json
import os
import time
from decimal import Decimal
from pathlib import Path

import pytest

from docket.cli import main
from docket.ledger.chain import GENESIS, encode_body, encode_line, line_hash
from docket.ledger.strict_json import AmbiguousJSON, decode_json
from docket.receipts.receipt import build_receipt, encode_receipt, write_receipt
from docket.receipts.tally import UNBACKED, Tally, TallyError, usd
from docket.receipts.verify import VerifyInputError, verify

COMPLETE = {
    "ledger_complete": True,
    "unwritten_events": 0,
    "first_failing_seq": None,
    "write_failures": 0,
}
GPT = {"input": "2.50", "output": "10.00", "cached_input": "1.25"}
MINI = {"input": "0.15", "output": "0.60", "cached_input": "0.075"}


def start(**extra) -> tuple[str, int, dict]:
    fields = {
        "run_id": "run-1",
        "docket_version": "0.1.0",
        "policy_digest": "sha256:" + "cd" * 32,
        "pricing": {"table_date": "2026-11-01", "provenance": "test table"},
        "caps": {"usd": "1.00", "calls": 10},
    }
    return "session.start", 0, fields | extra


def end(mono_ms: int, **extra) -> tuple[str, int, dict]:
    fields = {"reason": "child exited", "exit_status": 0, "cap": None, "evidence": COMPLETE}
    return "session.end", mono_ms, fields | extra


def response(mono_ms, model, tokens_in, tokens_out, cached, cost, prices=None, call_id="c"):
    fields = {
        "call_id": call_id,
        "model": model,
        "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out, "cached_tokens": cached},
        "cost_nusd": cost,
        "priced": prices is not None,
    }
    if prices is not None:
        fields["unit_prices"] = prices
    return "model.response", mono_ms, fields


# A run with its totals worked out by hand:
#   gpt-4o:      2 requests, 1 response (1000 in, 200 out, 400 cached; 3_000_000 nUSD),
#                1 error (charged the 500_000 nUSD reservation), 1 refusal
#   gpt-4o-mini: 1 request, 1 response (100 in, 50 out; 45_000 nUSD)
#   unpriced:    1 request, 1 unpriced response (10 in, 5 out)
RUN = [
    start(chaos={"seed": 7, "faults": ["upstream:status(503)@call 2"]}),
    ("process.spawn", 1, {"pid": 10, "argv": ["agent"]}),
    ("model.request", 10, {"call_id": "c1", "model": "gpt-4o"}),
    response(900, "gpt-4o", 1000, 200, 400, 3_000_000, GPT, call_id="c1"),
    ("fault.injected", 950, {"fault": "upstream:status(503)@call 2", "seed": 7, "ordinal": 2}),
    ("model.request", 960, {"call_id": "c2", "model": "gpt-4o"}),
    (
        "model.error",
        1000,
        {"call_id": "c2", "model": "gpt-4o", "reason": "503", "usage": None, "cost_nusd": 500_000},
    ),
    ("policy.denied", 1100, {"rule": "egress", "model": "gpt-4o"}),
    ("model.request", 1200, {"call_id": "c3", "model": "gpt-4o-mini"}),
    response(1500, "gpt-4o-mini", 100, 50, 0, 45_000, MINI, call_id="c3"),
    ("cap.warning", 1501, {"cap": "calls", "limit": 10, "observed": 8}),
    ("model.request", 1600, {"call_id": "c4", "model": "unpriced"}),
    response(1700, "unpriced", 10, 5, 0, 0, call_id="c4"),
    ("cap.exceeded", 1800, {"cap": "usd", "limit": "1.00", "observed": "1.20"}),
    ("cap.exceeded", 1801, {"cap": "usd", "limit": "1.00", "observed": "1.30"}),
    ("agent.backoff", 1802, {"ms": 100}),
    ("process.exit", 1900, {"pid": 10, "status": -15, "reason": "signal"}),
    end(2000, reason="cap exceeded: usd", exit_status=42, cap="usd"),
]


def events_of(run) -> list[dict]:
    return [
        {"v": 1, "seq": seq, "ts": f"2026-11-29T10:00:0{mono // 1000}.{mono % 1000:03d}Z"}
        | {"mono_ms": mono, "type": kind}
        | fields
        for seq, (kind, mono, fields) in enumerate(run)
    ]


def write_run(folder: Path, run=RUN, *, evidence=COMPLETE, end_event=None) -> Path:
    """Ledger and receipt in `folder`, as the recorder would leave them; returns the receipt."""
    prev, lines, tally = GENESIS, [], Tally()
    for event in events_of(run):
        fields = {k: v for k, v in event.items() if k not in ("v", "seq", "ts", "mono_ms", "type")}
        line = encode_line(
            seq=event["seq"],
            ts=event["ts"],
            mono_ms=event["mono_ms"],
            type=event["type"],
            prev=prev,
            body=encode_body(fields),
        )
        tally.add(event)
        lines.append(line)
        prev = line_hash(line)
    data = b"".join(line + b"\n" for line in lines)
    (folder / "ledger.jsonl").write_bytes(data)
    receipt = build_receipt(
        tally,
        ledger_path=folder / "ledger.jsonl",
        head=prev,
        count=len(lines),
        size=len(data),
        evidence=evidence,
        version="0.1.0",
        end=end_event,
    )
    write_receipt(folder / "receipt.json", receipt)
    return folder / "receipt.json"


# ---------------------------------------------------------------- the tally


def test_tally_totals_match_the_hand_count():
    tally = Tally()
    for event in events_of(RUN):
        tally.add(event)
    claims = tally.to_claims()
    t = claims["totals"]
    assert t["model_calls"] == 4 and t["responses"] == 3 and t["errors"] == 1
    assert t["refused"] == 1 and t["unpriced_calls"] == 1
    assert (t["input_tokens"], t["output_tokens"], t["cached_tokens"]) == (1110, 255, 400)
    assert t["cost_nusd"] == 3_545_000 and t["usd"] == "0.003545000"
    gpt = t["by_model"]["gpt-4o"]
    assert (gpt["model_calls"], gpt["responses"], gpt["errors"], gpt["refused"]) == (2, 1, 1, 1)
    assert gpt["cost_nusd"] == 3_500_000 and gpt["usd"] == "0.003500000"
    assert t["by_model"]["unpriced"]["unpriced_calls"] == 1
    assert claims["pricing"]["unit_prices"] == {"gpt-4o": GPT, "gpt-4o-mini": MINI}
    assert claims["caps"]["warnings"] == [{"cap": "calls", "seq": 10, "limit": 10, "observed": 8}]
    # only the first breach of each cap
    assert claims["caps"]["breaches"] == [
        {"cap": "usd", "seq": 13, "limit": "1.00", "observed": "1.20"}
    ]
    assert claims["faults"] == {
        "seed": 7,
        "plan": {"faults": ["upstream:status(503)@call 2"]},  # session.start's chaos, less its seed
        "injected": 1,
        "by_fault": {"upstream:status(503)@call 2": 1},
        "by_layer": {"upstream": 1},  # the fault text's target: the event names none
    }
    assert claims["exit"] == {"status": 42, "reason": "cap exceeded: usd", "cap": "usd"}
    assert claims["duration_ms"] == 2000 and claims["run_id"] == "run-1"
    assert tally.events == len(RUN)


@pytest.mark.parametrize(
    ("nusd", "text"),
    [
        (0, "0.000000000"),
        (1, "0.000000001"),
        (1_234_000, "0.001234000"),
        (12 * 10**9 + 5, "12.000000005"),
    ],
)
def test_usd_is_nano_usd_with_nine_places(nusd, text):
    assert usd(nusd) == text


BAD_EVENTS = [
    (
        "model.response",
        {"model": "m", "usage": {"input_tokens": -1}, "cost_nusd": 0, "priced": False},
        "input_tokens",
    ),
    (
        "model.response",
        {"model": "m", "usage": {"input_tokens": True}, "cost_nusd": 0, "priced": False},
        "input_tokens",
    ),
    ("model.response", {"model": "m", "cost_nusd": 2**53, "priced": False}, "cost_nusd"),
    ("model.response", {"model": "m", "cost_nusd": "5", "priced": False}, "cost_nusd"),
    ("model.response", {"model": "m", "cost_nusd": 5}, "priced"),
    ("model.response", {"model": "m", "cost_nusd": 5, "priced": True}, "unit_prices"),
    (
        "model.response",
        {"model": "m", "cost_nusd": 5, "priced": True, "unit_prices": GPT | {"input": "2.5001"}},
        "unit_prices.input",
    ),
    ("model.response", {"model": 4, "cost_nusd": 5, "priced": False}, "model"),
    ("model.error", {"model": "m"}, "cost_nusd"),
    ("model.request", {"model": ["m"]}, "model"),
    ("model.request", {"model": "m", "provider": 1}, "model.request.provider"),
    ("model.request", {"model": "m", "base_url": 443}, "base_url"),
    ("model.error", {"model": "m", "cost_nusd": 0, "provider": ["p"]}, "model.error.provider"),
    ("policy.denied", {"model": "m", "rule": 7}, "policy.denied.rule"),
    ("policy.denied", {"model": "m", "provider": 7}, "policy.denied.provider"),
    ("breaker.state", {"upstream": "u", "from": "closed"}, "breaker.state.to"),
    ("breaker.state", {"upstream": 1, "from": "closed", "to": "open"}, "upstream"),
    ("fault.injected", {"fault": "x", "seed": 7, "target": 3}, "fault.injected.target"),
    ("cap.exceeded", {"cap": "usd", "limit": 1}, "observed"),
    ("fault.injected", {"fault": "x", "seed": 8}, "seed"),
    ("evidence.gap", {"lost": 1}, "first_failing_seq"),
    ("session.start", {}, "session.start"),
    (
        "session.end",
        {"reason": "x", "evidence": COMPLETE | {"ledger_complete": 1}},
        "ledger_complete",
    ),
    (
        "session.end",
        {"reason": "x", "evidence": COMPLETE, "refused_unrecorded": {"ledger": -1}},
        "refused_unrecorded",
    ),
    ("session.end", {"reason": "x", "evidence": COMPLETE, "refused_unrecorded": []}, "refused"),
]


@pytest.mark.parametrize(("kind", "fields", "named"), BAD_EVENTS)
def test_an_event_the_tally_cannot_read_is_refused_by_name_and_leaves_no_trace(kind, fields, named):
    tally = Tally()
    tally.add(events_of([start(chaos={"seed": 7})])[0])
    before = copy.deepcopy(tally.to_claims())
    event = {"v": 1, "seq": 1, "ts": "t", "mono_ms": 1, "type": kind} | fields
    with pytest.raises(TallyError, match=named.replace(".", r"\.")):
        tally.add(event)
    assert tally.to_claims() == before and tally.events == 1


def test_unit_prices_may_not_change_within_a_run():
    tally = Tally()
    for event in events_of([start(), response(5, "gpt-4o", 1, 1, 0, 1, GPT)]):
        tally.add(event)
    cheaper = events_of([start(), response(9, "gpt-4o", 1, 1, 0, 1, GPT | {"output": "9.00"})])[1]
    with pytest.raises(TallyError, match="differ"):
        tally.add(cheaper)


def test_session_end_is_last_and_session_start_first():
    tally = Tally()
    for event in events_of([start(), end(5)]):
        tally.add(event)
    with pytest.raises(TallyError, match="after session.end"):
        tally.add({"v": 1, "seq": 2, "ts": "t", "mono_ms": 6, "type": "agent.backoff"})
    late = Tally()
    late.add({"v": 1, "seq": 0, "ts": "t", "mono_ms": 0, "type": "process.spawn", "pid": 1})
    with pytest.raises(TallyError, match="first event"):
        late.add(events_of([start()])[0])


def test_claims_from_events_never_written_are_unbacked():
    tally = Tally()
    for event in events_of(RUN[:3]):
        tally.add(event)
    claims = tally.to_claims()
    assert claims["ended_at"] is UNBACKED and claims["exit"] is UNBACKED
    assert claims["duration_ms"] is UNBACKED and claims["run_id"] == "run-1"
    headless = Tally()
    headless.add({"v": 1, "seq": 0, "ts": "t", "mono_ms": 0, "type": "process.spawn", "pid": 1})
    assert headless.to_claims()["run_id"] is UNBACKED


# ---------------------------------------------------------------- building and writing


def test_written_receipt_is_sorted_json_with_a_trailing_newline(tmp_path):
    receipt_path = write_run(tmp_path)
    data = receipt_path.read_bytes()
    assert data.endswith(b"}\n")
    receipt = json.loads(data)
    assert list(receipt) == sorted(receipt)
    assert receipt["format"] == "docket-receipt-1"
    assert receipt["ledger"] == {
        "file": "ledger.jsonl",
        "events": len(RUN),
        "head": line_hash((tmp_path / "ledger.jsonl").read_bytes().splitlines()[-1]),
        "bytes": (tmp_path / "ledger.jsonl").stat().st_size,
    }
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_write_receipt_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "receipt.json"
    write_receipt(target, {"format": "docket-receipt-1", "a": 1})
    before = target.read_bytes()
    with pytest.raises(TypeError):
        write_receipt(target, {"format": "docket-receipt-1", "a": object()})
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["receipt.json"]


def test_build_receipt_refuses_claims_the_ledger_cannot_back(tmp_path):
    tally = Tally()
    for event in events_of(RUN[:3]):
        tally.add(event)
    with pytest.raises(ValueError, match="ended_at"):
        build_receipt(
            tally,
            ledger_path=tmp_path / "l.jsonl",
            head=GENESIS,
            count=3,
            size=1,
            evidence=COMPLETE,
            version="0.1.0",
        )
    with pytest.raises(ValueError, match="count 4"):
        build_receipt(
            tally,
            ledger_path="l",
            head=GENESIS,
            count=4,
            size=1,
            evidence=COMPLETE,
            version="0.1.0",
        )


# ---------------------------------------------------------------- verify: the claims


def test_an_honest_receipt_verifies(tmp_path):
    receipt_path = write_run(tmp_path)
    verdict = verify(receipt_path)
    assert verdict.ok and verdict.code is None
    assert verdict.events == len(RUN)
    assert verdict.bytes == (tmp_path / "ledger.jsonl").stat().st_size
    assert verdict.claims["totals"]["cost_nusd"] == 3_545_000
    assert verdict.unbacked == ()


def leaves(value, path=()):
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from leaves(sub, (*path, key))
    elif isinstance(value, list) and value:
        for i, sub in enumerate(value):
            yield from leaves(sub, (*path, i))
    else:
        yield path, value


SECTION_CODES = {
    "run_id": "run_mismatch",
    "docket_version": "run_mismatch",
    "started_at": "run_mismatch",
    "ended_at": "run_mismatch",
    "duration_ms": "duration_mismatch",
    "exit": "exit_mismatch",
    "totals": "total_mismatch",
    "pricing": "pricing_mismatch",
    "caps": "caps_mismatch",
    "policy_digest": "policy_mismatch",
    "faults": "faults_mismatch",
    "ops": "evidence_mismatch",
}
LEDGER_CODES = {"events": "count_mismatch", "head": "head_mismatch", "bytes": "bytes_mismatch"}


def changed(value):
    """Another value of the same JSON type (so the receipt keeps its shape)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        if len(value) == 64 and set(value) <= set("0123456789abcdef"):
            return ("1" if value[0] == "0" else "0") + value[1:]
        if value.count(".") == 1 and value.replace(".", "").isdigit():  # a price or usd
            return value[:-1] + ("1" if value[-1] == "0" else "0")
        return value + "x"
    return 1  # null: an integer is a value every nullable field takes


def test_every_claim_changed_is_caught_with_its_code(tmp_path):
    receipt_path = write_run(tmp_path)
    honest = json.loads(receipt_path.read_text())
    tried = 0
    for path, value in leaves(honest):
        if path in (("format",), ("ledger", "file")):
            continue  # what the receipt is, and where its ledger is: input, not claims
        if path[:2] == ("ops", "evidence") and path[2] != "ledger_complete":
            continue  # these move with ledger_complete: tried below as one
        tampered = copy.deepcopy(honest)
        node = tampered
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = changed(value)
        receipt_path.write_bytes(encode_receipt(tampered))
        verdict = verify(receipt_path)
        want = LEDGER_CODES[path[1]] if path[0] == "ledger" else SECTION_CODES[path[0]]
        assert (verdict.ok, verdict.code) == (False, want), (path, verdict.summary())
        tried += 1
    assert tried > 60


def test_changed_evidence_is_caught(tmp_path):
    receipt_path = write_run(tmp_path)
    honest = json.loads(receipt_path.read_text())
    for evidence in (
        {
            "ledger_complete": False,
            "unwritten_events": 1,
            "first_failing_seq": 3,
            "write_failures": 1,
        },
        COMPLETE | {"first_failing_seq": 0},
        COMPLETE | {"write_failures": 1},
    ):
        receipt_path.write_bytes(encode_receipt(honest | {"ops": {"evidence": evidence}}))
        assert verify(receipt_path).code == "evidence_mismatch"


def test_a_receipt_may_disclose_a_session_end_that_was_never_written(tmp_path):
    run = RUN[:-1]
    lost = {
        "ledger_complete": False,
        "unwritten_events": 1,
        "first_failing_seq": len(run),
        "write_failures": 1,
    }
    unwritten_end = events_of(RUN)[-1] | {"evidence": lost}
    receipt_path = write_run(tmp_path, run, evidence=lost, end_event=unwritten_end)
    verdict = verify(receipt_path)
    assert verdict.ok, verdict.summary()
    assert verdict.unbacked == ("ended_at", "duration_ms", "exit")
    assert "not backed by the ledger: ended_at, duration_ms, exit" in verdict.summary()


def test_the_default_ledger_is_found_beside_the_receipt_wherever_we_run(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    receipt_path = write_run(run_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert verify(os.path.relpath(receipt_path, elsewhere)).ok


# ---------------------------------------------------------------- docket verify, the command


def test_cli_ok_is_one_line_and_exit_0(tmp_path, capsys):
    receipt_path = write_run(tmp_path)
    assert main(["verify", str(receipt_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"ok: {len(RUN)} events, head ")


def test_cli_names_the_first_failure_with_code_seq_and_offset(tmp_path, capsys):
    receipt_path = write_run(tmp_path)
    ledger = tmp_path / "ledger.jsonl"
    lines = ledger.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b'"output_tokens":200', b'"output_tokens":100')
    ledger.write_bytes(b"\n".join(lines))
    offset = sum(len(line) + 1 for line in lines[:4])
    assert main(["verify", str(receipt_path)]) == 1
    assert capsys.readouterr().out == (
        f"FAIL chain_break at seq 4, byte {offset}: "
        "prev does not match the hash of the line before\n"
    )


def test_cli_explicit_ledger(tmp_path, capsys):
    receipt_path = write_run(tmp_path)
    moved = tmp_path / "moved.jsonl"
    (tmp_path / "ledger.jsonl").rename(moved)
    assert main(["verify", str(receipt_path), "--ledger", str(moved)]) == 0
    assert main(["verify", str(receipt_path)]) == 2
    assert "ledger_unreadable" in capsys.readouterr().err


INPUT_CASES = {
    "receipt missing": ("receipt", None, "no such file"),
    "receipt empty": ("receipt", b"", "is empty"),
    "receipt binary": ("receipt", b"\x00\x01", "binary"),
    "receipt not JSON": ("receipt", b"{nope", "not JSON"),
    "receipt not a receipt": ("receipt", b'{"a": 1}', "not a docket receipt"),
    "receipt other format": ("receipt", b'{"format": "docket-receipt-2"}', "docket-receipt-2"),
    "ledger missing": ("ledger", None, "no such file"),
    "ledger empty": ("ledger", b"", "empty_ledger"),
    "ledger not a ledger": ("ledger", b"hello\n", "not a docket ledger"),
    "ledger first line broken": ("ledger", b'{"v":1,"seq":0,\n', "not a docket ledger (line 1"),
    "ledger deep junk": ("ledger", b'{"v":' + b"[" * 100_000 + b"\n", "nested more than 64"),
}


@pytest.mark.parametrize("case", sorted(INPUT_CASES))
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    which, data, words = INPUT_CASES[case]
    receipt_path = write_run(tmp_path)
    target = receipt_path if which == "receipt" else tmp_path / "ledger.jsonl"
    before = (tmp_path / "ledger.jsonl").read_bytes() if which == "receipt" else None
    if data is None:
        target.unlink()
    else:
        target.write_bytes(data)
    assert main(["verify", str(receipt_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("docket: ")
    assert words in captured.err and "Traceback" not in captured.err
    if before is not None:  # bad input never touches a ledger
        assert (tmp_path / "ledger.jsonl").read_bytes() == before


def test_a_directory_is_the_run_but_not_a_ledger(tmp_path, capsys):
    """`docket verify FOLDER` is the run in it (docket/reading/run_paths.py); a folder
    given as --ledger is refused, as before."""
    receipt_path = write_run(tmp_path)
    assert main(["verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    assert main(["verify", str(receipt_path), "--ledger", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("is a directory") == 1


@pytest.mark.parametrize(
    ("head", "tail", "code"),
    [
        (b"x", b"\n", "not_a_ledger"),  # no magic: refused before reading on
        (b'{"v":', b"", "torn_tail"),  # a ledger's first write, torn
        (b'{"v":', b"\n", "not_a_ledger"),  # a first line that is not JSON
    ],
)
def test_a_50_mb_line_of_junk_is_refused_fast(tmp_path, head, tail, code):
    receipt_path = write_run(tmp_path)
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(head + b"j" * (50 * 1024 * 1024) + tail)
    started = time.monotonic()
    try:
        got = verify(receipt_path, junk).code
    except VerifyInputError as exc:
        got = exc.code
    finally:
        junk.unlink()  # 50 MB need not outlive the test
    assert got == code
    assert time.monotonic() - started < 10


# ---------------------------------------------------------------- strict JSON, both parsers


def nested(depth: int) -> object:
    value: object = []
    for _ in range(depth - 1):
        value = [value]
    return value


STRICT = [
    (b'{"a":1}', {"a": 1}),
    (b' {"a":1}\r', {"a": 1}),  # JSON whitespace around the value
    (b'{"a":1.50,"b":-0,"c":1e300}', {"a": Decimal("1.50"), "b": 0, "c": Decimal("1e300")}),
    (b'{"a":123456789012345678901234567890}', {"a": 123456789012345678901234567890}),
    (b'{"a":"\\ud83d\\ude00","\\u00e9":"\xc3\xa9"}', {"a": "\U0001f600", "\u00e9": "\u00e9"}),
    (b'{"a":' + b"[" * 63 + b"]" * 63 + b"}", {"a": nested(63)}),  # 64 levels: the most
]
REFUSED = [
    (b"", False),
    (b'{"a":1', False),
    (b'{"a":1} {"b":2}', False),
    (b'{"a":NaN}', False),
    (b'{"a":Infinity}', False),
    (b'{"a":"\xff"}', False),
    (b'{"a":"\xed\xa0\x80"}', False),  # a surrogate encoded as UTF-8
    (b'\xef\xbb\xbf{"a":1}', False),  # a byte-order mark
    (b'{"a":01}', False),
    (b'{"a":1,"a":2}', True),
    (b'{"a":{"b":1,"b":1}}', True),
    (b'{"\\u0061":1,"a":2}', True),  # the same key once unescaped
    (b'{"a":"\\ud800"}', False),  # a lone surrogate is not Unicode text
    (b'{"a":"\\udc00x"}', False),
    (b'{"a":' + b"[" * 64 + b"]" * 64 + b"}", True),  # 65 levels
    (b"[" * 5000 + b"]" * 5000, True),
]


@pytest.fixture
def parser(json_parser):
    """decode_json with each of its parsers: jiter when installed, else the standard library's."""
    return decode_json


@pytest.mark.parametrize(("data", "value"), STRICT)
def test_strict_json_reads(parser, data, value):
    got = parser(data)
    assert got == value
    assert json.dumps(got, default=repr) == json.dumps(value, default=repr)  # and same types


@pytest.mark.parametrize(("data", "ambiguous"), REFUSED)
def test_strict_json_refuses(parser, data, ambiguous):
    with pytest.raises(ValueError) as caught:
        parser(data)
    assert isinstance(caught.value, AmbiguousJSON) == ambiguous
