"""`docket demo`: a real supervised run against a stub provider, then its evidence checked.

A tour of the recorder alone (the game day is the main job). A stub provider and the reference agent
run as real processes through the CLI, as a user would run them; the boundary
records every call, a cap stops the runaway loop, `docket verify` accepts the
receipt, names a flipped byte in a copy of the ledger, and `docket doctor`
classifies a copy cut short. No network, no keys.

`record_run` writes a small ledger and receipt without processes (used by tests
that need a valid pair quickly).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from docket import __version__
from docket.clock import Clock
from docket.errors import DocketError, InputError
from docket.ledger.doctor import classify
from docket.ledger.writer import open_ledger
from docket.pricing import load_price_table
from docket.receipts.receipt import build_receipt, write_receipt
from docket.receipts.tally import Tally
from docket.receipts.verify import verify

CALLS = [  # (model, input tokens, cached, output tokens)
    ("gpt-4o-mini", 1200, 0, 310),
    ("gpt-4o-mini", 1850, 1024, 280),
    ("gpt-4o", 2400, 0, 650),
    ("gpt-4o-mini", 900, 512, 120),
]


async def record_run(folder: Path) -> tuple[Path, Path]:
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
            # CALLS names only models in the table shipped with Docket, loaded above.
            assert price is not None, model
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


def start_stub(folder: Path) -> tuple[subprocess.Popen, str]:
    """`docket stub` in its own process, through the CLI, as a user would run it."""
    log = open(folder / "stub.out", "w+b")  # noqa: SIM115 - closed by the caller via the process
    stub = subprocess.Popen(
        [sys.executable, "-m", "docket", "stub", "--kind", "openai", "--port", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = (folder / "stub.out").read_text(errors="replace")
        if "listening on " in text:
            return stub, text.split("listening on ", 1)[1].split()[0]
        if stub.poll() is not None:
            break
        time.sleep(0.05)  # polling a child's first line; bounded by the deadline above
    stub.kill()
    raise DocketError(f"demo: the stub provider did not start: {text.strip()[-200:]}")


def supervised_run(folder: Path, stub_url: str, console) -> tuple[int, Path, Path]:
    """`docket run` of the reference agent in loop mode, under a call cap that kills."""
    policy = folder / "docket.toml"
    policy.write_text(
        "[providers.openai]\n"
        'kind = "openai"\n'
        f'base_url = "{stub_url}"\n'
        'key_env = "DEMO_PROVIDER_KEY"\n'
        "[caps]\n"
        "max_model_calls = 6\n"
        'on_breach = "kill"\n'
    )
    run_dir = folder / "run"
    argv = [
        sys.executable,
        "-m",
        "docket",
        "run",
        "--policy",
        str(policy),
        "--ledger-dir",
        str(run_dir),
        "--",
        sys.executable,
        "-m",
        "docket",
        "agent",
        "--mode",
        "loop",
        "--calls",
        "100",
    ]
    console.print(
        "[bold]$[/] docket run --policy docket.toml -- docket agent --mode loop --calls 100"
    )
    env = dict(os.environ, DEMO_PROVIDER_KEY="sk-demo-not-a-real-key")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    for line in (done.stdout + done.stderr).strip().splitlines():
        console.print(f"  {line}")
    return done.returncode, run_dir / "ledger.jsonl", run_dir / "receipt.json"


def demo_command(directory: str | None) -> int:
    console = Console(highlight=False, soft_wrap=True)
    if directory:
        folder = Path(directory)
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner only, like a run's
        except (OSError, ValueError) as exc:  # a file is there, no permission, a NUL in the name
            reason = getattr(exc, "strerror", None) or str(exc)
            raise InputError(f"demo --dir {folder}: cannot make the folder ({reason})") from None
        return _demo(folder, console)
    # A folder of our own (0700): what it wrote is removed once shown, and where it was said.
    folder = Path(tempfile.mkdtemp(prefix="docket-demo-"))
    try:
        return _demo(folder, console)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        left = " (some of it could not be removed)" if folder.exists() else ""
        console.print(f"removed {folder}, where the demo wrote{left}; keep it with --dir DIR")


def _demo(folder: Path, console: Console) -> int:
    stub, url = start_stub(folder)
    try:
        console.print(f"[bold]1. a stub provider[/] (OpenAI-shaped) at {url}")
        status, ledger, receipt = supervised_run(folder, url, console)
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    console.print(f"[bold]2. the run ended with exit {status}[/] (42: the call cap stopped it)")
    types = [event["type"] for event in _events(ledger)]
    console.print(f"   ledger {ledger}: {len(types)} events: " + ", ".join(_runs(types)))
    first = verify(receipt, ledger)
    console.print(f"[bold]3. docket verify[/] -> {first.summary()}")
    tampered = folder / "ledger-tampered.jsonl"
    shutil.copyfile(ledger, tampered)
    at = flip_one_byte(tampered)
    second = verify(receipt, tampered)
    console.print(f"[bold]4. one byte flipped[/] at offset {at} of a copy -> {second.summary()}")
    torn = folder / "ledger-torn.jsonl"
    data = ledger.read_bytes()
    torn.write_bytes(data[: len(data) - 40])  # as if the run had been killed mid-write
    diagnosis = classify(torn)
    tail = diagnosis.tail
    console.print(
        f"[bold]5. docket doctor[/] on a copy cut 40 bytes short -> {diagnosis.verdict}"
        + (f" at byte {tail.offset}, {tail.length} bytes" if tail else "")
    )
    ok = status == 42 and first.ok and not second.ok and diagnosis.verdict == "torn_tail"
    if ok:
        console.print(
            "[green]the receipt holds for the real ledger, names the break in the "
            "tampered copy, and the torn copy is classified, not guessed at[/]"
        )
        return 0
    console.print("[red]demo failed: something did not behave as described above[/]")
    return 1


def _events(ledger: Path) -> list[dict]:
    return [json.loads(line) for line in ledger.read_bytes().splitlines()]


def _runs(types: list[str]) -> list[str]:
    """session.start, model.request x2, ... : consecutive repeats folded."""
    out: list[str] = []
    for kind, group in itertools.groupby(types):
        n = len(list(group))
        out.append(kind if n == 1 else f"{kind} x{n}")
    return out
