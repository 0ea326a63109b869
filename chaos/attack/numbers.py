"""Family `numbers`: number forms planted in receipts and ledger lines, through all three verifiers.

RFC 8259 leaves a number's size to each reader, and the three verifiers used to
read the same text three ways (a 5,000-digit integer: Python refused it, JS and
Go said ok; `1e99999999` made `docket verify --json` spin). Spec rule 2.1.7 now
bounds every number token on its text. Here a real run's pair (the `mutations`
family's baseline) gets, at seeded places, numbers past the bounds (huge integers,
huge and tiny exponents, exponents of many digits), forms of the same value
(`-0`, `50.0` for `50`, `5e1`, `500e-1`), values at the bounds (`1e300`, a
32-digit significand) and leading zeros, in a ledger line (re-chained, the
receipt's head, events and bytes updated, so only the number can be caught) or
in the receipt's text. Each case goes to `docket verify`, verify-js and verify-go
as commands. Held: the verifiers that are here agree (exit, code, seq, offset;
for ok the chain's figures), none exits 70 or prints a traceback, each answers
within RUN_BOUND_S (or, tried once more, RETRY_BOUND_S), and where the spec
decides the case (a number past the bounds is always caught; `-0` for `0` is
always the same value) they say so.
A verifier whose tool is missing is skipped, and the figures say which.
"""

from __future__ import annotations

import random
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from chaos.attack import Figures
from chaos.attack import mutations as pairs
from chaos.verifiers import Answer, Verifier, find_go, find_js, python_command

RUN_BOUND_S = 20.0  # one verification of a pair of a few KB; a spin is far past it
# A verifier that gives no answer within RUN_BOUND_S is run once more, alone in its
# thread, with this bound: on a machine this loaded (load average 290 on 2 cores was seen)
# an interpreter can take 20 s to start, while a spin once found here ran past 120 s.
RETRY_BOUND_S = 120.0
OK, DETECTED = "ok", "detected"

# A member's number value in a ledger line or the receipt's text (not inside a string:
# `":` closes a member name; the value ends at `,`, `}` or `]`, or a newline).
_MEMBER_NUMBER = re.compile(rb'(?<!\\)": ?(-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)(?=[,}\]\s])')

HUGE = "1" + "0" * 4999  # 5,000 digits

# Past rule 2.1.7 (or not JSON at all): caught wherever they are.
OUT_OF_BOUNDS = (
    HUGE,
    "-" + HUGE,
    "1" + "0" * 32,  # 33 digits
    "9" * 40,
    "0." + "0" * 32 + "1",
    "1e301",
    "10e300",
    "-1e301",
    "1e-301",
    "0.01e-299",
    "1e5000",
    "1e-5000",
    "1e99999999",
    "-1E+99999999",
    "1e9999999999999999999",
    "1e00001",
    "0e00001",
    "1.0e-9999999999999999999",
)
# Within the bounds, values other than the one replaced: agreement is what counts.
AT_BOUNDS = (
    "1e300",
    "-1e300",
    "1.5e-300",
    "0.1e-299",
    "9" * 32,
    "-" + "9" * 32,
    "99999999999999999999999999999999e268",
    "0e9999",
    "9007199254740991",
    "9007199254740992",
    "-9007199254740991",
)


def same_value_forms(text: str) -> list[str]:
    """Other texts of the same value as the integer `text` (1.0 vs 1: a type change
    where the spec reads an integer, the same value where it does not)."""
    n = int(text)
    if n == 0:
        return ["-0", "0.0", "-0.0", "0e0", "0e9999", "-0.0e-0", "0E+5"]
    forms = [f"{n}.0", f"{n}e0", f"{n}E+0", f"{n}0e-1", f"{n}.000e0"]
    digits = str(abs(n))
    sign = "-" if n < 0 else ""
    if len(digits) > 1:
        forms.append(f"{sign}{digits[0]}.{digits[1:]}e{len(digits) - 1}")
    return forms


@dataclass(frozen=True)
class NumberCase:
    what: str  # where and what was planted: enough to redo it by hand
    ledger: bytes
    receipt: bytes
    want: str | None  # OK, DETECTED, or None: the verifiers must agree, whatever they say


def _planted(rng: random.Random, old: str) -> tuple[str, str | None]:
    """A number text to put where `old` was, and what the spec says of it."""
    roll = rng.random()
    if roll < 0.45:
        return rng.choice(OUT_OF_BOUNDS), DETECTED
    if roll < 0.55:
        return "0" + old.lstrip("-"), DETECTED  # a leading zero: not JSON
    if roll < 0.8 and re.fullmatch(r"-?[0-9]+", old):
        if old == "0" and rng.random() < 0.5:
            return "-0", OK  # -0 is 0, in every member
        return rng.choice(same_value_forms(old)), None
    return rng.choice(AT_BOUNDS), None


def number_cases(ledger: bytes, receipt: dict, seed: int, count: int) -> list[NumberCase]:
    """`count` seeded number plantings in the pair; the same arguments give the same list."""
    rng = random.Random(seed)
    original = pairs._dump(receipt)
    lines = ledger.splitlines(keepends=True)
    spots = [(n, m.span(1)) for n, line in enumerate(lines) for m in _MEMBER_NUMBER.finditer(line)]
    in_receipt = [m.span(1) for m in _MEMBER_NUMBER.finditer(original)]
    out: list[NumberCase] = []
    while len(out) < count:
        if rng.random() < 0.5 and spots:
            n, (a, b) = rng.choice(spots)
            old = lines[n][a:b].decode()
            new, want = _planted(rng, old)
            edited = [*lines[:n], lines[n][:a] + new.encode() + lines[n][b:], *lines[n + 1 :]]
            data = b"".join(pairs.rechain(edited, n + 1))
            what = f"ledger line {n}: {old} -> {new[:40]}{'...' if len(new) > 40 else ''}"
            out.append(NumberCase(f"{what}, re-chained, receipt head/events/bytes updated",
                                  data, pairs._with_ledger_claims(receipt, data), want))  # fmt: skip
        elif in_receipt:
            a, b = rng.choice(in_receipt)
            old = original[a:b].decode()
            new, want = _planted(rng, old)
            what = f"receipt byte {a}: {old} -> {new[:40]}{'...' if len(new) > 40 else ''}"
            out.append(NumberCase(what, ledger, original[:a] + new.encode() + original[b:], want))
    return out


def _verifiers(build: Path) -> tuple[list[Verifier], list[str]]:
    found = [python_command(sys.executable), find_js(), find_go(build_dir=build)]
    skipped = [f"{v.name}: {v.absent}" for v in found if v.absent]
    broken = [v for v in found if v.broken]
    if broken:
        raise RuntimeError("; ".join(f"{v.name} cannot run: {v.broken}" for v in broken))
    return [v for v in found if v.runnable], skipped


def _timed(v: Verifier, receipt: Path) -> tuple[Answer, float, bool]:
    """The answer, the seconds it took, and whether it took a second try (see RETRY_BOUND_S)."""
    started = time.monotonic()
    answer = v.run(receipt, timeout_s=RUN_BOUND_S)
    if answer.exit is not None:
        return answer, time.monotonic() - started, False
    started = time.monotonic()
    answer = v.run(receipt, timeout_s=RETRY_BOUND_S)
    return answer, time.monotonic() - started, True


def judge(case: NumberCase, answers: dict[str, tuple[Answer, float]]) -> str | None:
    """Why the verifiers' answers on `case` do not hold, or None."""
    for name, (answer, seconds) in answers.items():
        if answer.exit is None:
            return f"{name} gave no answer within {RUN_BOUND_S:g}s, nor then {RETRY_BOUND_S:g}s"
        if answer.exit not in (0, 1, 2) or answer.code is None:
            return f"{name} exit {answer.exit}: {answer.said[:160]!r}"
        if "Traceback" in answer.said:
            return f"{name} printed a traceback"
        if seconds > RETRY_BOUND_S:
            return f"{name} took {seconds:.1f}s"
        if case.want == OK and answer.exit != 0:
            return f"{name} said {answer.brief()} where the spec says ok"
        if case.want == DETECTED and answer.exit not in (1, 2):
            return f"{name} said {answer.brief()} where the spec says caught"
    keys = {name: answer.key() for name, (answer, _) in answers.items()}
    if len(set(keys.values())) > 1:
        return "the verifiers disagree: " + "; ".join(
            f"{name} {answer.brief()}" for name, (answer, _) in answers.items()
        )
    return None


def run(folder: Path, quick: bool, *, seed: int = 20261201) -> Figures:
    figures = Figures("numbers")
    ledger, receipt, _ = pairs.baseline(folder / "numbers")
    verifiers, skipped = _verifiers(folder / "numbers" / "go-build")
    count = 24 if quick else 400
    cases = number_cases(ledger, receipt, seed, count)
    work = Path(tempfile.mkdtemp(prefix="pairs-", dir=folder / "numbers"))
    ledger_name = receipt["ledger"]["file"]
    slowest: dict[str, float] = {v.name: 0.0 for v in verifiers}
    retried: dict[str, int] = {v.name: 0 for v in verifiers}
    by_verdict: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for n, case in enumerate(cases):
            pair = work / f"case-{n:04d}"
            pair.mkdir()
            (pair / ledger_name).write_bytes(case.ledger)
            (pair / "receipt.json").write_bytes(case.receipt)
            futures = {v.name: pool.submit(_timed, v, pair / "receipt.json") for v in verifiers}
            timed = {name: f.result() for name, f in futures.items()}
            answers = {name: (answer, seconds) for name, (answer, seconds, _) in timed.items()}
            for name, (_, seconds, again) in timed.items():
                slowest[name] = max(slowest[name], seconds)
                retried[name] += again
            first = next(iter(answers.values()))[0]
            label = first.code or f"exit {first.exit}"
            by_verdict[label] = by_verdict.get(label, 0) + 1
            problem = judge(case, answers)
            figures.add(problem is None, f"numbers seed={seed} #{n}: {case.what}: {problem}")
            shutil.rmtree(pair)
    shutil.rmtree(work)
    figures.extra = {
        "seed": seed,
        "verifiers": [v.name for v in verifiers],
        "skipped_verifiers": skipped,
        "verdicts": dict(sorted(by_verdict.items())),
        "slowest_s": {k: round(v, 2) for k, v in slowest.items()},
        "retried_after_20s": retried,
    }
    return figures
