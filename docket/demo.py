"""`docket demo`: record a small run, verify its receipt, flip one byte, watch verify name it.

The main job until the game day exists. It uses the same writer, tally, receipt
and verifier as a real run; the model calls are described, not made, so it
needs no network and no keys.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import trio

from docket import __version__
from docket.clock import Clock

CALLS = [  # (model, input tokens, cached, output tokens)
    ("gpt-4o-mini", 1200, 0, 310),
    ("gpt-4o-mini", 1850, 1024, 280),
    ("gpt-4o", 2400, 0, 650),
    ("gpt-4o-mini", 900, 512, 120),
]


async def record_run(folder: Path) -> tuple[Path, Path]:
    from docket.ledger.writer import open_ledger
    from docket.pricing import load_price_table
    from docket.receipt import build_receipt, write_receipt
    from docket.tally import Tally

    prices = load_price_table()
    ledger_path = folder / "ledger.jsonl"
    tally = Tally()
    clock = Clock()
    async with open_ledger(ledger_path, clock=clock, observers=[tally.add]) as ledger:
        await ledger.append(
            "session.start",
            run_id="demo",
            docket_version=__version__,
            policy_digest="sha256:" + "0" * 64,
            pricing={"table_date": prices.date, "provenance": prices.provenance},
            caps={"max_usd": "1.00"},
        )
        await ledger.append("process.spawn", pid=0, argv=["(demo: no process)"])
        for n, (model, inp, cached, out) in enumerate(CALLS):
            call = f"c{n}"
            await ledger.append(
                "model.request",
                call_id=call,
                provider="openai",
                model=model,
                endpoint="chat.completions",
                stream=False,
                request_bytes=inp * 4,
                request_sha256="0" * 64,
                max_output_tokens=1024,
            )
            price = prices.lookup(model)
            cost = price.cost_nusd(inp, out, cached, cached_is_subset=True)
            await ledger.append(
                "model.response",
                call_id=call,
                provider="openai",
                model=model,
                status=200,
                usage={"input_tokens": inp, "output_tokens": out, "cached_tokens": cached},
                cost_nusd=cost,
                priced=True,
                unit_prices=price.as_strings(),
                duration_ms=400 + 37 * n,
                ttfb_ms=180,
                bytes=out * 5,
            )
        await ledger.append("process.exit", pid=0, status=0, reason="exited")
        await ledger.append(
            "session.end",
            reason="child exited",
            exit_status=0,
            cap=None,
            evidence=ledger.stats.as_dict(),
        )
        evidence, head, count = ledger.stats.as_dict(), ledger.head, ledger.count
    receipt = build_receipt(
        tally,
        ledger_path=ledger_path,
        head=head,
        count=count,
        size=ledger_path.stat().st_size,
        evidence=evidence,
        version=__version__,
    )
    receipt_path = folder / "receipt.json"
    write_receipt(receipt_path, receipt)
    return ledger_path, receipt_path


def flip_one_byte(ledger: Path) -> int:
    """Change one digit of the first response's byte count; return the byte offset."""
    data = bytearray(ledger.read_bytes())
    lines = bytes(data).split(b"\n")
    n = next(i for i, line in enumerate(lines) if b'"type":"model.response"' in line)
    start = sum(len(x) + 1 for x in lines[:n])
    at = start + lines[n].rindex(b'"bytes":') + len(b'"bytes":')
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    ledger.write_bytes(bytes(data))
    return at


def demo_command(directory: str | None) -> int:
    from rich.console import Console

    from docket.receipt import verify

    console = Console(highlight=False, soft_wrap=True)
    folder = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="docket-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    ledger, receipt = trio.run(record_run, folder)
    console.print(f"[bold]1. recorded[/] {ledger} and {receipt}")
    first = verify(receipt, ledger)
    console.print(f"[bold]2. docket verify[/] -> {first.summary()}")
    tampered = folder / "ledger-tampered.jsonl"
    shutil.copyfile(ledger, tampered)
    at = flip_one_byte(tampered)
    console.print(f"[bold]3. flipped one byte[/] of a copy at offset {at}: {tampered}")
    second = verify(receipt, tampered)
    console.print(f"[bold]4. docket verify --ledger {tampered.name}[/] -> {second.summary()}")
    if first.ok and not second.ok:
        console.print(
            "[green]the receipt holds for the real ledger and names the break in the copy[/]"
        )
        return 0
    console.print("[red]demo failed: verify did not behave as expected[/]")
    return 1
