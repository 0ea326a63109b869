"""`docket verify` fails a ledger that holds a model.request with
no closing event, unless the receipt discloses an incomplete ledger and names the
call (ops.open_calls: the run was killed, or the closing event never reached disk).

Ledgers and receipts are written as the recorder writes them (test_receipt's
write_run: encode_line, the real Tally, build_receipt, write_receipt).
"""

from __future__ import annotations

import json

from test_receipt import end, events_of, start, write_run

from docket.cli import main
from docket.receipts.receipt import encode_receipt
from docket.receipts.verify import verify

REQUEST = ("model.request", 10, {"call_id": "c1", "model": "gpt-4o-mini"})
ANSWERED = [
    ("model.request", 20, {"call_id": "c2", "model": "gpt-4o-mini"}),
    (
        "model.error",
        30,
        {"call_id": "c2", "model": "gpt-4o-mini", "reason": "timeout", "cost_nusd": 7},
    ),
]
LOST = {
    "ledger_complete": False,
    "unwritten_events": 2,
    "first_failing_seq": 4,
    "write_failures": 1,
}


def test_a_complete_ledger_with_a_request_never_closed_fails(tmp_path, capsys):
    """The reproduction: a model.request with no closing event, a receipt that says
    the ledger is complete. Before the fix `docket verify` said ok."""
    receipt_path = write_run(tmp_path, [start(), REQUEST, *ANSWERED, end(40)])
    verdict = verify(receipt_path)
    assert (verdict.ok, verdict.code, verdict.seq) == (False, "open_call", 1)
    assert verdict.field == "ops.open_calls"
    assert 'call "c1" (model.request at seq 1) has no closing event' in verdict.detail
    # The same with a receipt that says nothing of open calls (as one written before them).
    receipt = json.loads(receipt_path.read_text())
    receipt["ops"].pop("open_calls", None)
    receipt_path.write_bytes(encode_receipt(receipt))
    assert verify(receipt_path).code == "open_call"
    capsys.readouterr()
    assert main(["verify", str(receipt_path)]) == 1
    assert capsys.readouterr().out.startswith("FAIL open_call at seq 1: ops.open_calls: ")


def test_a_killed_run_discloses_the_call_open_at_the_kill(tmp_path):
    """No session.end (the run was killed), the evidence incomplete: the call open at
    the kill is named by the receipt, and verify accepts it as disclosed."""
    run = [start(), REQUEST, *ANSWERED]
    unwritten_end = events_of([*run, end(40)])[-1] | {"evidence": LOST}
    receipt_path = write_run(tmp_path, run, evidence=LOST, end_event=unwritten_end)
    receipt = json.loads(receipt_path.read_text())
    assert receipt["ops"]["open_calls"] == [{"call_id": "c1", "seq": 1}]
    verdict = verify(receipt_path)
    assert verdict.ok, verdict.summary()
    assert "ledger incomplete (disclosed)" in verdict.summary()

    # A receipt that hides the open call, or names another, is caught.
    for wrong, field in (
        ([], "ops.open_calls[0]"),
        ([{"call_id": "c2", "seq": 2}], "ops.open_calls[0].call_id"),
        ([{"call_id": "c1", "seq": 1}, {"call_id": "c9", "seq": 3}], "ops.open_calls[1]"),
    ):
        receipt["ops"]["open_calls"] = wrong
        receipt_path.write_bytes(encode_receipt(receipt))
        verdict = verify(receipt_path)
        assert (verdict.code, verdict.field) == ("open_call", field), verdict.summary()
    receipt["ops"].pop("open_calls")
    receipt_path.write_bytes(encode_receipt(receipt))
    assert verify(receipt_path).field == "ops.open_calls[0]"


def test_a_receipt_naming_open_calls_of_a_closed_ledger_fails(tmp_path):
    receipt_path = write_run(tmp_path, [start(), *ANSWERED, end(40)])
    receipt = json.loads(receipt_path.read_text())
    assert "open_calls" not in receipt["ops"]  # none open: the member is left out
    assert verify(receipt_path).ok
    receipt["ops"]["open_calls"] = [{"call_id": "c2", "seq": 1}]
    receipt_path.write_bytes(encode_receipt(receipt))
    verdict = verify(receipt_path)
    assert (verdict.code, verdict.field) == ("open_call", "ops.open_calls[0]"), verdict.summary()
    receipt["ops"]["open_calls"] = [{"call_id": "c2"}]  # the shape is checked too
    receipt_path.write_bytes(encode_receipt(receipt))
    assert verify(receipt_path).code == "receipt_malformed"
