"""Real ledgers for the reading commands' tests, written by the real Ledger writer.

A `Script` is a run told as events with the time between them; `write` appends
them through open_ledger on a FakeClock, so seq, mono_ms, the chain and the
fsyncs are the recorder's own, not a test's imitation.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import trio

from docket.clock import FakeClock
from docket.ledger.writer import open_ledger

PRICES = {"gpt-4o-mini": ("0.15", "0.075", "0.60"), "gpt-4o": ("2.50", "1.25", "10.00")}
PROVIDER_OF = {
    "gpt-4o-mini": "openai",
    "gpt-4o": "openai",
    "claude-3-5-haiku-20241022": "anthropic",
}


def _cost(model: str, tokens_in: int, tokens_out: int) -> int:
    inp, _, out = PRICES.get(model, ("1.00", "1.00", "1.00"))
    return tokens_in * int(float(inp) * 1000) + tokens_out * int(float(out) * 1000)


class Script:
    """Events of one run, in order, each after `after_ms` of the fake clock."""

    def __init__(self, run_id: str = "run-1", table_date: str = "2026-11-29") -> None:
        self.steps: list[tuple[int, str, dict]] = []
        self.calls = 0
        self.add(
            0,
            "session.start",
            run_id=run_id,
            docket_version="0.1.0",
            policy_digest="sha256:" + "0" * 64,
            pricing={"table_date": table_date, "provenance": "test"},
            caps={"max_usd": None},
        )

    def add(self, after_ms: int, type: str, **fields: object) -> Script:
        self.steps.append((after_ms, type, fields))
        return self

    def call(
        self,
        *,
        after_ms: int = 10,
        took_ms: int = 5,
        model: str = "gpt-4o-mini",
        provider: str | None = None,
        body: str | None = None,
        request_bytes: int | None = None,
        tokens_in: int = 7,
        tokens_out: int = 16,
        cached: int = 0,
        fail: str | None = None,
        status: int = 200,
        retry_after: str | None = None,
        client_attempt: int | None = None,
        prices: tuple[str, str, str] | None = None,
    ) -> Script:
        """One forwarded call: its model.request, then its response (or error `fail`)."""
        self.calls += 1
        call_id = f"c-{self.calls}"
        provider = provider or PROVIDER_OF.get(model, "openai")
        body = body if body is not None else f"call {self.calls}"
        request = {
            "call_id": call_id,
            "provider": provider,
            "model": model,
            "endpoint": "chat.completions",
            "stream": False,
            "request_bytes": request_bytes if request_bytes is not None else 100 + len(body),
            "request_sha256": hashlib.sha256(body.encode()).hexdigest(),
            "max_output_tokens": 64,
        }
        if client_attempt is not None:
            request["client_attempt"] = client_attempt
            request["client_ids"] = {"x-stainless-retry-count": str(client_attempt)}
        self.add(after_ms, "model.request", **request)
        usage = {"input_tokens": tokens_in, "output_tokens": tokens_out, "cached_tokens": cached}
        common = {"call_id": call_id, "provider": provider, "model": model}
        if fail is None:
            inp, cin, out = prices or PRICES.get(model, ("1.00", "1.00", "1.00"))
            self.add(
                took_ms,
                "model.response",
                **common,
                status=status,
                usage=usage,
                cost_nusd=_cost(model, tokens_in, tokens_out)
                if prices is None
                else tokens_in * int(float(inp) * 1000) + tokens_out * int(float(out) * 1000),
                priced=True,
                unit_prices={"input": inp, "cached_input": cin, "output": out},
                duration_ms=took_ms,
            )
        else:
            error = {"reason": fail, "status": status, "usage": {}, "cost_nusd": 0}
            if retry_after is not None:
                error["retry_after"] = retry_after
            self.add(took_ms, "model.error", **common, **error)
        return self

    def refusal(
        self, kind: str, *, after_ms: int = 1, provider: str = "openai", **fields
    ) -> Script:
        rules = {
            "x-docket.rate-limited": "resilience.max_calls_per_second",
            "x-docket.breaker-open": "resilience.breaker",
            "load.shed": "resilience.max_queue",
            "policy.denied": "caps.max_usd",
        }
        fields.setdefault("rule", rules.get(kind, kind))
        return self.add(after_ms, kind, provider=provider, model="gpt-4o-mini", **fields)

    def end(self, *, after_ms: int = 5, reason: str = "child exited with status 0", cap=None):
        evidence = {
            "ledger_complete": True,
            "unwritten_events": 0,
            "first_failing_seq": None,
            "write_failures": 0,
        }
        status = 42 if cap else 0
        return self.add(
            after_ms, "session.end", reason=reason, exit_status=status, cap=cap, evidence=evidence
        )

    def write(self, path: Path) -> Path:
        async def main() -> None:
            clock = FakeClock()
            async with open_ledger(path, clock=clock) as ledger:
                for after_ms, type, fields in self.steps:
                    clock.advance(after_ms / 1000)
                    await ledger.append(type, **fields)

        trio.run(main)
        return path


def slow_write(path: str, calls: int, gap_s: float, end: bool = True) -> None:
    """A run as a real process writes it: the real clock, `gap_s` between calls (for
    show --follow's test, run in a child process)."""
    script = Script()
    for _ in range(calls):
        script.call()
    if end:
        script.end()

    async def main() -> None:
        async with open_ledger(Path(path)) as ledger:
            for _, type, fields in script.steps:
                if type == "model.request":
                    await trio.sleep(gap_s)
                await ledger.append(type, **fields)
            if not end:
                await trio.sleep_forever()  # a run that is still going: the test stops it

    trio.run(main)


def seal(ledger: Path) -> Path:
    """Write receipt.json beside a finished ledger, as the recorder does at a run's end."""
    from docket.receipts.receipt import build_receipt, write_receipt
    from docket.receipts.verify import scan_ledger

    scan = scan_ledger(ledger)
    assert scan.chain_error is None and scan.tally.end is not None
    receipt = build_receipt(
        scan.tally,
        ledger_path=ledger,
        head=scan.head,
        count=scan.events,
        size=scan.size,
        evidence=scan.tally.end["evidence"],
        version="0.1.0",
    )
    path = ledger.parent / "receipt.json"
    write_receipt(path, receipt)
    return path


def bulk(path: Path, calls: int) -> Path:
    """A long, valid ledger fast (encode_line, no fsync): `calls` answered calls, each
    with a ~1 KB request record, for size-dependence tests."""
    from docket.ledger.chain import GENESIS, encode_body, encode_line, line_hash

    script = Script()
    prev, seq = GENESIS, 0
    pad = "x" * 700
    with open(path, "wb") as f:

        def put(type: str, fields: dict) -> None:
            nonlocal prev, seq
            line = encode_line(
                seq=seq,
                ts="2026-12-01T00:00:00.000Z",
                mono_ms=seq,
                type=type,
                prev=prev,
                body=encode_body(fields),
            )
            f.write(line + b"\n")
            prev, seq = line_hash(line), seq + 1

        put(*script.steps[0][1:])
        for i in range(calls):
            script.steps = []
            script.call(body=f"bulk {i}")
            (_, t1, f1), (_, t2, f2) = script.steps
            put(t1, {**f1, "note": pad})
            put(t2, f2)
        script.steps = []
        script.end()
        put(*script.steps[0][1:])
    return path
