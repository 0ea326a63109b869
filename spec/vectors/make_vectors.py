"""Generate the docket-receipt-1 test vectors: `python spec/vectors/make_vectors.py [OUTDIR]`.

Each vector is a folder holding a ledger (ledger.jsonl) and a receipt
(receipt.json), and an entry in manifest.json with the verdict, failure code,
seq and byte offset that verification must report. The expectations are
declared here, from how each vector is made (which line was edited, where it
starts), never by running a verifier. Honest runs are encoded with
docket.ledger.chain.encode_line and their receipts built with docket.receipts.tally and
docket.receipts.receipt, as the recorder does; tampered ones are edited afterwards, as
bytes or as events re-chained by a forger. Output is deterministic: the
committed files must equal a fresh run (tests/test_vectors.py checks).
"""

from __future__ import annotations

import copy
import json
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from docket.clock import rfc3339
from docket.ledger.chain import GENESIS, encode_body, encode_line, line_hash
from docket.receipts.receipt import build_receipt, encode_receipt
from docket.receipts.tally import OPTIONAL_CLAIMS, Tally

HERE = Path(__file__).resolve().parent
VERSION = "0.1.0"  # pinned: vectors must not change when the package version does
WALL0 = 1_795_000_000.0  # 2026-11-18T11:06:40Z, the first wall-clock reading of each run
POLICY = "sha256:5f0c6e2b9d8a7c4e3f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e"
PRICES = {
    "gpt-4o": {"input": "2.50", "output": "10.00", "cached_input": "1.25"},
    "gpt-4o-mini": {"input": "0.15", "output": "0.60", "cached_input": "0.075"},
    "claude-sonnet-4": {"input": "3.00", "output": "15.00", "cached_input": "0.30"},
}
COMPLETE = {
    "ledger_complete": True,
    "unwritten_events": 0,
    "first_failing_seq": None,
    "write_failures": 0,
}


def cost_nusd(prices: dict, tokens_in: int, tokens_out: int, cached: int) -> int:
    """Nano-USD for one call: a price per million tokens is price*1000 nano-USD per token."""

    def per_token(text: str) -> int:
        whole, _, frac = text.partition(".")
        return int(whole) * 1000 + int((frac + "000")[:3])

    fresh = tokens_in - cached
    return (
        fresh * per_token(prices["input"])
        + cached * per_token(prices["cached_input"])
        + tokens_out * per_token(prices["output"])
    )


@dataclass
class Entry:
    """One line to be: its common fields, its own fields, and an optional byte edit."""

    type: str
    mono_ms: int
    fields: dict
    seq: int | None = None  # None: its position
    edit: Callable[[bytes], bytes] | None = None  # applied before the next line hashes it


@dataclass
class Ledger:
    lines: list[bytes]  # without newlines
    events: list[dict]  # as the recorder's tally saw them (honest runs only)
    data: bytes = b""
    offsets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data = b"".join(line + b"\n" for line in self.lines)
        at = 0
        for line in self.lines:
            self.offsets.append(at)
            at += len(line) + 1

    @property
    def head(self) -> str:
        return line_hash(self.lines[-1])


def chain(entries: list[Entry]) -> Ledger:
    """Encode entries as the recorder would, each line's prev the hash of the line before."""
    prev, lines, events = GENESIS, [], []
    for position, e in enumerate(entries):
        seq = position if e.seq is None else e.seq
        ts = rfc3339(WALL0 + e.mono_ms / 1000)
        line = encode_line(
            seq=seq, ts=ts, mono_ms=e.mono_ms, type=e.type, prev=prev, body=encode_body(e.fields)
        )
        if e.edit is not None:
            line = e.edit(line)
        lines.append(line)
        events.append(
            {"v": 1, "seq": seq, "ts": ts, "mono_ms": e.mono_ms, "type": e.type} | e.fields
        )
        prev = line_hash(line)
    return Ledger(lines, events)


def start(run_id: str = "run-2026-11-18-0001", *, caps: dict | None = None, chaos=None) -> Entry:
    fields = {
        "run_id": run_id,
        "docket_version": VERSION,
        "policy_digest": POLICY,
        "pricing": {"table_date": "2026-11-01", "provenance": "docket/data/prices.json 2026-11-01"},
        "caps": caps if caps is not None else {"usd": "2.00", "calls": 50},
    }
    if chaos is not None:
        fields["chaos"] = chaos
    return Entry("session.start", 0, fields)


def end(mono_ms: int, *, reason="child exited", status=0, cap=None, evidence=None) -> Entry:
    return Entry(
        "session.end",
        mono_ms,
        {
            "reason": reason,
            "exit_status": status,
            "cap": cap,
            "evidence": evidence or COMPLETE,
        },
    )


def call(mono_ms: int, call_id: str, model: str, tokens_in: int, tokens_out: int, cached: int = 0):
    """A forwarded call that succeeded: a model.request and its model.response."""
    provider = "anthropic" if model.startswith("claude") else "openai"
    prices = PRICES.get(model)
    response = {
        "call_id": call_id,
        "provider": provider,
        "model": model,
        "status": 200,
        "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out, "cached_tokens": cached},
        "cost_nusd": cost_nusd(prices, tokens_in, tokens_out, cached) if prices else 0,
        "priced": prices is not None,
        "duration_ms": 900 + tokens_out,
        "ttfb_ms": 210,
        "bytes": 600 + 4 * tokens_out,
    }
    if prices:
        response["unit_prices"] = prices
    return [
        Entry(
            "model.request",
            mono_ms,
            {
                "call_id": call_id,
                "provider": provider,
                "model": model,
                "endpoint": "/v1/messages" if provider == "anthropic" else "/v1/chat/completions",
                "stream": False,
                "request_bytes": 1200 + tokens_in,
                "request_sha256": line_hash(call_id.encode()),
                "max_output_tokens": 1024,
            },
        ),
        Entry("model.response", mono_ms + 900 + tokens_out, response),
    ]


def failed_call(mono_ms: int, call_id: str, model: str, status: int, charged: int):
    provider = "anthropic" if model.startswith("claude") else "openai"
    return [
        Entry(
            "model.request",
            mono_ms,
            {
                "call_id": call_id,
                "provider": provider,
                "model": model,
                "endpoint": "/v1/chat/completions",
                "stream": True,
                "request_bytes": 1830,
                "request_sha256": line_hash(call_id.encode()),
                "max_output_tokens": 512,
            },
        ),
        Entry(
            "model.error",
            mono_ms + 40,
            {
                "call_id": call_id,
                "provider": provider,
                "model": model,
                "reason": f"upstream answered {status}",
                "status": status,
                "usage": {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0},
                "cost_nusd": charged,
                "bytes": 187,
                "duration_ms": 40,
            },
        ),
    ]


# ---------------------------------------------------------------- the honest runs


def basic_run() -> list[Entry]:
    return [
        start(),
        Entry(
            "process.spawn", 3, {"pid": 31337, "argv": ["python", "agent.py", "--task", "triage"]}
        ),
        *call(120, "call-0001", "gpt-4o", 1812, 240, cached=1024),
        *call(1400, "call-0002", "gpt-4o-mini", 950, 88),
        Entry("policy.denied", 2600, {"rule": "egress", "provider": "openai", "model": "gpt-4o"}),
        *failed_call(2700, "call-0003", "claude-sonnet-4", 529, 0),
        *call(3100, "call-0004", "claude-sonnet-4", 2400, 610, cached=1800),
        Entry(
            "cap.warning",
            4800,
            {"cap": "calls", "limit": 50, "observed": 40, "threshold": "80%"},
        ),
        *call(4900, "call-0005", "gpt-4o", 3020, 412),
        Entry("process.exit", 6300, {"pid": 31337, "status": 0, "reason": "exited"}),
        end(6302),
    ]


def cap_kill_run() -> list[Entry]:
    return [
        start("run-2026-11-18-0002", caps={"usd": "0.01", "calls": 50}),
        Entry("process.spawn", 2, {"pid": 4100, "argv": ["node", "agent.js"]}),
        *call(100, "call-0001", "gpt-4o", 1500, 300),
        Entry("cap.warning", 1401, {"cap": "usd", "limit": "0.01", "observed": "0.006750000"}),
        *call(1500, "call-0002", "gpt-4o", 1500, 300),
        Entry("cap.exceeded", 2801, {"cap": "usd", "limit": "0.01", "observed": "0.013500000"}),
        Entry("cap.exceeded", 2900, {"cap": "usd", "limit": "0.01", "observed": "0.013500000"}),
        Entry("signal.forwarded", 2901, {"pid": 4100, "signal": "SIGTERM"}),
        Entry("process.exit", 3050, {"pid": 4100, "status": -15, "reason": "signal SIGTERM"}),
        end(3051, reason="cap exceeded: usd", status=42, cap="usd"),
    ]


GAP_EVIDENCE = {
    "ledger_complete": False,
    "unwritten_events": 2,
    "first_failing_seq": 7,
    "write_failures": 2,
}


def chaos_run() -> list[Entry]:
    seed = 20261118
    fault = "upstream:status(503, retry_after=2s)@call 2"
    return [
        start(
            "run-2026-11-18-0003",
            chaos={"seed": seed, "faults": [fault, "ledger:enospc@seq 7..8"]},
        ),
        Entry("process.spawn", 2, {"pid": 5150, "argv": ["python", "agent.py"]}),
        *call(50, "call-0001", "gpt-4o-mini", 700, 90),
        Entry("fault.injected", 1100, {"fault": fault, "seed": seed, "ordinal": 2}),
        *failed_call(1101, "call-0002", "gpt-4o-mini", 503, 0),
        # seq 7 and 8 (a model.request and model.response) failed to write: ENOSPC
        Entry(
            "evidence.gap",
            3500,
            {
                "lost": 2,
                "first_failing_seq": 7,
                "by_type": {"model.request": 1, "model.response": 1},
                "error": "OSError: [Errno 28] No space left on device (injected)",
            },
        ),
        *call(3600, "call-0004", "gpt-4o-mini", 720, 95),
        Entry("process.exit", 4800, {"pid": 5150, "status": 0, "reason": "exited"}),
        end(4801, evidence=GAP_EVIDENCE),
    ]


UNWRITTEN_END = {
    "ledger_complete": False,
    "unwritten_events": 1,
    "first_failing_seq": 7,
    "write_failures": 1,
}


def no_end_run() -> tuple[list[Entry], dict]:
    """A run whose session.end could not be written: the receipt discloses it."""
    entries = [
        start("run-2026-11-18-0004"),
        Entry("process.spawn", 2, {"pid": 6001, "argv": ["./agent"]}),
        *call(60, "call-0001", "gpt-4o", 400, 50),
        *call(1100, "call-0002", "gpt-4o", 410, 55),
        Entry("process.exit", 2300, {"pid": 6001, "status": 1, "reason": "exited"}),
    ]
    unwritten = {
        "v": 1,
        "seq": len(entries),
        "ts": rfc3339(WALL0 + 2.301),
        "mono_ms": 2301,
        "type": "session.end",
        "reason": "child exited",
        "exit_status": 1,
        "cap": None,
        "evidence": UNWRITTEN_END,
    }
    return entries, unwritten


def killed_run() -> tuple[list[Entry], dict, dict]:
    """A run stopped with a call in flight: its closing event and session.end never
    reached the disk (section 7.5). The ledger, the unwritten session.end, the evidence."""
    entries = [
        start("run-2026-11-18-0006"),
        Entry("process.spawn", 2, {"pid": 6101, "argv": ["./agent"]}),
        *call(60, "call-0001", "gpt-4o-mini", 300, 40),
        failed_call(1200, "call-0002", "gpt-4o", 0, 0)[0],  # its model.request only
    ]
    evidence = {
        "ledger_complete": False,
        "unwritten_events": 2,
        "first_failing_seq": len(entries),
        "write_failures": 2,
    }
    unwritten = {
        "v": 1,
        "seq": len(entries) + 1,
        "ts": rfc3339(WALL0 + 2.0),
        "mono_ms": 2000,
        "type": "session.end",
        "reason": "child exited",
        "exit_status": 0,
        "cap": None,
        "evidence": evidence,
    }
    return entries, unwritten, evidence


def minimal_run() -> list[Entry]:
    return [start("run-2026-11-18-0005", caps={}), end(17, reason="child exited", status=0)]


def unicode_run() -> list[Entry]:
    return [
        start("run-é-ü-中文-🚀", caps={"usd": 1.5, "tokens": 100000, "per_model": {"x": [1, 2.5]}}),
        # 64 levels deep in all, the most a line may nest
        Entry(
            "process.spawn",
            1,
            {"pid": 7, "argv": ["agent", "--prompt", "naïve café ☕"], "nested": nested(63)},
        ),
        *call(10, "call-0001", "local/llama-3.1-8b-ü", 300, 40),  # not in the price table
        Entry(
            "policy.denied", 1000, {"rule": "unknown model", "provider": "openai", "model": None}
        ),
        *call(1100, "call-0002", "gpt-4o-mini", 120, 30),
        end(2100, reason="child exited: 完成"),
    ]


def marked(entries: list[Entry], attempt: object) -> list[Entry]:
    """A call's entries with the client's attempt marker on its model.request."""
    request, *rest = entries
    return [
        Entry(request.type, request.mono_ms, request.fields | {"client_attempt": attempt}),
        *rest,
    ]


def client_retry_run() -> list[Entry]:
    """Two logical calls by an SDK that retries a 503 twice (attempts 0, 1, 2 each),
    then one call with no marker (a client that sends none)."""
    entries = [start()]
    mono = 100
    for logical in range(2):
        for attempt in range(3):
            call_id = f"call-{logical * 3 + attempt + 1:04d}"
            if attempt < 2:
                one = failed_call(mono, call_id, "gpt-4o-mini", 503, 0)
            else:
                one = call(mono, call_id, "gpt-4o-mini", 200, 40)
            entries += marked(one, attempt)
            mono += 1000
    entries += call(mono, "call-0007", "gpt-4o", 300, 20)
    entries.append(end(mono + 2000))
    return entries


def cached(entries: list[Entry], request: dict, close: dict) -> list[Entry]:
    """A call's entries with the cache's members on its model.request and closing event."""
    first, second = entries
    return [
        Entry(first.type, first.mono_ms, first.fields | request),
        Entry(second.type, second.mono_ms, second.fields | close),
    ]


def cache_hit(
    mono_ms: int, replays: Entry, replays_seq: int, hits: int, saved: object, **more: object
) -> Entry:
    return Entry(
        "cache.hit",
        mono_ms,
        {
            **more,
            "provider": replays.fields["provider"],
            "model": replays.fields["model"],
            "endpoint": "chat.completions",
            "stream": False,
            "request_sha256": line_hash(replays.fields["call_id"].encode()),
            "replays_seq": replays_seq,
            "age_ms": mono_ms - replays.mono_ms,
            "hits": hits,
            "saved_nusd": saved,
        },
    )


# The SHA-256 of a stored answer's bytes (issue 23): on the closing event that stored it
# (cache_body_sha256) and on each cache.hit that serves it (body_sha256).
ANSWER_SHA256 = line_hash(b"the stored answer")


def cache_run(
    saved: object = None, served: object = None, refused_digest: object = None
) -> list[Entry]:
    """A run with the response cache on: a greedy call stored and replayed twice, a
    sampled call not stored (temperature), and a failed call not stored (not_2xx).
    With `served`: the answer's digests on the record, the first hit's body_sha256 being
    `served`; with `refused_digest`: a cache_body_sha256 on the call not stored."""
    entries = [start()]
    digest = {} if served is None else {"cache_body_sha256": ANSWER_SHA256}
    stored = cached(
        call(100, "call-0001", "gpt-4o-mini", 200, 40),
        {"cache": "miss"},
        {"cache_stored": True, **digest},
    )
    entries += stored
    response = stored[1]
    cost = response.fields["cost_nusd"]
    first = {} if served is None else {"body_sha256": served}
    later = {} if served is None else {"body_sha256": ANSWER_SHA256}
    entries.append(cache_hit(1500, response, 2, 1, cost if saved is None else saved, **first))
    entries.append(cache_hit(1600, response, 2, 2, cost, **later))
    not_stored = {"cache_refused": "temperature"}
    if refused_digest is not None:
        not_stored["cache_body_sha256"] = refused_digest
    entries += cached(call(2000, "call-0002", "gpt-4o-mini", 210, 30), {}, not_stored)
    entries += cached(
        failed_call(3000, "call-0003", "gpt-4o-mini", 500, 0),
        {"cache": "miss"},
        {"cache_refused": "not_2xx"},
    )
    entries.append(end(5000))
    return entries


def shared_cache_run(replays_run: object) -> list[Entry]:
    """A run served twice from a store shared between runs: the answer replayed is in
    another run's ledger (`replays_run`), at a seq this ledger does not reach."""
    elsewhere = call(100, "call-0001", "gpt-4o-mini", 200, 40)[1]  # in the other run's ledger
    cost = elsewhere.fields["cost_nusd"]
    entries = [start()]
    for n, mono in enumerate((1500, 1600), 1):
        entries.append(cache_hit(mono, elsewhere, 41, n, cost, replays_run=replays_run))
    entries.append(end(5000))
    return entries


# ---------------------------------------------------------------- receipts


def receipt_for(
    led: Ledger,
    evidence: dict,
    *,
    end_event: dict | None = None,
    ledger_file="ledger.jsonl",
    section_6_5: bool = False,
) -> dict:
    """The receipt Docket writes for the run. Without `section_6_5`, as Docket wrote it
    before refusals by rule, endpoints, breaker transitions and fault layers (section 6.5):
    the vectors made before them stay the receipts they were, and must still verify."""
    tally = Tally()
    for event in led.events:
        tally.add(event)
    receipt = build_receipt(
        tally,
        ledger_path=ledger_file,
        head=led.head,
        count=len(led.lines),
        size=len(led.data),
        evidence=evidence,
        version=VERSION,
        end=end_event,
    )
    if not section_6_5:
        for parent, member in OPTIONAL_CLAIMS:
            receipt[parent].pop(member, None)
    return receipt


def _copy_at(receipt: dict, path: str) -> tuple[dict, dict, str]:
    """A copy of the receipt, the object in it holding the member at a dotted path, and
    the member's name."""
    out = copy.deepcopy(receipt)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    return out, node, last


def edited(receipt: dict, path: str, value: object) -> dict:
    """A copy of the receipt with the field at a dotted path set to value."""
    out, node, last = _copy_at(receipt, path)
    node[last] = value
    return out


def without(receipt: dict, path: str) -> dict:
    """A copy of the receipt with the member at a dotted path removed: a claim not made."""
    out, node, last = _copy_at(receipt, path)
    del node[last]
    return out


def repointed(receipt: dict, led: Ledger) -> dict:
    """A copy of the receipt whose ledger.head and ledger.bytes name a re-chained ledger:
    a forger's pair, so that what fails is the forged event, not the chain's seal."""
    return edited(edited(receipt, "ledger.head", led.head), "ledger.bytes", len(led.data))


def with_fields(entries: list[Entry], at: int, changes: dict) -> list[Entry]:
    """A copy of the entries with the fields of the one at `at` changed (None: removed)."""
    out = copy.deepcopy(entries)
    for key, value in changes.items():
        if value is None:
            del out[at].fields[key]
        else:
            out[at].fields[key] = value
    return out


def nested(depth: int) -> object:
    """Arrays nested `depth` levels deep around a string."""
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


def flip_prev_digit(line: bytes) -> bytes:
    at = line.index(b'"prev":"') + len(b'"prev":"')
    digit = b"1" if line[at : at + 1] == b"0" else b"0"
    return line[:at] + digit + line[at + 1 :]


def replace_once(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    def edit(line: bytes) -> bytes:
        if old not in line:
            raise ValueError(f"{old!r} is not in the line")
        return line.replace(old, new, 1)

    return edit


# ---------------------------------------------------------------- the vectors


class Vectors:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.manifest: list[dict] = []

    def add(
        self,
        name: str,
        description: str,
        *,
        ledger: bytes | None,
        receipt: dict | bytes | None,
        verdict: str,
        code: str | None = None,
        seq: int | None = None,
        offset: int | None = None,
        field: str | None = None,
        receipt_path: str | None = None,
        ledger_arg: str | None = None,
        ledger_name: str = "ledger.jsonl",
        figures: Ledger | None = None,
        unbacked: list[str] | None = None,
        tail_bytes: int = 0,
    ) -> None:
        folder = self.out / name
        folder.mkdir(parents=True, exist_ok=True)
        if ledger is not None:
            (folder / ledger_name).write_bytes(ledger)
        if receipt is not None:
            data = receipt if isinstance(receipt, bytes) else encode_receipt(receipt)
            (folder / "receipt.json").write_bytes(data)
        entry = {
            "name": name,
            "description": description,
            "receipt": receipt_path or f"{name}/receipt.json",
            "ledger": ledger_arg,
            "verdict": verdict,
            "exit": {"ok": 0, "fail": 1, "input_error": 2}[verdict],
            "code": code,
            "seq": seq,
            "offset": offset,
            "field": field,
        }
        if figures is not None:
            entry |= {
                "events": len(figures.lines),
                "head": figures.head,
                "bytes": len(figures.data),
                "unbacked": unbacked or [],
            }
            if tail_bytes:  # only where bytes are left unread: the older entries stay as they were
                entry["tail_bytes"] = tail_bytes
        self.manifest.append(entry)

    def ok(self, name: str, description: str, led: Ledger, receipt: dict, **kw) -> None:
        self.add(
            name, description, ledger=led.data, receipt=receipt, verdict="ok", figures=led, **kw
        )

    def fail(self, name: str, description: str, ledger: bytes, receipt, code: str, **kw) -> None:
        self.add(name, description, ledger=ledger, receipt=receipt, verdict="fail", code=code, **kw)

    def rechained(
        self,
        name: str,
        description: str,
        led: Ledger,
        receipt: dict,
        seq: int,
        code: str = "malformed_event",
    ) -> None:
        """A forged line at `seq`, the chain re-computed over it and the receipt re-pointed
        at the new head: verify must name the line, not the seal."""
        self.fail(
            name,
            description,
            led.data,
            repointed(receipt, led),
            code,
            seq=seq,
            offset=led.offsets[seq],
        )

    def input_error(self, name: str, description: str, code: str, **kw) -> None:
        self.add(
            name,
            description,
            verdict="input_error",
            code=code,
            **({"ledger": None, "receipt": None} | kw),
        )

    def write_manifest(self) -> None:
        doc = {
            "format": "docket-receipt-1 test vectors",
            "spec": "spec/docket-receipt-1.md",
            "paths": "relative to the folder holding this manifest",
            "vectors": self.manifest,
        }
        text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        (self.out / "manifest.json").write_text(text, encoding="utf-8")


def make(out: Path) -> None:
    v = Vectors(out)

    # -- valid pairs: verify must answer ok (exit 0)
    basic = chain(basic_run())
    basic_receipt = receipt_for(basic, COMPLETE)
    v.ok(
        "ok-basic",
        "a complete run: three models, an error, a refusal, a cap warning",
        basic,
        basic_receipt,
    )

    capped = chain(cap_kill_run())
    capped_receipt = receipt_for(capped, COMPLETE)
    v.ok("ok-cap-kill", "a run stopped by the usd cap (exit 42)", capped, capped_receipt)

    chaos = chain(chaos_run())
    chaos_receipt = receipt_for(chaos, GAP_EVIDENCE)
    v.ok(
        "ok-chaos-gap",
        "faults injected with a seed; two events lost to ENOSPC, disclosed by an evidence.gap",
        chaos,
        chaos_receipt,
    )

    entries, unwritten_end = no_end_run()
    no_end = chain(entries)
    no_end_receipt = receipt_for(no_end, UNWRITTEN_END, end_event=unwritten_end)
    v.ok(
        "ok-no-session-end",
        "session.end could not be written; the receipt says so; its exit claims stand unbacked",
        no_end,
        no_end_receipt,
        unbacked=["ended_at", "duration_ms", "exit"],
    )

    minimal = chain(minimal_run())
    v.ok(
        "ok-minimal", "session.start and session.end only", minimal, receipt_for(minimal, COMPLETE)
    )

    uni = chain(unicode_run())
    v.ok(
        "ok-unicode-unpriced",
        "non-ASCII text hashed as UTF-8 bytes, an unpriced model, a refusal with no model, float caps",
        uni,
        receipt_for(uni, COMPLETE),
    )

    v.add(
        "ok-explicit-ledger",
        "the ledger is not where the receipt says; --ledger names it",
        ledger=basic.data,
        receipt=basic_receipt,
        ledger_name="renamed.jsonl",
        ledger_arg="ok-explicit-ledger/renamed.jsonl",
        verdict="ok",
        figures=basic,
    )

    # -- a tampered ledger, the receipt as the recorder wrote it (exit 1)
    def ledger_only(name: str, description: str, ledger: bytes, code: str, **kw) -> None:
        """A tampered ledger checked against ok-basic's receipt, named with --ledger."""
        v.add(
            name,
            description,
            ledger=ledger,
            receipt=None,
            receipt_path="ok-basic/receipt.json",
            ledger_arg=f"{name}/ledger.jsonl",
            verdict="fail",
            code=code,
            **kw,
        )

    lines, offs = basic.lines, basic.offsets
    n = len(lines)

    def joined(new_lines: list[bytes]) -> bytes:
        return b"".join(line + b"\n" for line in new_lines)

    def with_line(i: int, line: bytes) -> bytes:
        return joined(lines[:i] + [line] + lines[i + 1 :])

    r = lines[3]  # the first model.response
    ledger_only(
        "edited-field",
        "output_tokens edited in the line at seq 3: the next line's prev no longer matches",
        with_line(3, r.replace(b'"output_tokens":240', b'"output_tokens":24', 1)),
        "chain_break",
        seq=4,
        offset=offs[4] - 1,  # the edited line is one byte shorter
    )
    ledger_only(
        "edited-last-line",
        "the session.end reason edited: no line follows, so the head differs",
        with_line(n - 1, lines[-1].replace(b"child exited", b"child exiteD", 1)),
        "head_mismatch",
        seq=n - 1,
        offset=offs[n - 1],
        field="ledger.head",
    )
    ledger_only(
        "deleted-line",
        "the line at seq 6 (a policy.denied) deleted",
        joined(lines[:6] + lines[7:]),
        "seq_gap",
        seq=6,
        offset=offs[6],
    )
    ledger_only(
        "deleted-last-line",
        "the last line deleted: the chain holds but is one event short",
        joined(lines[:-1]),
        "count_mismatch",
        seq=n - 1,
        offset=offs[n - 1],
        field="ledger.events",
    )
    ledger_only(
        "reordered-lines",
        "the lines at seq 4 and 5 swapped",
        joined(lines[:4] + [lines[5], lines[4]] + lines[6:]),
        "seq_gap",
        seq=4,
        offset=offs[4],
    )
    ledger_only(
        "torn-last-line",
        "the last line cut short with no newline, as by a crash mid-write",
        joined(lines[:-1]) + lines[-1][:40],
        "torn_tail",
        seq=n - 1,
        offset=offs[n - 1],
    )
    ledger_only(
        "missing-final-newline",
        "only the final newline removed: a final line without newline is a torn tail",
        basic.data[:-1],
        "torn_tail",
        seq=n - 1,
        offset=offs[n - 1],
    )
    ledger_only(
        "changed-prev",
        "one hex digit of prev changed in the line at seq 5",
        with_line(5, flip_prev_digit(lines[5])),
        "chain_break",
        seq=5,
        offset=offs[5],
    )
    ledger_only(
        "crlf-line-endings",
        "every newline turned into CRLF: each line gains a \\r, JSON still parses, hashes change",
        basic.data.replace(b"\n", b"\r\n"),
        "chain_break",
        seq=1,
        offset=offs[1] + 1,
    )
    ledger_only(
        "malformed-line",
        "a brace removed from the line at seq 8: not JSON",
        with_line(8, lines[8][:-1]),
        "malformed_line",
        seq=8,
        offset=offs[8],
    )
    ledger_only(
        "invalid-utf8",
        "a byte that is not UTF-8 inside a string at seq 1",
        with_line(1, replace_once(b"triage", b"tri\xffge")(lines[1])),
        "malformed_line",
        seq=1,
        offset=offs[1],
    )
    ledger_only(
        "byte-order-mark",
        "a UTF-8 byte-order mark before the line at seq 3",
        with_line(3, b"\xef\xbb\xbf" + lines[3]),
        "malformed_line",
        seq=3,
        offset=offs[3],
    )

    # Forgeries: the forger re-chains every line after the edit, so only the rule
    # the edit breaks (or the receipt) can catch it.
    run = basic_run()

    def forged(position: int, **changes) -> Ledger:
        entries = copy.deepcopy(run)
        for key, value in changes.items():
            setattr(entries[position], key, value)
        return chain(entries)

    gap = forged(5, seq=6)  # renumbered: seq 5 skipped
    ledger_only(
        "seq-gap-rechained",
        "seq 5 carries 6 (the chain re-computed): a gap in seq",
        gap.data,
        "seq_gap",
        seq=5,
        offset=gap.offsets[5],
    )
    back = forged(5, mono_ms=100)
    ledger_only(
        "mono-regression-rechained",
        "mono_ms at seq 5 goes back below the line before (re-chained)",
        back.data,
        "mono_regression",
        seq=5,
        offset=back.offsets[5],
    )
    dup = forged(3, edit=replace_once(b'"status":200', b'"status":200,"status":500'))
    ledger_only(
        "duplicate-key-rechained",
        'a second "status" key in the line at seq 3 (re-chained): ambiguous, so malformed',
        dup.data,
        "malformed_line",
        seq=3,
        offset=dup.offsets[3],
    )
    nan = forged(3, edit=replace_once(b'"ttfb_ms":210', b'"ttfb_ms":NaN'))
    ledger_only(
        "nan-rechained",
        "NaN, which is not JSON, in the line at seq 3 (re-chained)",
        nan.data,
        "malformed_line",
        seq=3,
        offset=nan.offsets[3],
    )
    deep = forged(1, fields=run[1].fields | {"nested": nested(64)})
    ledger_only(
        "too-deep-rechained",
        "the line at seq 1 nests 65 levels deep, an array 64 deep in the line's object (re-chained)",
        deep.data,
        "malformed_line",
        seq=1,
        offset=deep.offsets[1],
    )
    v2 = forged(4, edit=replace_once(b'{"v":1,', b'{"v":2,'))
    ledger_only(
        "unsupported-version-rechained",
        "the line at seq 4 says v 2 (re-chained)",
        v2.data,
        "unsupported_version",
        seq=4,
        offset=v2.offsets[4],
    )
    longer = chain([*run[:-1], Entry("agent.backoff", 6301, {"ms": 500}), run[-1]])
    ledger_only(
        "inserted-line-rechained",
        "an agent.backoff inserted before session.end, the chain re-computed: one event too many",
        longer.data,
        "count_mismatch",
        seq=n,
        offset=longer.offsets[n],
        field="ledger.events",
    )
    cheaper = forged(
        3,
        fields=run[3].fields
        | {"usage": {"input_tokens": 1812, "output_tokens": 24, "cached_tokens": 1024}},
    )
    ledger_only(
        "forged-usage-rechained",
        "output_tokens lowered at seq 3 and the chain re-computed: the receipt's head no longer matches",
        cheaper.data,
        "head_mismatch",
        seq=n - 1,
        offset=cheaper.offsets[n - 1],
        field="ledger.head",
    )
    v.fail(
        "forged-usage-and-head",
        "as forged-usage-rechained, and the receipt's head and bytes forged to match: the totals do not",
        cheaper.data,
        repointed(basic_receipt, cheaper),
        "total_mismatch",
        field="totals.by_model.gpt-4o.output_tokens",
    )
    bad_event = chain(
        [
            *run[:3],
            Entry(run[3].type, run[3].mono_ms, run[3].fields | {"cost_nusd": "4425000"}),
            *run[4:],
        ]
    )
    v.rechained(
        "malformed-event",
        "cost_nusd is a string in the model.response at seq 3 (re-chained, receipt re-pointed)",
        bad_event,
        basic_receipt,
        seq=3,
    )
    after_end = chain([*run, Entry("agent.backoff", 6400, {"ms": 10})])
    after_receipt = edited(repointed(basic_receipt, after_end), "ledger.events", n + 1)
    v.fail(
        "event-after-session-end",
        "an event after session.end (re-chained, receipt re-pointed): session.end is the last event",
        after_end.data,
        after_receipt,
        "malformed_event",
        seq=n,
        offset=after_end.offsets[n],
    )

    # -- a tampered receipt, the ledger as written (exit 1)
    # These share the ledgers of the valid vectors, named with --ledger.
    folders = {id(basic): "ok-basic", id(capped): "ok-cap-kill", id(chaos): "ok-chaos-gap"}
    folders[id(no_end)] = "ok-no-session-end"

    def receipt_only(name, description, base_led, receipt, code, **kw):
        ledger_arg = f"{folders[id(base_led)]}/ledger.jsonl"
        v.fail(name, description, None, receipt, code, ledger_arg=ledger_arg, **kw)

    def receipt_case(name, description, base_led, base_receipt, path, value, code, **kw):
        receipt_only(name, description, base_led, edited(base_receipt, path, value), code, **kw)

    t = basic_receipt["totals"]
    receipt_case(
        "receipt-total",
        "totals.output_tokens raised by one",
        basic,
        basic_receipt,
        "totals.output_tokens",
        t["output_tokens"] + 1,
        "total_mismatch",
        field="totals.output_tokens",
    )
    receipt_case(
        "receipt-usd",
        "totals.usd lowered",
        basic,
        basic_receipt,
        "totals.usd",
        "0.000001000",
        "total_mismatch",
        field="totals.usd",
    )
    receipt_case(
        "receipt-model-cost",
        "one model's cost_nusd changed",
        basic,
        basic_receipt,
        "totals.by_model.gpt-4o.cost_nusd",
        t["by_model"]["gpt-4o"]["cost_nusd"] - 1,
        "total_mismatch",
        field="totals.by_model.gpt-4o.cost_nusd",
    )
    extra = copy.deepcopy(basic_receipt)
    extra["totals"]["by_model"]["gpt-5"] = dict(t["by_model"]["gpt-4o-mini"])
    receipt_only(
        "receipt-extra-model",
        "a model the ledger never saw claimed in totals.by_model",
        basic,
        extra,
        "total_mismatch",
        field="totals.by_model.gpt-5",
    )
    receipt_case(
        "receipt-wrong-head",
        "ledger.head is another line's hash",
        basic,
        basic_receipt,
        "ledger.head",
        line_hash(lines[0]),
        "head_mismatch",
        seq=n - 1,
        offset=offs[n - 1],
        field="ledger.head",
    )
    receipt_case(
        "receipt-wrong-count",
        "ledger.events one more than the ledger holds",
        basic,
        basic_receipt,
        "ledger.events",
        n + 1,
        "count_mismatch",
        seq=n,
        offset=len(basic.data),
        field="ledger.events",
    )
    receipt_case(
        "receipt-wrong-bytes",
        "ledger.bytes off by one",
        basic,
        basic_receipt,
        "ledger.bytes",
        len(basic.data) + 1,
        "bytes_mismatch",
        field="ledger.bytes",
    )
    receipt_case(
        "receipt-exit-status",
        "exit.status changed from 0 to 1",
        basic,
        basic_receipt,
        "exit.status",
        1,
        "exit_mismatch",
        field="exit.status",
    )
    receipt_case(
        "receipt-duration",
        "duration_ms shortened",
        basic,
        basic_receipt,
        "duration_ms",
        6000,
        "duration_mismatch",
        field="duration_ms",
    )
    receipt_case(
        "receipt-run-id",
        "run_id changed",
        basic,
        basic_receipt,
        "run_id",
        "run-2026-11-18-9999",
        "run_mismatch",
        field="run_id",
    )
    receipt_case(
        "receipt-unit-price",
        "a unit price lowered",
        basic,
        basic_receipt,
        "pricing.unit_prices.gpt-4o.output",
        "5.00",
        "pricing_mismatch",
        field="pricing.unit_prices.gpt-4o.output",
    )
    receipt_case(
        "receipt-policy",
        "policy_digest changed",
        basic,
        basic_receipt,
        "policy_digest",
        "sha256:" + "0" * 64,
        "policy_mismatch",
        field="policy_digest",
    )
    receipt_case(
        "receipt-breach-hidden",
        "the usd breach removed from caps.breaches",
        capped,
        capped_receipt,
        "caps.breaches",
        [],
        "caps_mismatch",
        field="caps.breaches[0]",
    )
    receipt_case(
        "receipt-faults",
        "faults.injected lowered to 0",
        chaos,
        chaos_receipt,
        "faults.injected",
        0,
        "faults_mismatch",
        field="faults.injected",
    )
    receipt_case(
        "receipt-complete-despite-gap",
        "the receipt claims a complete ledger; session.end and an evidence.gap say otherwise",
        chaos,
        chaos_receipt,
        "ops.evidence",
        COMPLETE,
        "evidence_mismatch",
        field="ops.evidence.ledger_complete",
    )
    liar_run = chaos_run()
    liar_run[-1] = end(liar_run[-1].mono_ms, evidence=COMPLETE)
    liar = chain(liar_run)
    v.fail(
        "complete-despite-gap",
        "session.end and the receipt both claim a complete ledger, yet it holds an evidence.gap",
        liar.data,
        receipt_for(liar, COMPLETE),
        "evidence_mismatch",
        field="ops.evidence.ledger_complete",
    )
    receipt_case(
        "receipt-unwritten-lowered",
        "unwritten_events lowered to 1 in the receipt; session.end says 2",
        chaos,
        chaos_receipt,
        "ops.evidence.unwritten_events",
        1,
        "evidence_mismatch",
        field="ops.evidence.unwritten_events",
    )
    short_run = chaos_run()
    short_run[-1] = end(short_run[-1].mono_ms, evidence=GAP_EVIDENCE | {"unwritten_events": 1})
    short = chain(short_run)
    v.fail(
        "unwritten-below-lost",
        "session.end and the receipt say 1 event unwritten; the evidence.gap records 2 lost",
        short.data,
        receipt_for(short, GAP_EVIDENCE | {"unwritten_events": 1}),
        "evidence_mismatch",
        field="ops.evidence.unwritten_events",
    )
    early_run = chaos_run()
    early_run[-1] = end(early_run[-1].mono_ms, evidence=GAP_EVIDENCE | {"first_failing_seq": 5})
    early = chain(early_run)
    v.fail(
        "first-failing-seq-not-the-gap",
        "session.end and the receipt say the first failure was at seq 5; the evidence.gap says 7",
        early.data,
        receipt_for(early, GAP_EVIDENCE | {"first_failing_seq": 5}),
        "evidence_mismatch",
        field="ops.evidence.first_failing_seq",
    )
    receipt_case(
        "receipt-complete-without-end",
        "ledger_complete claimed for a ledger that lacks session.end",
        no_end,
        no_end_receipt,
        "ops.evidence",
        COMPLETE,
        "evidence_mismatch",
        field="ops.evidence.ledger_complete",
    )
    receipt_only(
        "receipt-missing-field",
        "policy_digest removed",
        basic,
        without(basic_receipt, "policy_digest"),
        "receipt_malformed",
        field="policy_digest",
    )
    unknown = edited(basic_receipt, "signature", "trust me")
    receipt_only(
        "receipt-unknown-field",
        "a field docket-receipt-1 does not define",
        basic,
        unknown,
        "receipt_malformed",
        field="signature",
    )
    receipt_case(
        "receipt-bool-for-int",
        "ops.evidence.unwritten_events is false, not 0",
        basic,
        basic_receipt,
        "ops.evidence.unwritten_events",
        False,
        "receipt_malformed",
        field="ops.evidence.unwritten_events",
    )
    text = encode_receipt(basic_receipt).replace(
        b'"run_id": ', b'"run_id": "run-other",\n  "run_id": ', 1
    )
    receipt_only(
        "receipt-duplicate-key",
        "run_id twice in the receipt: ambiguous, so malformed",
        basic,
        text,
        "receipt_malformed",
    )

    # -- inputs that are not what they claim (exit 2)
    v.add(
        "input-receipt-not-json",
        "the receipt is not JSON",
        ledger=None,
        receipt=b"ledger: ledger.jsonl\nok: yes\n",
        verdict="input_error",
        code="receipt_not_json",
    )
    v.add(
        "input-receipt-array",
        "the receipt is JSON, but an array",
        ledger=None,
        receipt=b"[1, 2, 3]\n",
        verdict="input_error",
        code="not_a_receipt",
    )
    v.add(
        "input-receipt-other-format",
        "a receipt of a format this docket does not read",
        ledger=None,
        receipt=edited(basic_receipt, "format", "docket-receipt-9"),
        verdict="input_error",
        code="not_a_receipt",
    )
    v.add(
        "input-receipt-empty",
        "the receipt is an empty file",
        ledger=None,
        receipt=b"",
        verdict="input_error",
        code="receipt_unreadable",
    )
    v.add(
        "input-receipt-binary",
        "the receipt holds NUL bytes",
        ledger=None,
        receipt=b"\x00\x01\x02docket\x00",
        verdict="input_error",
        code="receipt_unreadable",
    )
    v.input_error(
        "input-receipt-directory",
        "the receipt path is a folder",
        "receipt_unreadable",
        receipt_path="ok-basic",
    )
    v.add(
        "input-ledger-missing",
        "the ledger the receipt names does not exist",
        ledger=None,
        receipt=basic_receipt,
        verdict="input_error",
        code="ledger_unreadable",
    )
    v.add(
        "input-ledger-empty",
        "the ledger is an empty file",
        ledger=b"",
        receipt=basic_receipt,
        verdict="input_error",
        code="empty_ledger",
    )
    v.add(
        "input-ledger-not-a-ledger",
        "the ledger is a CSV file",
        ledger=b"seq,type\n0,session.start\n",
        receipt=basic_receipt,
        verdict="input_error",
        code="not_a_ledger",
    )
    v.add(
        "input-ledger-first-line-malformed",
        'the first line begins {"v": but is not JSON',
        ledger=b'{"v":1,"seq":0,"ts":"2026-11-18T09:46:40.000Z","mono_ms":0,"type":"session.start"\n'
        + basic.data,
        receipt=basic_receipt,
        verdict="input_error",
        code="not_a_ledger",
    )
    v.add(
        "input-ledger-version-2",
        "the first line is format v 2, which this docket does not read",
        ledger=forged(0, edit=replace_once(b'{"v":1,', b'{"v":2,')).data,
        receipt=basic_receipt,
        verdict="input_error",
        code="not_a_ledger",
    )

    # -- calls left open (section 7.5), added with the open_call check
    entries, unwritten_end, lost = killed_run()
    killed = chain(entries)
    killed_receipt = receipt_for(killed, lost, end_event=unwritten_end)
    v.ok(
        "ok-open-call-disclosed",
        "a call in flight when the run stopped: its closing event and session.end unwritten, "
        "the ledger incomplete and the call named in ops.open_calls",
        killed,
        killed_receipt,
        unbacked=["ended_at", "duration_ms", "exit"],
    )
    v.fail(
        "open-call-hidden",
        "as ok-open-call-disclosed, with ops.open_calls removed: the open call is not named",
        None,
        without(killed_receipt, "ops.open_calls"),
        "open_call",
        ledger_arg="ok-open-call-disclosed/ledger.jsonl",
        field="ops.open_calls[0]",
    )
    never_closed = chain([*entries, end(2000)])
    v.fail(
        "open-call-in-complete-ledger",
        "a model.request with no closing event, in a ledger the receipt calls complete",
        never_closed.data,
        receipt_for(never_closed, COMPLETE),
        "open_call",
        seq=len(entries) - 1,
        field="ops.open_calls",
    )

    # -- section 8 step 2: JSON-ness is decided over the whole text first
    dup_then_junk = b'{"format":"docket-receipt-1","format":"x"} trailing\n'
    v.add(
        "input-receipt-duplicate-then-junk",
        "a name twice, then text after the value: not JSON, whatever the duplicate",
        ledger=None,
        receipt=dup_then_junk,
        verdict="input_error",
        code="receipt_not_json",
    )
    # The receipt object is level 1: 64 arrays inside a member make 65 levels.
    deep_text = encode_receipt(basic_receipt).replace(
        b'"format": ', b'"x": ' + json.dumps(nested(64)).encode() + b',\n  "format": ', 1
    )
    receipt_only(
        "receipt-too-deep",
        "a valid receipt with a member nested 65 levels deep: JSON, but ambiguous, so malformed "
        "(step 2, before its shape is checked)",
        basic,
        deep_text,
        "receipt_malformed",
    )
    v.add(
        "input-receipt-deep-not-json",
        "100 nested arrays, the last closing bracket missing: not JSON, however deep",
        ledger=None,
        receipt=b"[" * 100 + b"]" * 99 + b"\n",
        verdict="input_error",
        code="receipt_not_json",
    )

    # -- section 8 step 5: after an unverified tail no byte is read
    torn_end = encode_line(
        seq=len(no_end.lines),
        ts=unwritten_end["ts"],
        mono_ms=unwritten_end["mono_ms"],
        type="session.end",
        prev=no_end.head,
        body=encode_body(
            {k: unwritten_end[k] for k in ("reason", "exit_status", "cap", "evidence")}
        ),
    )[:57]  # the write of session.end cut short
    v.add(
        "ok-unverified-tail-torn",
        "session.end's write failed part-way and could not be cut back; the receipt discloses an "
        "unverified tail, so the torn bytes after its events are not read",
        ledger=no_end.data + torn_end,
        receipt=receipt_for(
            no_end, UNWRITTEN_END | {"unverified_tail": True}, end_event=unwritten_end
        ),
        verdict="ok",
        figures=no_end,
        unbacked=["ended_at", "duration_ms", "exit"],
        tail_bytes=len(torn_end),
    )
    first_write = chain(minimal_run())
    no_line = build_receipt(
        Tally(),
        ledger_path="ledger.jsonl",
        head=line_hash(first_write.lines[0]),  # forged: the line never reached the disk whole
        count=0,
        size=0,
        evidence={
            "ledger_complete": False,
            "unwritten_events": 2,
            "first_failing_seq": 0,
            "write_failures": 2,
            "unverified_tail": True,
        },
        version=VERSION,
        start=first_write.events[0],
        end=first_write.events[1],
    )
    v.fail(
        "head-mismatch-no-line-read",
        "an unverified tail from the first line on (ledger.events 0), and a head that is not "
        "the empty chain's: head_mismatch with no seq or offset, as no line was read",
        first_write.lines[0][:40],
        no_line,
        "head_mismatch",
        field="ledger.head",
    )
    snapshot_vectors(v)
    number_vectors(v)
    forwarded_vectors(v)
    refusal_vectors(v)

    # -- the client's own retries (section 7.6), added with ops.client_retries
    retried = chain(client_retry_run())
    retried_receipt = receipt_for(retried, COMPLETE)
    v.ok(
        "ok-client-retries",
        "an SDK retried two calls twice each (client_attempt 0, 1, 2): ops.client_retries says "
        "6 marked requests, 4 retries",
        retried,
        retried_receipt,
    )
    v.fail(
        "client-retries-omitted",
        "as ok-client-retries, with ops.client_retries removed (absent: all zero)",
        None,
        without(retried_receipt, "ops.client_retries"),
        "client_retries_mismatch",
        ledger_arg="ok-client-retries/ledger.jsonl",
        field="ops.client_retries.by_attempt.0",
    )
    v.fail(
        "client-retries-lowered",
        "as ok-client-retries, with ops.client_retries.retries said to be 3",
        None,
        edited(retried_receipt, "ops.client_retries.retries", 3),
        "client_retries_mismatch",
        ledger_arg="ok-client-retries/ledger.jsonl",
        field="ops.client_retries.retries",
    )
    v.fail(
        "client-retries-claimed-unmarked",
        "ok-basic's receipt claiming a retry its ledger's requests do not mark",
        None,
        edited(
            basic_receipt, "ops.client_retries", {"marked": 1, "retries": 1, "by_attempt": {"1": 1}}
        ),
        "client_retries_mismatch",
        ledger_arg="ok-basic/ledger.jsonl",
        field="ops.client_retries.by_attempt.1",
    )
    v.fail(
        "client-retries-malformed",
        "ops.client_retries.retries is a string",
        None,
        edited(retried_receipt, "ops.client_retries.retries", "4"),
        "receipt_malformed",
        ledger_arg="ok-client-retries/ledger.jsonl",
        field="ops.client_retries.retries",
    )
    entries = client_retry_run()
    entries[3:5] = marked(entries[3:5], "1")
    bad_attempt = chain(entries)
    good = receipt_for(retried, COMPLETE)
    v.rechained(
        "client-attempt-not-integer",
        "client_attempt is a string in the model.request at seq 3 (re-chained, receipt re-pointed)",
        bad_attempt,
        good,
        seq=3,
    )

    # -- the response cache (section 7.8), added with ops.cache
    cache_led = chain(cache_run())
    cache_receipt = receipt_for(cache_led, COMPLETE)
    v.ok(
        "ok-cache",
        "the response cache on: one answer stored and replayed twice (cache.hit), one not "
        "stored (temperature), one failed call not stored (not_2xx); ops.cache says so",
        cache_led,
        cache_receipt,
    )
    v.fail(
        "cache-omitted",
        "as ok-cache, with ops.cache removed (absent: all zero)",
        None,
        without(cache_receipt, "ops.cache"),
        "cache_mismatch",
        ledger_arg="ok-cache/ledger.jsonl",
        field="ops.cache.hits",
    )
    v.fail(
        "cache-saving-raised",
        "as ok-cache, with ops.cache.saved_nusd one nano-USD more than the cache.hit events say",
        None,
        edited(
            cache_receipt, "ops.cache.saved_nusd", cache_receipt["ops"]["cache"]["saved_nusd"] + 1
        ),
        "cache_mismatch",
        ledger_arg="ok-cache/ledger.jsonl",
        field="ops.cache.saved_nusd",
    )
    v.fail(
        "cache-claimed-without-cache",
        "ok-basic's receipt claiming a cache hit its ledger does not hold",
        None,
        edited(
            basic_receipt,
            "ops.cache",
            {"hits": 1, "misses": 0, "stored": 0, "refused_by_reason": {}, "saved_nusd": 0},
        ),
        "cache_mismatch",
        ledger_arg="ok-basic/ledger.jsonl",
        field="ops.cache.hits",
    )
    v.fail(
        "cache-malformed",
        "ops.cache.refused_by_reason.temperature is a string",
        None,
        edited(cache_receipt, "ops.cache.refused_by_reason.temperature", "1"),
        "receipt_malformed",
        ledger_arg="ok-cache/ledger.jsonl",
        field="ops.cache.refused_by_reason.temperature",
    )
    bad_hit = chain(cache_run(saved="5"))
    v.rechained(
        "cache-hit-saving-not-integer",
        "saved_nusd is a string in the cache.hit at seq 3 (re-chained, receipt re-pointed)",
        bad_hit,
        cache_receipt,
        seq=3,
    )

    digests_led = chain(cache_run(served=ANSWER_SHA256))
    digests_receipt = receipt_for(digests_led, COMPLETE)
    v.ok(
        "ok-cache-digests",
        "as ok-cache, with the stored answer's SHA-256 on the closing event that stored it "
        "(cache_body_sha256) and on both cache.hit events (body_sha256)",
        digests_led,
        digests_receipt,
    )
    for name, description, led, seq in (
        (
            "cache-hit-digest-not-hex",
            "as ok-cache-digests, with body_sha256 in upper case in the cache.hit at seq 3",
            chain(cache_run(served=ANSWER_SHA256.upper())),
            3,
        ),
        (
            "cache-digest-not-stored",
            "as ok-cache-digests, with a cache_body_sha256 on the model.response at seq 6,"
            " whose answer was not stored (cache_refused)",
            chain(cache_run(served=ANSWER_SHA256, refused_digest=ANSWER_SHA256)),
            6,
        ),
    ):
        v.rechained(
            name, description + " (re-chained, receipt re-pointed)", led, digests_receipt, seq
        )

    shared = chain(shared_cache_run("20261118T110000Z-0a1b2c3d"))
    shared_receipt = receipt_for(shared, COMPLETE)
    v.ok(
        "ok-cache-shared",
        "two hits from a cache store shared between runs: each names the run that stored the "
        "answer (replays_run) and a seq of that run's ledger (41, past this ledger's end)",
        shared,
        shared_receipt,
    )
    bad_run = chain(shared_cache_run(7))
    v.rechained(
        "cache-hit-replays-run-not-string",
        "as ok-cache-shared, with replays_run a number in the cache.hit at seq 1 (re-chained, "
        "receipt re-pointed)",
        bad_run,
        shared_receipt,
        seq=1,
    )
    replay_vectors(v, basic_receipt)
    fleet_vectors(v, basic_receipt)

    v.write_manifest()
    # The attestation vectors sign run folders written above (spec/docket-attestation-1.md).
    attest = runpy.run_path(str(HERE / "make_attestation_vectors.py"))["make_attestations"]
    attest(out, v.manifest)


REPLAYED_RUN = "20261118T100000Z-9f8e7d6c"
REPLAYED_HEAD = "3b" * 32


def replay_run(head: object = REPLAYED_HEAD) -> list[Entry]:
    """basic_run, as `docket replay` of another run records it: session.start's replay_of."""
    entries = basic_run()
    first = entries[0]
    entries[0] = Entry(
        first.type,
        first.mono_ms,
        first.fields | {"replay_of": {"run_id": REPLAYED_RUN, "head": head}},
    )
    return entries


def replay_vectors(v: Vectors, basic_receipt: dict) -> None:
    """The receipt's replay_of (section 7.9), added with `docket replay`."""
    led = chain(replay_run())
    receipt = receipt_for(led, COMPLETE)
    v.ok(
        "ok-replay",
        "a run served by `docket replay` of another run: session.start's replay_of "
        "{run_id, head}, stated by the receipt",
        led,
        receipt,
    )
    v.fail(
        "replay-omitted",
        "as ok-replay, with replay_of removed: the receipt hides that the run was a replay",
        None,
        without(receipt, "replay_of"),
        "replay_mismatch",
        ledger_arg="ok-replay/ledger.jsonl",
        field="replay_of",
    )
    v.fail(
        "replay-head-changed",
        "as ok-replay, with replay_of.head naming another recording",
        None,
        edited(receipt, "replay_of.head", "4c" * 32),
        "replay_mismatch",
        ledger_arg="ok-replay/ledger.jsonl",
        field="replay_of.head",
    )
    v.fail(
        "replay-claimed-without-replay",
        "ok-basic's receipt claiming a replay its ledger's session.start does not record",
        None,
        edited(basic_receipt, "replay_of", {"run_id": REPLAYED_RUN, "head": REPLAYED_HEAD}),
        "replay_mismatch",
        ledger_arg="ok-basic/ledger.jsonl",
        field="replay_of",
    )
    v.fail(
        "replay-malformed",
        "replay_of.head is not hex64 in the receipt",
        None,
        edited(receipt, "replay_of.head", "not a digest"),
        "receipt_malformed",
        ledger_arg="ok-replay/ledger.jsonl",
        field="replay_of.head",
    )
    bad = chain(replay_run(head=REPLAYED_HEAD.upper()))
    v.rechained(
        "replay-head-not-hex",
        "replay_of.head in upper case in session.start at seq 0 (re-chained, receipt re-pointed)",
        bad,
        receipt,
        seq=0,
    )


FLEET_BUDGET = "team-a"
FLEET_DATABASE = {"host": "db.internal", "port": "5432", "dbname": "docket"}


def fleet_lease(mono_ms: int, change: str, lease: str, **amounts: int) -> Entry:
    """A fleet.lease as the boundary writes it (docket/fleet/lease.py): its amounts
    `<prefix>_nusd`, `<prefix>_tokens`, `<prefix>_calls` by what they are."""
    fields: dict = {"budget": FLEET_BUDGET, "change": change, "lease": lease}
    for prefix, (nusd, tokens, calls) in (
        (k, amounts[k]) for k in ("granted", "reported", "unused", "held") if k in amounts
    ):
        fields |= {f"{prefix}_nusd": nusd, f"{prefix}_tokens": tokens, f"{prefix}_calls": calls}
    return Entry("fleet.lease", mono_ms, fields)


def fleet_denied(mono_ms: int, code: str) -> Entry:
    return Entry(
        "policy.denied",
        mono_ms,
        {"rule": f"fleet.{code}", "code": code, "provider": "openai", "model": "gpt-4o"},
    )


def fleet_run(fleet: object = None) -> list[Entry]:
    """A run under [fleet] (section 7.10) with a full lease cycle: the database down at
    first (a fleet.store, a call refused no_lease), a lease drawn, a call, the lease
    renewed with a report, another run's expired lease folded, a call refused
    slice_short, and the rest given back at the end."""
    first = start("run-2026-11-18-0020")
    first.fields["fleet"] = (
        {"budget": FLEET_BUDGET, "database": dict(FLEET_DATABASE)} if fleet is None else fleet
    )
    return [
        first,
        Entry("process.spawn", 2, {"pid": 8200, "argv": ["python", "agent.py"]}),
        Entry(
            "fleet.store",
            10,
            {"budget": FLEET_BUDGET, "reason": "connection refused", "asked": "first"},
        ),
        fleet_denied(20, "no_lease"),
        fleet_lease(1030, "drawn", "7", granted=(250_000_000, 0, 20), reported=(0, 0, 0)),
        *call(1100, "call-0001", "gpt-4o", 1812, 240),
        fleet_lease(16000, "renewed", "7", granted=(0, 0, 0), reported=(6_930_000, 0, 1)),
        fleet_lease(16001, "expired", "5", held=(120_000_000, 0, 9)),
        fleet_denied(17000, "slice_short"),
        fleet_denied(17100, "slice_short"),
        Entry("process.exit", 18000, {"pid": 8200, "status": 0, "reason": "exited"}),
        fleet_lease(18010, "returned", "7", reported=(0, 0, 0), unused=(243_070_000, 0, 19)),
        end(18020),
    ]


def fleet_vectors(v: Vectors, basic_receipt: dict) -> None:
    """The receipt's fleet (section 7.10), added with the fleet budget."""
    led = chain(fleet_run())
    receipt = receipt_for(led, COMPLETE, section_6_5=True)
    v.ok(
        "ok-fleet",
        "a run under [fleet] with a full lease cycle (a failed exchange, a lease drawn, "
        "renewed, another's expired lease folded, fleet refusals, the rest given back), "
        "stated by the receipt's fleet",
        led,
        receipt,
    )
    there = {"ledger_arg": "ok-fleet/ledger.jsonl"}
    for name, path, value, what in (
        ("fleet-granted-changed", "fleet.granted.nusd", 260_000_000, "a grant larger"),
        ("fleet-leases-changed", "fleet.leases.drawn", 2, "two leases drawn"),
        ("fleet-refused-changed", "fleet.refused_by_code.slice_short", 1, "one refusal fewer"),
        ("fleet-store-changed", "fleet.store_failures", 0, "no failed exchange"),
        ("fleet-budget-renamed", "fleet.budget", "team-b", "another budget"),
        ("fleet-ended-changed", "fleet.ended", "lost", "the lease lost, not given back"),
    ):
        v.fail(
            name,
            f"as ok-fleet, with {path} claiming {what}",
            None,
            edited(receipt, path, value),
            "fleet_mismatch",
            field=path,
            **there,
        )
    v.fail(
        "fleet-omitted",
        "as ok-fleet, with fleet removed: the receipt hides the fleet budget the run spent",
        None,
        without(receipt, "fleet"),
        "fleet_mismatch",
        field="fleet",
        **there,
    )
    v.fail(
        "fleet-claimed-without-fleet",
        "ok-basic's receipt claiming a fleet section its ledger has no fleet for",
        None,
        edited(basic_receipt, "fleet", receipt["fleet"]),
        "fleet_mismatch",
        ledger_arg="ok-basic/ledger.jsonl",
        field="fleet",
    )
    v.fail(
        "fleet-malformed",
        "fleet.granted.calls is a string in the receipt",
        None,
        edited(receipt, "fleet.granted.calls", "20"),
        "receipt_malformed",
        field="fleet.granted.calls",
        **there,
    )
    bad = chain(fleet_run(fleet={"budget": FLEET_BUDGET, "database": {"host": "db.internal"}}))
    v.rechained(
        "fleet-start-malformed",
        "session.start's fleet.database lacks port and dbname at seq 0 (re-chained, "
        "receipt re-pointed)",
        bad,
        receipt,
        seq=0,
    )
    amounts = fleet_run()
    amounts[4] = fleet_lease(1030, "drawn", "7", granted=(-1, 0, 20))
    bad = chain(amounts)
    v.rechained(
        "fleet-lease-amount-negative",
        "a fleet.lease whose granted_nusd is negative at seq 4 (re-chained, receipt re-pointed)",
        bad,
        receipt,
        seq=4,
    )


def snapshot_run(*, changes_first: bool = False) -> list[Entry]:
    """A --snapshot --rollback-on-breach run stopped by the wall-clock cap (section 7.7)."""
    taken = Entry(
        "snapshot.taken",
        40,
        {
            "index": 0,
            "root": "/home/dev/project",
            "files": 12,
            "dirs": 3,
            "links": 1,
            "bytes": 48213,
            "manifest_sha256": "9f" * 32,
            "manifest": "snapshots/0.json",
            "exclude": [".git"],
            "skipped": [],
        },
    )
    row = {"path": "src/app.py", "before": None, "after": None}
    changes = Entry(
        "snapshot.changes",
        40 if changes_first else 2510,  # mono_ms never goes down
        {
            "index": 0,
            "created": [{**row, "path": "tmp.out"}],
            "modified": [row],
            "deleted": [{**row, "path": "README.md"}],
            "mode_changed": [],
            "counts": {"created": 1, "modified": 1, "deleted": 1, "mode_changed": 0},
            "after_manifest_sha256": "a0" * 32,
            "skipped": [],
        },
    )
    spawn_to_exit = [
        Entry("process.spawn", 41, {"pid": 7001, "argv": ["python", "agent.py"]}),
        Entry("signal.forwarded", 2401, {"pgid": 7001, "signal": "SIGTERM"}),
        Entry("process.exit", 2500, {"pid": 7001, "status": -15, "reason": "signal SIGTERM"}),
    ]
    first = [changes, taken] if changes_first else [taken]
    rest = [] if changes_first else [changes]
    return [
        start("run-2026-11-18-0009", caps={"max_wall_seconds": 2.5}),
        *first,
        *spawn_to_exit,
        *rest,
        Entry(
            "snapshot.restored",
            2530,
            {
                "index": 0,
                "applied": 3,
                "paths": ["tmp.out", "README.md", "src/app.py"],
                "failed": [],
                "verified": True,
                "manifest_sha256": "9f" * 32,
            },
        ),
        end(2531, reason="wall-clock cap reached", status=42, cap="max_wall_seconds"),
    ]


def snapshot_vectors(v: Vectors) -> None:
    """Section 7.7's vectors: a run with a snapshot and a rollback, and two forgeries."""
    led = chain(snapshot_run())
    receipt = receipt_for(led, COMPLETE)
    v.ok(
        "ok-snapshot-rollback", "a --snapshot run rolled back after a cap stopped it", led, receipt
    )
    v.fail(
        "receipt-snapshot-restored",
        "the receipt says the rollback left the tree unverified; snapshot.restored says verified",
        None,
        edited(
            receipt,
            "snapshot",
            [
                {
                    **receipt["snapshot"][0],
                    "restored": {"applied": 3, "failed": 0, "verified": False},
                }
            ],
        ),
        "snapshot_mismatch",
        ledger_arg="ok-snapshot-rollback/ledger.jsonl",
        field="snapshot[0].restored.verified",
    )
    bad = chain(snapshot_run(changes_first=True))
    v.rechained(
        "snapshot-changes-before-taken",
        "a snapshot.changes that no snapshot.taken precedes (re-chained, receipt re-pointed)",
        bad,
        receipt,
        seq=1,
    )


HUGE_INTEGER = b"1" + b"0" * 4999  # 5,000 digits


def number_vectors(v: Vectors) -> None:
    """Rule 2.1.7 (number size) and number forms in the fields read as integers."""
    run = basic_run()
    basic = chain(run)
    receipt = receipt_for(basic, COMPLETE)

    def forged_line(position: int, old: bytes, new: bytes) -> Ledger:
        entries = copy.deepcopy(run)
        entries[position].edit = replace_once(old, new)
        return chain(entries)

    # A number past the bounds in a member nothing reads (ttfb_ms at seq 3), re-chained:
    # malformed_line, whatever its value would have meant.
    for name, number, what in (
        ("number-huge-integer", HUGE_INTEGER, "a 5,000-digit integer"),
        ("number-33-digits", b"1" + b"0" * 32, "a 33-digit integer (32 is the most)"),
        ("number-long-fraction", b"0." + b"0" * 31 + b"1", "0.000...1 with 33 digits"),
        ("number-exponent-digits", b"1e9999999999999999999", "1e9999999999999999999"),
        ("number-exponent-five-digits", b"1e00001", "1e00001 (five exponent digits)"),
        ("number-above-range", b"1e301", "1e301 (above 10^300)"),
        ("number-above-range-scaled", b"10e300", "10e300 (10^301)"),
        ("number-below-range", b"1e-5000", "1e-5000 (below 10^-300)"),
        ("number-below-range-scaled", b"0.01e-299", "0.01e-299 (10^-301)"),
        ("number-negative-huge", b"-" + HUGE_INTEGER, "minus a 5,000-digit integer"),
    ):
        led = forged_line(3, b'"ttfb_ms":210', b'"ttfb_ms":' + number)
        v.rechained(
            f"{name}-rechained",
            f"{what} in a member nothing reads, at seq 3 (re-chained, receipt re-pointed): "
            "past rule 2.1.7, so malformed_line",
            led,
            receipt,
            seq=3,
            code="malformed_line",
        )
    led = forged_line(3, b'"ttfb_ms":210', b'"ttfb_ms":0210')
    v.rechained(
        "number-leading-zero-rechained",
        "0210 at seq 3 (re-chained): a leading zero is not JSON",
        led,
        receipt,
        seq=3,
        code="malformed_line",
    )
    led = forged_line(0, b'"calls":50', b'"calls":' + HUGE_INTEGER)
    v.add(
        "number-huge-first-line",
        "a 5,000-digit integer in session.start's caps: the first line is malformed, so not a ledger",
        ledger=led.data,
        receipt=repointed(receipt, led),
        verdict="input_error",
        code="not_a_ledger",
    )
    # Numbers read as integers: a fraction or exponent is the wrong type, whatever the value.
    for name, old, new, code in (
        ("number-mono-ms-fraction", b'"mono_ms":1260', b'"mono_ms":1260.0', "malformed_line"),
        ("number-mono-ms-exponent", b'"mono_ms":1260', b'"mono_ms":1.26e3', "malformed_line"),
        (
            "number-cost-fraction",
            b'"cost_nusd":5650000',
            b'"cost_nusd":5650000.0',
            "malformed_event",
        ),
        ("number-cost-exponent", b'"cost_nusd":5650000', b'"cost_nusd":565e4', "malformed_event"),
        (
            "number-cost-above-range",
            b'"cost_nusd":5650000',
            b'"cost_nusd":9007199254740992',
            "malformed_event",
        ),
        (
            "number-cost-negative",
            b'"cost_nusd":5650000',
            b'"cost_nusd":-5650000',
            "malformed_event",
        ),
    ):
        led = forged_line(3, old, new)
        v.rechained(
            f"{name}-rechained",
            f"{new.decode()} at seq 3 (re-chained, receipt re-pointed): not an integer in range",
            led,
            receipt,
            seq=3,
            code=code,
        )
    # Within the bounds, every form of a number reads as its value: the edges, -0, 0e9999,
    # 50.0 for 50, and the receipt compares them by value with what it writes.
    entries = copy.deepcopy(run)
    entries[0].fields["caps"] = {
        "usd": "2.00",
        "calls": 50,
        "edges": [0, 0, 1e300, 1.5e-300, 1e-300, 10**31, -(10**31), 0.5],
    }
    entries[0].edit = replace_once(
        b'"calls":50,"edges":[0,0,1e+300,1.5e-300,1e-300,'
        + str(10**31).encode()
        + b",-"
        + str(10**31).encode()
        + b",0.5]",
        b'"calls":50.0,"edges":[-0,0e9999,1e300,1.5e-300,0.1e-299,'
        + b"1"
        + b"0" * 31
        + b",-1"
        + b"0" * 31
        + b",5000000000000000000000000000000e-31]",
    )
    entries[1].fields["edge_numbers"] = [-0.0, 1e300, -1e-300]
    entries[1].edit = replace_once(
        b"[-0.0,1e+300,-1e-300]", b"[-0.0e-0,9" + b"9" * 31 + b"e268,-1E-300]"
    )
    led = chain(entries)
    v.ok(
        "ok-number-forms",
        "numbers at the bounds of rule 2.1.7 and in other forms (-0, 0e9999, 50.0 for 50, a "
        "32-digit significand), in caps the receipt restates by value and in a member nothing reads",
        led,
        receipt_for(led, COMPLETE),
    )
    # The receipt: a number past the bounds anywhere is receipt_malformed (no field);
    # a member read as an integer in another form names its path.
    text = encode_receipt(receipt)

    def receipt_bytes(old: bytes, new: bytes) -> bytes:
        if old not in text:
            raise ValueError(f"{old!r} is not in the receipt")
        return text.replace(old, new, 1)

    for name, new, what in (
        ("receipt-number-huge-integer", HUGE_INTEGER, "a 5,000-digit integer"),
        ("receipt-number-exponent-digits", b"1e9999999999999999999", "1e9999999999999999999"),
        ("receipt-number-above-range", b"1e5000", "1e5000"),
        ("receipt-number-below-range", b"1e-5000", "1e-5000"),
    ):
        v.fail(
            name,
            f"{what} in the receipt's caps.limits: past rule 2.1.7, so receipt_malformed",
            None,
            receipt_bytes(b'"calls": 50', b'"calls": ' + new),
            "receipt_malformed",
            ledger_arg="ok-basic/ledger.jsonl",
        )
    v.input_error(
        "input-receipt-huge-number-then-junk",
        "a 5,000-digit integer, and a syntax error after it: not JSON, decided over the whole text",
        "receipt_not_json",
        receipt=receipt_bytes(b'"calls": 50', b'"calls": ' + HUGE_INTEGER)[:-2] + b",}\n",
        ledger_arg="ok-basic/ledger.jsonl",
    )
    v.input_error(
        "input-receipt-leading-zero",
        "050 in the receipt: a leading zero is not JSON",
        "receipt_not_json",
        receipt=receipt_bytes(b'"calls": 50', b'"calls": 050'),
        ledger_arg="ok-basic/ledger.jsonl",
    )
    for name, old, new, where in (
        (
            "receipt-integer-fraction",
            b'"duration_ms": 6302',
            b'"duration_ms": 6302.0',
            "duration_ms",
        ),
        ("receipt-integer-exponent", b'"events": 16', b'"events": 1.6e1', "ledger.events"),
        (
            "receipt-integer-above-range",
            b'"events": 16',
            b'"events": 9007199254740992',
            "ledger.events",
        ),
        ("receipt-integer-negative", b'"injected": 0', b'"injected": -1', "faults.injected"),
    ):
        v.fail(
            name,
            f"{new.decode()} in the receipt: not an integer in range, so receipt_malformed at {where}",
            None,
            receipt_bytes(old, new),
            "receipt_malformed",
            ledger_arg="ok-basic/ledger.jsonl",
            field=where,
        )
    v.add(
        "ok-receipt-negative-zero",
        "the receipt writes exit.status as -0 and a cap limit as 5e1: the same values as the ledger's",
        ledger=None,
        receipt=receipt_bytes(b'"status": 0', b'"status": -0').replace(
            b'"calls": 50', b'"calls": 5e1', 1
        ),
        ledger_arg="ok-basic/ledger.jsonl",
        verdict="ok",
        figures=basic,
    )


def forwarded_vectors(v: Vectors) -> None:
    """model.request's forwarded_sha256 and forwarded_changes (section 5): the bytes sent
    upstream when they are not the agent's."""
    run = basic_run()
    assert run[2].type == "model.request"
    sent = line_hash(b"the body with stream_options.include_usage added")
    entries = copy.deepcopy(run)
    entries[2].fields |= {
        "stream": True,
        "forwarded_sha256": sent,
        "forwarded_changes": ["stream_options.include_usage"],
    }
    led = chain(entries)
    receipt = receipt_for(led, COMPLETE)
    v.ok(
        "ok-forwarded-body",
        "a streamed call the recorder forwarded with stream_options.include_usage added: "
        "forwarded_sha256 and forwarded_changes on its model.request",
        led,
        receipt,
    )
    request = entries[2].fields["request_sha256"]
    for name, changed, what in (
        (
            "forwarded-digest-alone",
            {"forwarded_changes": None},
            "forwarded_sha256 without forwarded_changes",
        ),
        (
            "forwarded-changes-alone",
            {"forwarded_sha256": None},
            "forwarded_changes without forwarded_sha256",
        ),
        (
            "forwarded-digest-uppercase",
            {"forwarded_sha256": sent.upper()},
            "forwarded_sha256 in capitals",
        ),
        (
            "forwarded-digest-short",
            {"forwarded_sha256": sent[:63]},
            "forwarded_sha256 of 63 digits",
        ),
        (
            "forwarded-digest-is-request",
            {"forwarded_sha256": request},
            "forwarded_sha256 equal to request_sha256",
        ),
        ("forwarded-changes-empty", {"forwarded_changes": []}, "forwarded_changes empty"),
        (
            "forwarded-changes-not-strings",
            {"forwarded_changes": [1]},
            "forwarded_changes holding a number",
        ),
    ):
        v.rechained(
            name,
            f"{what} on the model.request at seq 2 (re-chained, receipt re-pointed)",
            chain(with_fields(entries, 2, changed)),
            receipt,
            seq=2,
        )


OPENAI_URL = "https://api.openai.com/v1"
ANTHROPIC_URL = "https://api.anthropic.com"


def based(entries: list[Entry], base_url: str) -> list[Entry]:
    """A call's events with its model.request naming the upstream's base URL."""
    out = copy.deepcopy(entries)
    out[0].fields["base_url"] = base_url
    return out


# What refusal_run's refusals count under, counted by hand from its events (the receipt
# must say so; tests/test_verify_json.py holds verify's re-derived claims to it too).
REFUSED_BY_RULE = {
    "auth": 1,
    "breaker": 1,
    "caps": 1,
    "egress": 1,
    "ledger": 2,
    "load_shed": 1,
    "policy": 1,
    "rate_limit": 2,
}


def refusal_run() -> list[Entry]:
    """Section 6.5: every kind of refusal, a breaker's full cycle, faults on two layers,
    two providers at their base URLs, and calls refused because the ledger was full."""
    seed = 4242
    upstream_fault = "upstream:status(503)@call 2..4"
    net_fault = "\t net:reset_peer@call 5"  # the grammar allows blanks before the target
    guard = {"provider": "openai", "model": "gpt-4o-mini"}
    return [
        start("run-2026-11-18-0010", chaos={"seed": seed, "faults": [upstream_fault, net_fault]}),
        Entry("process.spawn", 2, {"pid": 8100, "argv": ["python", "agent.py"]}),
        *based(call(40, "call-0001", "gpt-4o-mini", 300, 40), OPENAI_URL),
        Entry(
            "fault.injected", 1000, {"fault": upstream_fault, "seed": seed, "target": "upstream"}
        ),
        *based(failed_call(1001, "call-0002", "gpt-4o-mini", 503, 0), OPENAI_URL),
        Entry(
            "fault.injected", 1100, {"fault": upstream_fault, "seed": seed, "target": "upstream"}
        ),
        *based(failed_call(1101, "call-0003", "gpt-4o-mini", 503, 0), OPENAI_URL),
        Entry(
            "breaker.state",
            1142,
            {
                "upstream": "openai",
                "from": "closed",
                "to": "open",
                "reason": "consecutive_failures",
            },
        ),
        Entry(
            "x-docket.breaker-open",
            1150,
            {"rule": "resilience.breaker", **guard, "upstream": "openai", "state": "open"},
        ),
        Entry(
            "breaker.state",
            1450,
            {"upstream": "openai", "from": "open", "to": "half_open", "reason": "cooldown_elapsed"},
        ),
        *based(call(1451, "call-0004", "gpt-4o-mini", 310, 42), OPENAI_URL),
        Entry(
            "breaker.state",
            2400,
            {"upstream": "openai", "from": "half_open", "to": "closed", "reason": "probe_ok"},
        ),
        Entry(
            "x-docket.rate-limited",
            2410,
            {"rule": "resilience.max_calls_per_second", **guard, "limit": "max_calls_per_second"},
        ),
        Entry(
            "x-docket.rate-limited",
            2411,
            {"rule": "resilience.max_calls_per_second", **guard, "limit": "max_calls_per_second"},
        ),
        Entry(
            "load.shed",
            2420,
            {"rule": "resilience.max_queue", **guard, "upstream": "openai", "reason": "queue_full"},
        ),
        # a fault written before fault.injected carried its target: the text names it
        Entry("fault.injected", 2500, {"fault": net_fault, "seed": seed}),
        *based(call(2501, "call-0005", "claude-sonnet-4", 800, 120), ANTHROPIC_URL),
        Entry(
            "net.denied",
            3800,
            {"host": "example.net", "port": 443, "method": "CONNECT", "rule": "egress.policy"},
        ),
        Entry(
            "policy.denied",
            3900,
            {"rule": "caps.max_usd", "provider": "anthropic", "model": "claude-sonnet-4"},
        ),
        Entry("policy.denied", 3901, {"rule": "auth", "provider": "openai", "model": ""}),
        Entry("policy.denied", 3902, {"provider": "openai", "model": "gpt-4o"}),  # no rule named
        Entry("signal.forwarded", 4000, {"pgid": 8100, "signal": "SIGTERM"}),
        Entry("process.exit", 4100, {"pid": 8100, "status": -15, "reason": "signal SIGTERM"}),
        Entry(
            "session.end",
            4101,
            {
                "reason": "ledger full (max_events)",
                "exit_status": 42,
                "cap": "max_events",
                "evidence": COMPLETE,
                "refused_unrecorded": {"ledger": 2},
            },
        ),
    ]


def refusal_vectors(v: Vectors) -> None:
    """Section 6.5's vectors: a receipt that states every refusal by rule, the breaker's
    transitions, the faults' layers and the endpoints; the same receipt from before those
    claims; and each count tampered."""
    led = chain(refusal_run())
    receipt = receipt_for(led, COMPLETE, section_6_5=True)
    v.ok(
        "ok-refusals-by-rule",
        "refusals by rule (caps, auth, policy, egress, rate_limit, breaker, load_shed, ledger), "
        "a breaker's full cycle, faults on two layers, two providers at their base URLs",
        led,
        receipt,
    )
    unclaimed = copy.deepcopy(receipt)
    for parent, member in OPTIONAL_CLAIMS:
        del unclaimed[parent][member]
    v.add(
        "ok-refusals-unclaimed",
        "ok-refusals-by-rule's ledger, its receipt as Docket wrote it before section 6.5: "
        "the claims it does not make are not compared",
        ledger=None,
        receipt=unclaimed,
        ledger_arg="ok-refusals-by-rule/ledger.jsonl",
        verdict="ok",
        figures=led,
    )

    def tampered(name: str, description: str, change, code: str, field: str) -> None:
        forged = copy.deepcopy(receipt)
        change(forged)
        v.fail(
            name,
            f"as ok-refusals-by-rule, with {description}",
            None,
            forged,
            code,
            ledger_arg="ok-refusals-by-rule/ledger.jsonl",
            field=field,
        )

    def setter(*path: str, value: object):
        def change(r: dict) -> None:
            node = r
            for key in path[:-1]:
                node = node[key]
            if value is None:
                del node[path[-1]]
            else:
                node[path[-1]] = value

        return change

    rules = receipt["totals"]["refused_by_rule"]
    assert rules == REFUSED_BY_RULE, rules
    tampered(
        "refusals-rate-limit-lowered",
        "totals.refused_by_rule.rate_limit said to be 1",
        setter("totals", "refused_by_rule", "rate_limit", value=1),
        "total_mismatch",
        "totals.refused_by_rule.rate_limit",
    )
    tampered(
        "refusals-breaker-raised",
        "totals.refused_by_rule.breaker said to be 2",
        setter("totals", "refused_by_rule", "breaker", value=2),
        "total_mismatch",
        "totals.refused_by_rule.breaker",
    )
    tampered(
        "refusals-load-shed-hidden",
        "totals.refused_by_rule.load_shed removed",
        setter("totals", "refused_by_rule", "load_shed", value=None),
        "total_mismatch",
        "totals.refused_by_rule.load_shed",
    )
    tampered(
        "refusals-ledger-hidden",
        "totals.refused_by_rule.ledger (session.end's refused_unrecorded) removed",
        setter("totals", "refused_by_rule", "ledger", value=None),
        "total_mismatch",
        "totals.refused_by_rule.ledger",
    )
    tampered(
        "refusals-egress-lowered",
        "totals.refused_by_rule.egress said to be 0",
        setter("totals", "refused_by_rule", "egress", value=0),
        "total_mismatch",
        "totals.refused_by_rule.egress",
    )
    tampered(
        "refusals-caps-moved",
        "the caps refusal counted under policy instead (caps removed, policy 2)",
        lambda r: (
            setter("totals", "refused_by_rule", "caps", value=None)(r),
            setter("totals", "refused_by_rule", "policy", value=2)(r),
        ),
        "total_mismatch",
        "totals.refused_by_rule.caps",
    )
    tampered(
        "refusals-malformed",
        "totals.refused_by_rule.rate_limit a string",
        setter("totals", "refused_by_rule", "rate_limit", value="2"),
        "receipt_malformed",
        "totals.refused_by_rule.rate_limit",
    )
    tampered(
        "breaker-transition-lowered",
        "the breaker's recovery (half_open to closed) said to be 0",
        setter("totals", "breaker_transitions", "openai", "half_open", "closed", value=0),
        "total_mismatch",
        "totals.breaker_transitions.openai.half_open.closed",
    )
    tampered(
        "breaker-transition-hidden",
        "the breaker's open to half_open transition removed",
        setter("totals", "breaker_transitions", "openai", "open", value=None),
        "total_mismatch",
        "totals.breaker_transitions.openai.open",
    )
    tampered(
        "fault-layer-lowered",
        "faults.by_layer.upstream said to be 1",
        setter("faults", "by_layer", "upstream", value=1),
        "faults_mismatch",
        "faults.by_layer.upstream",
    )
    tampered(
        "fault-layer-hidden",
        "faults.by_layer.net (a fault whose event names no target) removed",
        setter("faults", "by_layer", "net", value=None),
        "faults_mismatch",
        "faults.by_layer.net",
    )
    tampered(
        "provider-calls-raised",
        "totals.by_provider.anthropic.model_calls said to be 2",
        setter("totals", "by_provider", "anthropic", "model_calls", value=2),
        "total_mismatch",
        "totals.by_provider.anthropic.model_calls",
    )
    tampered(
        "provider-refused-lowered",
        "totals.by_provider.openai.refused said to be 1",
        setter("totals", "by_provider", "openai", "refused", value=1),
        "total_mismatch",
        "totals.by_provider.openai.refused",
    )
    tampered(
        "upstream-errors-lowered",
        f"totals.by_upstream[{OPENAI_URL!r}].errors said to be 1",
        setter("totals", "by_upstream", OPENAI_URL, "errors", value=1),
        "total_mismatch",
        f'totals.by_upstream["{OPENAI_URL}"].errors',
    )

    def renamed(r: dict) -> None:
        ups = r["totals"]["by_upstream"]
        ups["https://api.anthropic.example"] = ups.pop(ANTHROPIC_URL)

    tampered(
        "upstream-renamed",
        "the anthropic calls said to have gone to https://api.anthropic.example",
        renamed,
        "total_mismatch",
        f'totals.by_upstream["{ANTHROPIC_URL}"]',
    )

    # a forger's ledger: one event's member of the wrong type, re-chained, receipt re-pointed
    entries = refusal_run()
    for name, at, kind, changes, what in (
        ("policy-denied-rule-not-string", 24, "policy.denied", {"rule": 7}, "rule a number"),
        ("breaker-state-to-missing", 10, "breaker.state", {"to": None}, "no to"),
        ("fault-target-not-string", 4, "fault.injected", {"target": ["upstream"]}, "target a list"),
        (
            "refused-unrecorded-not-integer",
            len(entries) - 1,
            "session.end",
            {"refused_unrecorded": {"ledger": "2"}},
            "refused_unrecorded.ledger a string",
        ),
        (
            "request-base-url-not-string",
            2,
            "model.request",
            {"base_url": 443},
            "base_url a number",
        ),
    ):
        assert entries[at].type == kind, (name, entries[at].type)
        v.rechained(
            name,
            f"{what} in the {kind} at seq {at} (re-chained, receipt re-pointed)",
            chain(with_fields(entries, at, changes)),
            receipt,
            seq=at,
        )


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else HERE
    make(out)
    print(f"wrote {out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
