"""`docket show LEDGER`: one line per event, filtered, from a finished ledger or a live one.

It streams: each line is checked (docket.reading.source: the chain and the
tally's event checks, so a tampered or malformed ledger is refused where it
breaks) and printed, and nothing is kept but the chain's state, so memory does
not grow with the ledger (benchmarks/bench_show.py measures it on 100 MB).
`--follow` reads what a running writer appends, a line once its newline has
landed, until the run's session.end, the last seq of --seq, or Ctrl-C.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.text import Text

from docket.errors import EXIT_OK, InputError
from docket.ledger.chain import EVENT_TYPES
from docket.ledger.reader import MAX_LINE_BYTES
from docket.reading.source import EventReader, ledger_path, read_lines
from docket.receipts.tally import usd

# What --errors keeps: a call that failed, a call refused, a cap breached, evidence lost.
ERROR_TYPES = frozenset(
    {
        "model.error",
        "policy.denied",
        "net.denied",
        "x-docket.rate-limited",
        "x-docket.breaker-open",
        "load.shed",
        "cap.exceeded",
        "evidence.gap",
        "process.orphan",
    }
)
POLL_S = 0.1  # how often --follow looks for new bytes
_SEQ_RANGE = re.compile(r"([0-9]{1,15})?(\.\.)?([0-9]{1,15})?")


def parse_seq_range(text: str) -> tuple[int | None, int | None]:
    """`A..B`, `A..`, `..B` or `N` (inclusive) as (first, last); an InputError otherwise."""
    m = _SEQ_RANGE.fullmatch(text.strip())
    if not m or not (m.group(1) or m.group(3)) or (m.group(2) is None and m.group(3)):
        raise InputError(f"--seq {text!r}: want A..B, A.., ..B or N (whole numbers)")
    first = int(m.group(1)) if m.group(1) else None
    last = int(m.group(3)) if m.group(3) else (first if m.group(2) is None else None)
    if first is not None and last is not None and last < first:
        raise InputError(f"--seq {text!r}: the range ends before it starts")
    return first, last


def is_error(event: dict) -> bool:
    kind = event["type"]
    if kind in ERROR_TYPES:
        return True
    status = event.get("status")
    if kind == "model.response":
        return type(status) is int and status >= 400
    if kind == "process.exit":
        return status not in (0, None)
    if kind == "session.end":
        return event.get("exit_status") not in (0, None)
    return False


@dataclass(frozen=True)
class Filter:
    types: tuple[str, ...] = ()  # a type, a prefix (`model` or `model.`), or a glob (`x-docket.*`)
    providers: tuple[str, ...] = ()
    first: int | None = None
    last: int | None = None
    errors: bool = False

    def matches(self, event: dict) -> bool:
        seq = event["seq"]
        if self.first is not None and seq < self.first:
            return False
        if self.last is not None and seq > self.last:
            return False
        if self.types and not any(_type_matches(event["type"], t) for t in self.types):
            return False
        if self.providers and _who(event)[0] not in self.providers:
            return False
        return not self.errors or is_error(event)


def _type_matches(kind: str, want: str) -> bool:
    return (
        kind == want or kind.startswith(want.rstrip(".") + ".") or fnmatch.fnmatchcase(kind, want)
    )


def check_types(types: tuple[str, ...]) -> None:
    """Each --type must match some event type a ledger can hold (or be an x- extension):
    one that matches none is a typo, said with the known types, never an empty listing."""
    for want in types:
        if want.startswith("x-") or any(_type_matches(kind, want) for kind in EVENT_TYPES):
            continue
        families = sorted({kind.split(".")[0] for kind in EVENT_TYPES})
        raise InputError(
            f"--type {want!r}: no event type matches it; a type, its family or a glob "
            f"({', '.join(families)}; e.g. model.error, model, x-docket.*)"
        )


def _who(event: dict) -> tuple[str, str]:
    provider = event.get("provider", event.get("upstream"))
    model = event.get("model")
    return (
        provider if type(provider) is str else "",
        model if type(model) is str else "",
    )


def columns(event: dict) -> tuple[str, str, str, str, str, str, str]:
    """seq, time, type, provider/model, tokens, cost, status/reason: the line's columns."""
    ts = event["ts"]
    when = ts[11:23] if len(ts) >= 23 else ts
    provider, model = _who(event)
    who = f"{provider}/{model}" if model else provider
    tokens = ""
    usage = event.get("usage")
    if isinstance(usage, dict) and usage:
        tokens = f"{usage.get('input_tokens', 0)}+{usage.get('output_tokens', 0)} tok"
    cost = event.get("cost_nusd")
    money = f"${usd(cost)}" if type(cost) is int else ""
    return (str(event["seq"]), when, event["type"], who, tokens, money, _outcome(event))


def _outcome(event: dict) -> str:
    parts = []
    for key in ("status", "exit_status"):
        if type(event.get(key)) is int:
            parts.append(str(event[key]))
    for key in ("reason", "rule", "cap", "fault", "signal", "to"):
        value = event.get(key)
        if type(value) is str and value:
            parts.append(value if key != "to" else f"-> {value}")
    return " ".join(parts)


def plain_line(event: dict) -> str:
    seq, when, kind, who, tokens, money, outcome = columns(event)
    line = f"{seq:>6} {when:<12} {kind:<22} {who:<32} {tokens:<14} {money:<13} {outcome}"
    return _printable(line.rstrip())


def _printable(text: str) -> str:
    # A field from the ledger may hold anything a provider sent: no escape reaches the terminal.
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


_STYLES = {"model.response": "green", "model.request": "cyan", "session": "bold"}


def rich_printer(out: TextIO) -> Callable[[dict], None]:
    console = Console(file=out, highlight=False, soft_wrap=True)

    def show(event: dict) -> None:
        style = (
            "red"
            if is_error(event)
            else _STYLES.get(event["type"]) or _STYLES.get(event["type"].split(".")[0], "")
        )
        console.print(Text(plain_line(event), style=style))

    return show


def show_command(
    target: str, flt: Filter, *, as_json: bool, follow: bool, out: TextIO | None = None
) -> int:
    out = out or sys.stdout
    path = ledger_path(target)
    if as_json:

        def emit(line: bytes, event: dict) -> None:
            out.write(line.decode("utf-8"))
            out.write("\n")

    else:
        show = rich_printer(out) if out.isatty() else None

        def emit(line: bytes, event: dict) -> None:
            if show is not None:
                show(event)
            else:
                out.write(plain_line(event))
                out.write("\n")

    if follow:
        return _follow(path, flt, emit, out)
    for line, event in read_lines(path):
        if flt.last is not None and event["seq"] > flt.last:
            break  # seq is the line number: nothing later can match
        if flt.matches(event):
            emit(line, event)
    return EXIT_OK


def _follow(path: Path, flt: Filter, emit: Callable[[bytes, dict], None], out: TextIO) -> int:
    """Print each line as the writer completes it; return at session.end (or Ctrl-C)."""
    reader = EventReader(path)
    pending = b""
    try:
        with open(path, "rb", buffering=0) as f:
            while True:
                block = f.read(1 << 20)
                if not block:
                    if os.stat(path).st_size < reader.chain.offset + len(pending):
                        raise InputError(f"ledger {path}: shrank while it was followed")
                    out.flush()
                    time.sleep(POLL_S)
                    continue
                lines = (pending + block).split(b"\n")
                pending = lines.pop()
                if len(pending) > MAX_LINE_BYTES:
                    raise InputError(f"ledger {path}: a line longer than {MAX_LINE_BYTES} bytes")
                for line in lines:
                    event = reader.feed(line)
                    if flt.matches(event):
                        emit(line, event)
                    # the run's end, or the end of the range asked for: nothing more to wait for
                    if event["type"] == "session.end" or event["seq"] == flt.last:
                        out.flush()
                        return EXIT_OK
    except KeyboardInterrupt:
        out.flush()
        return EXIT_OK
