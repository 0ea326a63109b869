"""Checks of the evidence: a write that fails (disclosed, or the run stopped), a
clock that steps back, a torn tail, a tampered byte, a receipt from a real run,
and the committed vectors every verifier must agree on."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from docket import __version__
from docket.clock import FakeClock
from docket.ledger.doctor import classify
from docket.ledger.faults import FailOrdinals
from docket.pricing import default_price_table
from docket.receipts.receipt import build_receipt, write_receipt
from docket.receipts.tally import Tally
from docket.receipts.verify import VerifyInputError, verify
from docket.selftest.rig import boundary_rig, of_type, read_ledger
from docket.selftest.runner import Registry, expect
from docket.selftest.vector_files import manifest, vectors_folder

evidence = Registry("evidence")


@evidence.check(
    "write-fault", "a failed ledger write is disclosed: evidence.gap, ledger incomplete"
)
async def write_fault(folder: Path) -> str:
    fault = FailOrdinals(errno.ENOSPC, 2, 3)  # the second call's model.request
    async with boundary_rig(folder, upstream=None, faults=fault) as rig:
        statuses = [(await rig.call()).status_code for _ in range(3)]
        stats, stops = rig.ledger.stats.as_dict(), list(rig.stops)
    expect(fault.injected == 1, "the fault was never asked about")
    expect(statuses == [200, 200, 200], f"statuses {statuses} (the run goes on by default)")
    expect(stops == [], "a stop was asked without fail_fast_evidence")
    gaps = of_type(read_ledger(rig.ledger_path), "evidence.gap")
    expect(len(gaps) == 1 and gaps[0].get("lost") == 1, f"evidence.gap events {gaps}")
    expect(stats["ledger_complete"] is False, "the stats claim a complete ledger")
    expect(stats["unwritten_by_type"] == {"model.request": 1}, f"stats {stats}")
    return "ENOSPC on one model.request: evidence.gap lost=1, ledger_complete false"


@evidence.check(
    "evidence-guard", "fail_fast_evidence: an unrecorded call is never forwarded; exit 43"
)
async def evidence_guard(folder: Path) -> str:
    fault = FailOrdinals(errno.EIO, 2, 3)
    async with boundary_rig(folder, {"ledger": {"fail_fast_evidence": True}}, faults=fault) as rig:
        statuses = [(await rig.call()).status_code for _ in range(2)]
        forwarded, stops = len(rig.upstream.seen), list(rig.stops)
    expect(statuses == [200, 503], f"statuses {statuses}")
    expect(forwarded == 1, f"the upstream saw {forwarded} calls; the unrecorded one went out")
    expect(stops and all(s.exit_status == 43 for s in stops), f"stops {stops}")
    return "EIO on a model.request: call refused 503, never forwarded, stop asked: exit 43"


@evidence.check("clock-step", "a clock stepped back an hour mid-run: mono_ms never decreases")
async def clock_step(folder: Path) -> str:
    clock = FakeClock()
    async with boundary_rig(folder, clock=clock) as rig:
        await rig.call()
        clock.advance(2)
        await rig.call()
        before = rig.ledger.count
        clock.advance(-3600)  # an NTP step back, both clocks
        await rig.call()
        clock.advance(3601)  # the source comes back past where it was
        await rig.call()
    events = read_ledger(rig.ledger_path)
    mono = [e["mono_ms"] for e in events]
    expect(mono == sorted(mono), f"mono_ms went back: {mono}")
    stepped = mono[before:-2]
    expect(stepped and all(m == mono[before - 1] for m in stepped), f"not held at the step: {mono}")
    expect(mono[-1] - mono[0] == 3000, f"the clock's own advance is lost: {mono}")
    durations = [e["duration_ms"] for e in of_type(events, "model.response")]
    expect(all(d >= 0 for d in durations), f"a negative duration: {durations}")
    return f"mono_ms held at {mono[before - 1]} across a -3600 s step, then {mono[-1]}"


async def _real_run(folder: Path) -> tuple[Path, Path]:
    """Three calls through a boundary, framed by session events as `docket run` writes
    them, and the receipt built from the writer's tally."""
    tally = Tally()
    prices = default_price_table()
    async with boundary_rig(folder, observers=(tally.add,)) as rig:
        await rig.ledger.append(
            "session.start",
            run_id="selftest",
            docket_version=__version__,
            policy_digest="sha256:" + "0" * 64,
            pricing={"table_date": prices.date, "provenance": prices.provenance},
            caps={},
        )
        for _ in range(3):
            expect((await rig.call()).status_code == 200, "a call failed")
        ledger = rig.ledger
        await ledger.append(
            "session.end",
            reason="child exited",
            exit_status=0,
            cap=None,
            evidence=ledger.stats.as_dict(),
        )
        head, count, evidence_stats = ledger.head, ledger.count, ledger.stats.as_dict()
    receipt = build_receipt(
        tally,
        ledger_path=rig.ledger_path,
        head=head,
        count=count,
        size=rig.ledger_path.stat().st_size,
        evidence=evidence_stats,
        version=__version__,
    )
    receipt_path = folder / "receipt.json"
    write_receipt(receipt_path, receipt)
    return rig.ledger_path, receipt_path


@evidence.check("receipt", "a real run's receipt verifies against its ledger")
async def receipt(folder: Path) -> str:
    ledger, receipt_path = await _real_run(folder)
    verdict = verify(receipt_path, ledger)
    expect(verdict.ok, verdict.summary())
    expect(verdict.claims and verdict.claims["totals"]["model_calls"] == 3, "not 3 calls claimed")
    return f"ok: {verdict.events} events, 3 calls, head {str(verdict.head)[:12]}…"


@evidence.check("tamper", "one flipped byte in the ledger is caught by verify at its line")
async def tamper(folder: Path) -> str:
    ledger, receipt_path = await _real_run(folder)
    data = bytearray(ledger.read_bytes())
    lines = bytes(data).split(b"\n")
    n = next(i for i, line in enumerate(lines) if b'"type":"model.response"' in line)
    at = sum(len(x) + 1 for x in lines[:n]) + lines[n].index(b'"output_tokens":') + 16
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    tampered = folder / "tampered.jsonl"
    tampered.write_bytes(bytes(data))
    verdict = verify(receipt_path, tampered)
    expect(not verdict.ok, "a ledger with a flipped byte verified")
    expect(verdict.seq in (n, n + 1), f"the break was named at seq {verdict.seq}, not {n}/{n + 1}")
    return f"{verdict.code} at seq {verdict.seq} (byte {at} flipped, line {n})"


@evidence.check("torn-tail", "a ledger cut mid-line is classified torn_tail at the line's offset")
async def torn_tail(folder: Path) -> str:
    ledger, _ = await _real_run(folder)
    data = ledger.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    torn = folder / "torn.jsonl"
    torn.write_bytes(data[: len(data) - 40])  # as a kill mid-write leaves it
    diagnosis = classify(torn)
    expect(diagnosis.verdict == "torn_tail", f"doctor said {diagnosis.verdict}")
    tail = diagnosis.tail
    expect(tail is not None and tail.offset == last_start, f"tail at {tail}, line at {last_start}")
    clean = folder / "clean.jsonl"
    shutil.copyfile(ledger, clean)
    expect(classify(clean).verdict == "clean", "the intact copy was not clean")
    return f"torn_tail at byte {last_start}, {len(data) - 40 - last_start} bytes; intact copy clean"


@evidence.check("vectors", "every committed spec vector gives its manifest verdict")
async def vectors(folder: Path) -> str:
    root = vectors_folder()
    cases = manifest(root)
    wrong = []
    for case in cases:
        ledger = root / case["ledger"] if case["ledger"] else None
        got: tuple[object, ...]
        try:
            v = verify(root / case["receipt"], ledger)
            got = ("ok" if v.ok else "fail", v.code, v.seq, v.offset)
        except VerifyInputError as exc:
            got = ("input_error", exc.code, None, None)
        want: tuple[object, ...] = (case["verdict"], case["code"], case["seq"], case["offset"])
        if want[0] == "input_error":  # no line is named when verification cannot start
            got, want = got[:2], want[:2]
        if got != want:
            wrong.append(f"{case['name']}: {got} != {want}")
    expect(len(cases) >= 40, f"only {len(cases)} vectors found in {root}")
    expect(not wrong, "; ".join(wrong[:3]))
    return f"{len(cases)} vectors, each its verdict, code, seq and offset"
