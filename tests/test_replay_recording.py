"""docket.replay.recording: a recorded run is verified before a byte of it is served,
and refused (one line, exit 2) when it cannot be replayed as it was. Built on the spec's
own vectors (spec/vectors/ok-basic: a real receipt and ledger, recorded without bodies)
and on forgeries of it that verify (the chain has no key), so that only replay's own
checks can refuse them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from docket.errors import InputError
from docket.ledger.chain import GENESIS, encode_body, encode_line, line_hash
from docket.ledger.reader import Lines
from docket.receipts.receipt import build_receipt, encode_receipt
from docket.receipts.tally import Tally
from docket.receipts.verify import verify
from docket.replay.recording import load_recording

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
COMMON = ("v", "seq", "ts", "mono_ms", "type", "prev")


def rechained(folder: Path, target: Path, edit: Callable[[dict], object]) -> Path:
    """A copy of the run whose events were edited and re-chained, with a receipt built
    for them by the reference tally: a forgery that verifies."""
    target.mkdir()
    tally, prev, lines = Tally(), GENESIS, []
    for line in Lines(folder / "ledger.jsonl"):
        event = json.loads(line)
        edit(event)
        common = {k: event.pop(k) for k in COMMON}
        new = encode_line(
            seq=common["seq"],
            ts=common["ts"],
            mono_ms=common["mono_ms"],
            type=common["type"],
            prev=prev,
            body=encode_body(event),
        )
        lines.append(new)
        tally.add(json.loads(new))
        prev = line_hash(new)
    data = b"".join(line + b"\n" for line in lines)
    (target / "ledger.jsonl").write_bytes(data)
    original = json.loads((folder / "receipt.json").read_text())
    receipt = build_receipt(
        tally,
        ledger_path="ledger.jsonl",
        head=prev,
        count=len(lines),
        size=len(data),
        evidence=original["ops"]["evidence"],
        version=original["docket_version"],
    )
    (target / "receipt.json").write_bytes(encode_receipt(receipt))
    assert verify(target / "receipt.json").ok
    return target


def with_bodies(event: dict) -> None:
    """What record_bodies adds: each request's and answer's text."""
    if event["type"] == "model.request":
        event["request_body"] = json.dumps({"model": event["model"], "messages": []})
    if event["type"] in ("model.response", "model.error"):
        event["response_body"] = "{}"


def test_a_run_with_bodies_is_read_with_its_calls(tmp_path):
    run = rechained(VECTORS / "ok-basic", tmp_path / "run", with_bodies)
    recording = load_recording(str(run))
    receipt = json.loads((run / "receipt.json").read_text())
    assert recording.replay_of == {"run_id": receipt["run_id"], "head": receipt["ledger"]["head"]}
    assert [c.provider for c in recording.calls] == [
        "openai",
        "openai",
        "anthropic",
        "anthropic",
        "openai",
    ]
    assert [c.answer.status for c in recording.calls] == [200, 200, 529, 200, 200]


def test_a_run_recorded_without_bodies_is_refused():
    with pytest.raises(InputError, match=r"recorded without bodies \(seq 2: set record_bodies"):
        load_recording(str(VECTORS / "ok-basic"))


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda e: (
                with_bodies(e)
                or e.get("seq") == 4
                and e.update(request_body_not_recorded="not_utf8")
            ),
            r"the request body at seq 4 was not recorded \(not_utf8\)",
        ),
        (
            lambda e: (
                with_bodies(e)
                or e.get("seq") == 3
                and (e.pop("response_body"), e.update(response_body_not_recorded="too_deep"))
            ),
            r"the response body at seq 3 was not recorded \(too_deep\)",
        ),
        (
            lambda e: (
                with_bodies(e) or e.get("seq") == 3 and e.update(response_body_truncated=True)
            ),
            r"the response body at seq 3 was recorded cut",
        ),
    ],
)
def test_a_body_not_recorded_is_refused_naming_its_seq(tmp_path, edit, said):
    forged = rechained(VECTORS / "ok-basic", tmp_path / "forged", edit)
    with pytest.raises(InputError, match=said):
        load_recording(str(forged))


def test_a_swapped_ledger_is_refused(tmp_path):
    """Another ledger under the run's receipt (an agent of the same user can write the
    folder): the chain says so, and nothing is served."""
    run = rechained(VECTORS / "ok-basic", tmp_path / "run", with_bodies)
    other = rechained(
        VECTORS / "ok-basic",
        tmp_path / "other",
        lambda e: (
            with_bodies(e)
            or e.get("type") == "model.response"
            and e.update(response_body='{"planted": true}')
        ),
    )
    shutil.copy(other / "ledger.jsonl", run / "ledger.jsonl")
    with pytest.raises(InputError, match=r"does not verify: FAIL head_mismatch at seq 15"):
        load_recording(str(run))


def test_a_receipt_naming_a_ledger_outside_the_folder_is_refused(tmp_path):
    run = rechained(VECTORS / "ok-basic", tmp_path / "run", with_bodies)
    receipt = json.loads((run / "receipt.json").read_text())
    receipt["ledger"]["file"] = "../elsewhere/ledger.jsonl"
    (run / "receipt.json").write_text(json.dumps(receipt))
    with pytest.raises(InputError, match="no ledger it names"):
        load_recording(str(run))


def test_a_huge_ledger_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from docket.replay import recording

    run = rechained(VECTORS / "ok-basic", tmp_path / "run", with_bodies)
    monkeypatch.setattr(recording, "MAX_RECORDING_BYTES", 1000)
    with pytest.raises(InputError, match=r"bytes, over the 1000 a run writes"):
        load_recording(str(run))
