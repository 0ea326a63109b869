"""Family `mutations`: ledger and receipt edits, each handed to `docket verify`.

A baseline comes from a real supervised run (a stub, the reference agent in a
loop, a call cap so that warnings, breaches and refusals are in the record).
`mutations(ledger, receipt, seed)` then makes seeded, deterministic edits: byte
flips, line deletes, duplicates, swaps, truncations (anywhere, and at a line
boundary), appended lines, forged lines re-chained so the chain itself holds
(with and without the receipt's head, events and bytes updated to match), and
receipt field edits (every kind of leaf, deletions, additions). Good: verify
refuses the pair (exit 1, or 2 for a receipt no longer readable as one), never
ok and never an internal error. A fully consistent forgery (ledger re-chained
and every receipt claim re-derived, or an event no claim is derived from
deleted and the chain rebuilt) is out of scope: without a signature nothing can
tell it from a real run (docs/resilience.md says so).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from chaos.attack import Figures
from chaos.attack.rig import DOCKET, KEY_ENV, run_env, stub
from docket.cli import main

DETECTED = (1, 2)  # verify's "a check failed" and "this is not a receipt"
_PREV = re.compile(rb'"prev":"([0-9a-f]{64})"')
_SEQ = re.compile(rb'"seq":(\d+)')
_TYPE = re.compile(rb'"type":"([a-z.-]+)"')
# Events a receipt claim is derived from: deleting one changes a claim, so a forger who
# re-chains the ledger and updates head, events and bytes is still caught. Deleting any
# other event (process.spawn, net.connect, ...) that way is the consistent forgery
# nothing unsigned can catch (the module docstring).
CLAIMED_TYPES = frozenset({"session.start", "session.end", "model.request", "model.response",
                           "model.error", "cap.warning", "cap.exceeded", "fault.injected",
                           "evidence.gap"})  # fmt: skip
_NUMBER = re.compile(rb'"(input_tokens|output_tokens|cached_input_tokens|usd|cost_usd)":(\d+)')


@dataclass(frozen=True)
class Mutation:
    name: str  # says what was changed, where: enough to redo it by hand
    ledger: bytes
    receipt: bytes


def _lines(ledger: bytes) -> list[bytes]:
    return ledger.splitlines(keepends=True)


def rechain(lines: list[bytes], start: int) -> list[bytes]:
    """Set each line's prev, from `start` on, to the hash of the line before it, so
    the chain holds again after an edit (what a forger with no key can do)."""
    out = list(lines)
    for i in range(max(start, 1), len(out)):
        prev = hashlib.sha256(out[i - 1].rstrip(b"\n")).hexdigest().encode()
        out[i] = _PREV.sub(b'"prev":"' + prev + b'"', out[i], count=1)
    return out


def _renumber(lines: list[bytes]) -> list[bytes]:
    return [_SEQ.sub(b'"seq":%d' % i, line, count=1) for i, line in enumerate(lines)]


def _with_ledger_claims(receipt: dict, ledger: bytes) -> bytes:
    """The receipt with its head, events and bytes matching `ledger` (a forger's update)."""
    forged = json.loads(json.dumps(receipt))
    lines = _lines(ledger)
    forged["ledger"]["head"] = hashlib.sha256(lines[-1].rstrip(b"\n")).hexdigest()
    forged["ledger"]["events"] = len(lines)
    forged["ledger"]["bytes"] = len(ledger)
    return _dump(forged)


def _dump(receipt: dict) -> bytes:
    return (json.dumps(receipt, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _leaves(value, path=()) -> Iterator[tuple]:
    if isinstance(value, dict):
        for key, member in value.items():
            yield from _leaves(member, (*path, key))
        if not value:
            yield path
    elif isinstance(value, list):
        for i, member in enumerate(value):
            yield from _leaves(member, (*path, i))
        if not value:
            yield path
    else:
        yield path


def _get(obj, path):
    for key in path:
        obj = obj[key]
    return obj


def _changed(value, rng: random.Random):
    """A different value of a leaf: the small edits a forger would make."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([1, -1, 1000])
    if isinstance(value, float):
        return value * 1.5 + 1
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1:] != "0" else "1") if value else "x"
    if value is None:
        return 0
    if isinstance(value, list):
        return [0]
    return {"x": 1}  # an empty object


def _receipt_edit(receipt: dict, rng: random.Random) -> tuple[str, bytes]:
    edited = json.loads(json.dumps(receipt))
    paths = sorted(_leaves(edited), key=repr)
    path = rng.choice(paths)
    how = rng.choice(["change", "change", "change", "delete", "add"])
    where = ".".join(map(str, path)) or "(root)"
    if how == "add" or not path:
        parent = _get(edited, path[:-1]) if path else edited
        if not isinstance(parent, dict):
            parent = edited
        parent["x_forged"] = 1
        return f"receipt: add field x_forged beside {where}", _dump(edited)
    parent = _get(edited, path[:-1])
    old = parent[path[-1]]
    if how == "delete":
        del parent[path[-1]]
        return f"receipt: delete {where}", _dump(edited)
    parent[path[-1]] = new = _changed(old, rng)
    return f"receipt: {where} {json.dumps(old)} -> {json.dumps(new)}", _dump(edited)


def mutations(ledger: bytes, receipt: dict, seed: int, count: int) -> list[Mutation]:
    """`count` seeded edits of the pair; the same arguments give the same list."""
    rng = random.Random(seed)
    original = _dump(receipt)
    lines = _lines(ledger)
    out: list[Mutation] = []
    kinds = ["flip", "delete", "duplicate", "swap", "truncate", "cut_lines", "append",
             "forge", "forge_with_receipt", "forge_delete", "receipt", "receipt",
             "receipt_bytes"]  # fmt: skip
    while len(out) < count:
        kind = kinds[len(out) % len(kinds)]
        i = rng.randrange(len(lines))
        if kind == "flip":
            at, mask = rng.randrange(len(ledger)), rng.randrange(1, 256)
            flipped = bytearray(ledger)
            flipped[at] ^= mask
            out.append(Mutation(f"ledger: byte {at} xor {mask:#04x}", bytes(flipped), original))
        elif kind == "delete":
            out.append(Mutation(f"ledger: delete line {i}", b"".join(lines[:i] + lines[i + 1 :]),
                                original))  # fmt: skip
        elif kind == "duplicate":
            out.append(Mutation(f"ledger: duplicate line {i}",
                                b"".join(lines[: i + 1] + lines[i:]), original))  # fmt: skip
        elif kind == "swap":
            j = rng.randrange(len(lines))
            if i == j:
                j = (i + 1) % len(lines)
            swapped = list(lines)
            swapped[i], swapped[j] = swapped[j], swapped[i]
            out.append(Mutation(f"ledger: swap lines {i} and {j}", b"".join(swapped), original))
        elif kind == "truncate":
            at = rng.randrange(len(ledger))
            out.append(Mutation(f"ledger: truncate to {at} bytes", ledger[:at], original))
        elif kind == "cut_lines":
            k = rng.randrange(1, len(lines))
            out.append(Mutation(f"ledger: drop the last {k} lines", b"".join(lines[:-k]),
                                original))  # fmt: skip
        elif kind == "append":
            extra = lines[-1] if rng.random() < 0.5 else b'{"v":1}\n'
            out.append(Mutation(f"ledger: append {extra[:40]!r}...", ledger + extra, original))
        elif kind in ("forge", "forge_with_receipt"):
            forged = _forge_number(lines, rng)
            if forged is None:
                continue
            what, new_lines = forged
            data = b"".join(new_lines)
            if kind == "forge":
                out.append(Mutation(f"ledger: {what}, re-chained", data, original))
            else:
                out.append(Mutation(f"ledger: {what}, re-chained, receipt head/events/bytes "
                                    "updated", data, _with_ledger_claims(receipt, data)))  # fmt: skip
        elif kind == "forge_delete":
            claimed = [n for n, line in enumerate(lines) if n and _type(line) in CLAIMED_TYPES]
            i = rng.choice(claimed)
            new_lines = rechain(_renumber(lines[:i] + lines[i + 1 :]), i)
            data = b"".join(new_lines)
            out.append(Mutation(f"ledger: delete line {i}, renumber, re-chain, receipt "
                                "head/events/bytes updated", data,
                                _with_ledger_claims(receipt, data)))  # fmt: skip
        elif kind == "receipt":
            what, edited = _receipt_edit(receipt, rng)
            out.append(Mutation(what, ledger, edited))
        else:  # a byte of the receipt file itself (its JSON text)
            at, mask = rng.randrange(len(original)), rng.randrange(1, 256)
            flipped = bytearray(original)
            flipped[at] ^= mask
            if _same_json(bytes(flipped), receipt):
                continue  # whitespace for whitespace: the same receipt, not an edit
            out.append(Mutation(f"receipt: byte {at} xor {mask:#04x}", ledger, bytes(flipped)))
    return out


def _type(line: bytes) -> str:
    match = _TYPE.search(line)
    return match.group(1).decode() if match else ""


def _same_json(data: bytes, receipt: dict) -> bool:
    try:
        return json.loads(data) == receipt
    except ValueError:
        return False


def _forge_number(lines: list[bytes], rng: random.Random):
    """Change one usage or price number in a line; (what, lines re-chained) or None."""
    candidates = [(n, m) for n, line in enumerate(lines) for m in _NUMBER.finditer(line)]
    if not candidates:
        return None
    n, match = rng.choice(candidates)
    new = int(match.group(2)) + rng.choice([1, 7, 100])
    line = lines[n][: match.start(2)] + str(new).encode() + lines[n][match.end(2) :]
    edited = [*lines[:n], line, *lines[n + 1 :]]
    name = match.group(1).decode()
    return f"line {n} {name} {match.group(2).decode()} -> {new}", rechain(edited, n + 1)


def verify_in_process(receipt: Path) -> tuple[int, str]:
    """`docket verify RECEIPT` through the CLI's own entry point, in this process
    (the same code path as the command, minus an interpreter start per probe)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["verify", str(receipt)])
    said = (err.getvalue() or out.getvalue()).strip().splitlines()
    return code, said[-1] if said else ""


def verify_process(receipt: Path) -> int:
    return subprocess.run(
        [*DOCKET, "verify", str(receipt)], capture_output=True, timeout=60, check=False
    ).returncode


def baseline(folder: Path) -> tuple[bytes, dict, Path]:
    """A real run's ledger and receipt: stub, reference agent, a call cap that bites."""
    folder.mkdir(parents=True, exist_ok=True)
    with stub(folder) as url:
        policy = folder / "baseline.toml"
        policy.write_text(
            f'[providers.openai]\nkind = "openai"\nbase_url = "{url}"\nkey_env = "{KEY_ENV}"\n'
            '[caps]\nmax_model_calls = 4\non_breach = "deny"\n'
        )
        run_dir = folder / "baseline"
        subprocess.run(
            [*DOCKET, "run", "--policy", str(policy), "--ledger-dir", str(run_dir), "--",
             *DOCKET, "agent", "--mode", "loop", "--calls", "6"],
            capture_output=True, timeout=120, check=False, env=run_env(),
        )  # fmt: skip
    receipt_path = run_dir / "receipt.json"
    receipt = json.loads(receipt_path.read_text())
    return (run_dir / receipt["ledger"]["file"]).read_bytes(), receipt, run_dir


def run(folder: Path, quick: bool, *, seed: int = 20261201) -> Figures:
    figures = Figures("mutations")
    ledger, receipt, run_dir = baseline(folder / "mutations")
    code, said = verify_in_process(run_dir / "receipt.json")
    if code != 0:
        raise RuntimeError(f"the baseline does not verify ({code}): {said}")
    count, crosscheck = (300, 3) if quick else (2000, 20)
    work = folder / "mutations" / "pair"
    work.mkdir()
    ledger_name = receipt["ledger"]["file"]
    by_code: dict[int, int] = {}
    for n, mutation in enumerate(mutations(ledger, receipt, seed, count)):
        (work / ledger_name).write_bytes(mutation.ledger)
        (work / "receipt.json").write_bytes(mutation.receipt)
        code, said = verify_in_process(work / "receipt.json")
        if n < crosscheck:  # the real command must agree with the in-process one
            real = verify_process(work / "receipt.json")
            if real != code:
                figures.failures.append(f"mutation {n}: in-process verify {code}, command {real}")
        by_code[code] = by_code.get(code, 0) + 1
        figures.add(
            code in DETECTED,
            f"mutations seed={seed} #{n}: {mutation.name} -> docket verify exit {code}: {said}",
        )
    shutil.rmtree(work)
    figures.extra = {"seed": seed, "verify_exit_codes": dict(sorted(by_code.items()))}
    return figures
