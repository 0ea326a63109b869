"""Three verifiers, one verdict: `docket verify`, verify-js/verify.mjs and verify-go/.

Real pairs come first: a supervised run whose call cap bites (chaos.attack.mutations'
baseline) and three game-day phases (upstream-failure, evidence-loss, runaway-loop),
run once per session. From them, DOCKET_DIFFERENTIAL_CASES (default 200; `nox -s
verifiers` runs 1,000) seeded random mutations from chaos/attack/mutations.py (byte
flips, deleted, duplicated and swapped lines, truncations, appended lines, forged
lines re-chained with and without the receipt updated, receipt field edits and byte
flips) and a fifth as many number forms planted at seeded places (chaos/attack/numbers.py:
huge integers, huge and tiny exponents, -0, 1.0 for 1, leading zeros, values at the
bounds of spec rule 2.1.7), plus a fixed set of spec-edge re-encodings made here, each on two of the pairs (the places where
implementations of one spec drift apart: number forms, escapes, duplicate names, a
BOM, whitespace, -0, 2^53), plus each pair untouched.

Every case is judged by each verifier through its command line (Python in this
process through the CLI's own entry point, cross-checked against the real command
on a few cases); any disagreement in exit code, failure code, seq or byte offset (for
ok: events, head, bytes) fails, and the cases are written out as vector candidates
in spec/vectors' layout under vector-candidates/ (or $DOCKET_VECTOR_CANDIDATES),
which the failure names. The same two verifiers are also run over every committed
vector. A verifier whose folder or tool is absent is skipped with the reason; one
whose folder and tool are present but which cannot build or pass an ok vector fails.
Without either, the Python side still runs: docket verify must detect every edit
and accept every re-encoding the spec says is the same receipt.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.attack import mutations, numbers
from chaos.attack.rig import DOCKET
from chaos.verifiers import (
    ROOT,
    Answer,
    Candidate,
    Verifier,
    attestation_args,
    attestation_manifest,
    expected,
    find_go,
    find_js,
    manifest,
    python_command,
    vector_paths,
    verify_args_in_process,
    verify_in_process,
    write_candidates,
)

CASES = int(os.environ.get("DOCKET_DIFFERENTIAL_CASES", "200"))
SEED = int(os.environ.get("DOCKET_DIFFERENTIAL_SEED", "20261215"))
CANDIDATES = Path(os.environ.get("DOCKET_VECTOR_CANDIDATES", ROOT / "vector-candidates"))
GAMEDAY_PHASES = ("upstream-failure", "evidence-loss", "runaway-loop")
WORKERS = max(2, min(4, (os.cpu_count() or 2) + 1))  # spawning node is CPU work
CROSSCHECK = 8  # cases also run through `python -m docket verify`

OK, DETECTED = "ok", "detected"  # what the spec says of a case, where it says
# An edit of claims the spec cannot check against this ledger (section 7.2's unbacked
# claims; ops.evidence beyond its bounds when session.end was lost): caught, or an ok
# that discloses it ("not backed by the ledger", "ledger incomplete (disclosed)").
UNCHECKED = "unchecked"
DISCLOSED = ("not backed by the ledger: ", "ledger incomplete (disclosed)")
_PREV = re.compile(rb'"prev":"[0-9a-f]{64}"')


@dataclass(frozen=True)
class Baseline:
    name: str
    ledger: bytes
    receipt: dict
    ledger_name: str


@dataclass(frozen=True)
class Case:
    n: int
    what: str  # "BASELINE: the mutation", enough to redo it by hand
    ledger: bytes
    receipt: bytes
    ledger_name: str
    want: str | None  # OK, DETECTED, or None: the spec's verdict is what they must agree on
    explicit_ledger: bool  # passed with --ledger, else found through the receipt's ledger.file

    @property
    def name(self) -> str:
        return f"case-{self.n:04d}"


# ------------------------------------------------------------------ real pairs


def _gameday_evidence(folder: Path, shared) -> Path:
    """The folder of a game day's evidence (PHASE/RUN/...) holding GAMEDAY_PHASES' pairs:
    the suite's shared day (tests/conftest.py gameday_run, its --keep folder) at the
    phases' own seeds, else a day of our own at SEED (DOCKET_DIFFERENTIAL_SEED set)."""
    if "DOCKET_DIFFERENTIAL_SEED" not in os.environ:
        returncode, output, evidence = shared.returncode, shared.output, shared.keep
    else:
        report = folder / "gameday"
        argv = [*DOCKET, "game-day", "--report", str(report), "--seed", str(SEED % 1000)]
        for phase in GAMEDAY_PHASES:
            argv += ["--phase", phase]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        returncode, output, evidence = (
            done.returncode,
            done.stdout + done.stderr,
            report / "evidence",
        )
    if returncode not in (0, 1):  # a failed phase still leaves real pairs; 2+ is not a day
        tail = output.strip().splitlines()[-5:]
        pytest.fail(f"the game day exited {returncode}: {' | '.join(tail)}")
    return evidence


def _gameday_pairs(evidence: Path) -> list[Baseline]:
    pairs = []
    for receipt_path in sorted(evidence.rglob("receipt.json")):
        if receipt_path.relative_to(evidence).parts[0] not in GAMEDAY_PHASES:
            continue
        receipt = json.loads(receipt_path.read_text(encoding="utf-8"))
        ledger = receipt_path.parent / receipt["ledger"]["file"]
        name = "gameday:" + "/".join(receipt_path.relative_to(evidence).parts[:2])
        pairs.append(Baseline(name, ledger.read_bytes(), receipt, receipt["ledger"]["file"]))
    if len(pairs) < len(GAMEDAY_PHASES):
        pytest.fail(f"the game day left {len(pairs)} receipts under {evidence}")
    return pairs


@pytest.fixture(scope="session")
def baselines(tmp_path_factory, gameday_run) -> list[Baseline]:
    folder = tmp_path_factory.mktemp("differential-runs")
    ledger, receipt, _ = mutations.baseline(folder / "supervised")
    pairs = [Baseline("supervised", ledger, receipt, receipt["ledger"]["file"])]
    pairs += _gameday_pairs(_gameday_evidence(folder, gameday_run))
    return pairs


# ------------------------------------------------------------------ the cases


def _dump(receipt: dict) -> bytes:
    return (json.dumps(receipt, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _with_raw(receipt: dict, path: tuple, raw: str) -> bytes:
    """The receipt's text with the value at `path` written as `raw`, verbatim."""
    marked = json.loads(json.dumps(receipt))
    parent = marked
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = "\x00RAW\x00"
    text = _dump(marked).decode()
    return text.replace(json.dumps("\x00RAW\x00"), raw, 1).encode()


def _reversed(value):
    if isinstance(value, dict):
        return {k: _reversed(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed(v) for v in value]
    return value


def _escaped_first(s: str) -> str:
    return json.dumps(s)[0] + f"\\u{ord(s[0]):04x}" + json.dumps(s)[2:]


def _zero_path(receipt: dict) -> tuple | None:
    for path in sorted(mutations._leaves(receipt), key=repr):
        value = receipt
        for key in path:
            value = value[key]
        if type(value) is int and value == 0:
            return path
    return None


def _claims_for(receipt: dict, ledger: bytes) -> bytes:
    """The receipt with head, events and bytes re-derived from `ledger` (a forger's update)."""
    forged = json.loads(json.dumps(receipt))
    lines = ledger.splitlines()
    forged["ledger"].update(
        head=hashlib.sha256(lines[-1]).hexdigest(), events=len(lines), bytes=len(ledger)
    )
    return _dump(forged)


def _relined(b: Baseline, i: int, edit) -> tuple[bytes, bytes]:
    """Line i edited by `edit`, the chain rebuilt after it, the receipt's head/events/bytes
    updated: only the edit itself can be caught."""
    lines = b.ledger.splitlines(keepends=True)
    body = lines[i].rstrip(b"\n")
    lines[i] = edit(body) + b"\n"
    data = b"".join(mutations.rechain(lines, i + 1))
    return data, _claims_for(b.receipt, data)


def spec_edges(b: Baseline) -> list[tuple[str, bytes, bytes, str | None]]:
    """(what, ledger, receipt, want) for the re-encodings the spec decides."""
    r, original = b.receipt, _dump(b.receipt)
    events = r["ledger"]["events"]
    out = [
        ("receipt: compact separators", b.ledger,
         json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode(), OK),
        ("receipt: non-ASCII as \\u escapes, indent 1", b.ledger,
         json.dumps(r, ensure_ascii=True, indent=1).encode(), OK),
        ("receipt: every object's members in reverse order", b.ledger,
         json.dumps(_reversed(r), indent=2).encode(), OK),
        ("receipt: CRLF, leading and trailing JSON whitespace", b.ledger,
         b"\r\n \t" + original.replace(b"\n", b"\r\n") + b" \t\r\n", OK),
        ("receipt: format's first letter as a \\u escape", b.ledger,
         _with_raw(r, ("format",), _escaped_first(r["format"])), OK),
        ("receipt: run_id's first letter as a \\u escape", b.ledger,
         _with_raw(r, ("run_id",), _escaped_first(r["run_id"])), OK),
        (f"receipt: ledger.events written {events}.0", b.ledger,
         _with_raw(r, ("ledger", "events"), f"{events}.0"), DETECTED),
        (f"receipt: ledger.events written {events}e0", b.ledger,
         _with_raw(r, ("ledger", "events"), f"{events}e0"), DETECTED),
        ("receipt: ledger.events written 2^53", b.ledger,
         _with_raw(r, ("ledger", "events"), str(2**53)), DETECTED),
        ("receipt: ledger.events written 2^64 + its own count", b.ledger,
         _with_raw(r, ("ledger", "events"), str(2**64 + events)), DETECTED),
        ("receipt: a second ledger.events member, same value", b.ledger,
         _with_raw(r, ("ledger", "events"), f'{events}, "events": {events}'), DETECTED),
        ("receipt: a second ledger.events member, name \\u-escaped", b.ledger,
         _with_raw(r, ("ledger", "events"), f'{events}, "\\u0065vents": {events}'), DETECTED),
        ("receipt: a UTF-8 byte-order mark first", b.ledger, b"\xef\xbb\xbf" + original, DETECTED),
        ("receipt: a second JSON value after the first", b.ledger, original + b"{}\n", DETECTED),
        ("receipt: cut in half", b.ledger, original[: len(original) // 2], DETECTED),
        ("receipt: a lone surrogate escape in run_id", b.ledger,
         _with_raw(r, ("run_id",), '"\\ud800x"'), DETECTED),
        # Number forms (spec rule 2.1.7): past the bounds, wherever, is caught.
        ("receipt: ledger.events written with 5,000 digits", b.ledger,
         _with_raw(r, ("ledger", "events"), numbers.HUGE), DETECTED),
        ("receipt: ledger.events written 1e99999999", b.ledger,
         _with_raw(r, ("ledger", "events"), "1e99999999"), DETECTED),
        ("receipt: ledger.events written 1e-5000", b.ledger,
         _with_raw(r, ("ledger", "events"), "1e-5000"), DETECTED),
        ("receipt: ledger.events written 1e9999999999999999999", b.ledger,
         _with_raw(r, ("ledger", "events"), "1e9999999999999999999"), DETECTED),
        (f"receipt: ledger.events written 0{events} (a leading zero)", b.ledger,
         _with_raw(r, ("ledger", "events"), f"0{events}"), DETECTED),
    ]  # fmt: skip
    zero = _zero_path(r)
    if zero is not None:
        where = ".".join(map(str, zero))
        out.append((f"receipt: {where} written -0", b.ledger, _with_raw(r, zero, "-0"), OK))
    lines = b.ledger.splitlines()
    i = len(lines) // 2  # a middle line: the file's first five bytes stay {"v":
    type_at = lines[i].index(b'"type":"') + len(b'"type":"')
    edges = [
        (f"line {i} opens with a space inside its object", lambda s: b"{ " + s[1:], OK),
        (f"line {i} ends with a tab and a CR (JSON whitespace)", lambda s: s + b"\t\r", OK),
        (f"line {i}'s type with its first letter \\u-escaped",
         lambda s: s[:type_at] + b"\\u%04x" % s[type_at] + s[type_at + 1 :], OK),
        (f"line {i}'s seq written {i}.0",
         lambda s: s.replace(b'"seq":%d,' % i, b'"seq":%d.0,' % i, 1), DETECTED),
        (f"line {i} with a second type member",
         lambda s: s[:-1] + b',"type":"x"}', DETECTED),
        (f"line {i} with a second type member, its name \\u-escaped",
         lambda s: s[:-1] + b',"\\u0074ype":"x"}', DETECTED),
        (f"line {i} with a member holding 1e300, 1.5e-300, -0 and a 32-digit integer",
         lambda s: s[:-1] + b',"x_n":[1e300,1.5e-300,-0,' + b"9" * 32 + b"]}", OK),
        (f"line {i} with a member holding a 5,000-digit integer",
         lambda s: s[:-1] + b',"x_n":' + numbers.HUGE.encode() + b"}", DETECTED),
        (f"line {i} with a member holding 1e-5000",
         lambda s: s[:-1] + b',"x_n":1e-5000}', DETECTED),
        (f"line {i} with a member holding 1e99999999",
         lambda s: s[:-1] + b',"x_n":1e99999999}', DETECTED),
        (f"line {i} with a member holding 1e9999999999999999999",
         lambda s: s[:-1] + b',"x_n":1e9999999999999999999}', DETECTED),
        (f"line {i} with a member holding 01 (a leading zero)",
         lambda s: s[:-1] + b',"x_n":01}', DETECTED),
        (f"line {i}'s mono_ms written with an exponent",
         lambda s: re.sub(rb'"mono_ms":([0-9]+),', rb'"mono_ms":\1e0,', s, count=1), DETECTED),
        (f"line {i} with a prev in capitals",
         lambda s: _PREV.sub(lambda m: m[0].upper().replace(b'"PREV"', b'"prev"'), s, 1),
         DETECTED),
    ]  # fmt: skip
    for what, edit, want in edges:
        ledger, receipt = _relined(b, i, edit)
        out.append((f"ledger: {what}, re-chained, receipt updated", ledger, receipt, want))
    ledger, receipt = _relined(b, 0, lambda s: s.replace(b'"mono_ms":0,', b'"mono_ms":-0,', 1))
    out.append(("ledger: line 0's mono_ms written -0, re-chained, receipt updated",
                ledger, receipt, OK if ledger != b.ledger else None))  # fmt: skip
    no_newline = b.ledger[:-1]
    out.append(("ledger: the last newline removed, receipt bytes updated", no_newline,
                _with_raw(r, ("ledger", "bytes"), str(len(no_newline))), DETECTED))  # fmt: skip
    return out


def _leaf_values(value) -> dict:
    out = {}
    for path in mutations._leaves(value):
        leaf = value
        for key in path:
            leaf = leaf[key]
        out[path] = json.dumps(leaf, sort_keys=True)
    return out


def unchecked(b: Baseline) -> tuple[str, ...]:
    """The receipt's top-level claims this ledger cannot back (spec section 7.2)."""
    if b'"type":"session.end"' in b.ledger:
        return ()
    return ("ended_at", "duration_ms", "exit")


def changed_paths(b: Baseline, ledger: bytes, receipt: bytes) -> set[tuple] | None:
    """The receipt's leaf paths an edit changed, or None when the ledger changed too or
    the receipt is no longer a JSON object."""
    if ledger != b.ledger:
        return None
    try:
        edited = json.loads(receipt)
    except ValueError:
        return None
    if not isinstance(edited, dict):
        return None
    before, after = _leaf_values(b.receipt), _leaf_values(edited)
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def want_of(b: Baseline, m: mutations.Mutation, explicit_ledger: bool) -> str | None:
    """DETECTED, unless the edit touches only what the spec does not check here: claims
    this ledger cannot back (UNCHECKED), or ledger.file when --ledger is given (not a
    claim, section 8 step 12: then only its shape counts, so no expectation)."""
    changed = changed_paths(b, m.ledger, m.receipt)
    if not changed:
        return DETECTED
    if explicit_ledger and changed == {("ledger", "file")}:
        return None
    free = unchecked(b)
    if free and all(p and (p[0] in free or p[:2] == ("ops", "evidence")) for p in changed):
        return UNCHECKED
    return DETECTED


def make_cases(pairs: list[Baseline], count: int, seed: int) -> list[Case]:
    """`count` random mutations spread over the pairs, then the spec edges, then each
    pair untouched; the same arguments give the same cases."""
    cases: list[Case] = []
    choose = random.Random(seed)

    def add(b: Baseline, what: str, ledger: bytes, receipt: bytes, want) -> None:
        n = len(cases)
        explicit = choose.random() < 0.5
        if isinstance(want, mutations.Mutation):
            want = want_of(b, want, explicit)
        cases.append(Case(n, f"{b.name}: {what}", ledger, receipt, b.ledger_name, want, explicit))

    share = [count // len(pairs) + (k < count % len(pairs)) for k in range(len(pairs))]
    for k, (b, m) in enumerate(zip(pairs, share, strict=True)):
        for mutation in mutations.mutations(b.ledger, b.receipt, seed + k, m):
            # the mutation stands for its want, decided once --ledger is drawn
            what = f"{mutation.name} (seed {seed + k})"
            add(b, what, mutation.ledger, mutation.receipt, mutation)
    # Number forms planted at seeded places (chaos.attack.numbers), a fifth as many again
    per_pair = max(2, count // (5 * len(pairs)))
    for k, b in enumerate(pairs):
        for planted in numbers.number_cases(b.ledger, b.receipt, seed + 1000 + k, per_pair):
            add(b, f"number form: {planted.what} (seed {seed + 1000 + k})", planted.ledger,
                planted.receipt, planted.want)  # fmt: skip
    # Each spec edge on two of the pairs, in turn (on all six it costs a node start each)
    edges = [spec_edges(b) for b in pairs]
    for k in range(max(map(len, edges))):
        for b, made in ((pairs[j % len(pairs)], edges[j % len(pairs)]) for j in (k, k + 1)):
            if k < len(made):
                add(b, *made[k])
    for b in pairs:
        add(b, "untouched", b.ledger, _dump(b.receipt), OK)
    return cases


def stage(folder: Path, cases: list[Case]) -> dict[int, tuple[Path, Path | None]]:
    """Each case on disk as receipt.json beside its ledger; (receipt, --ledger or None)."""
    where = {}
    for c in cases:
        d = folder / c.name
        d.mkdir()
        (d / "receipt.json").write_bytes(c.receipt)
        (d / c.ledger_name).write_bytes(c.ledger)
        where[c.n] = (d / "receipt.json", d / c.ledger_name if c.explicit_ledger else None)
    return where


@dataclass
class Judged:
    cases: list[Case]
    paths: dict[int, tuple[Path, Path | None]]
    python: dict[int, Answer]
    seconds: float


@pytest.fixture(scope="session")
def judged(baselines, tmp_path_factory) -> Judged:
    for b in baselines:  # a baseline that does not verify would make every "agreement" vacuous
        folder = tmp_path_factory.mktemp("baseline")
        (folder / "receipt.json").write_bytes(_dump(b.receipt))
        (folder / b.ledger_name).write_bytes(b.ledger)
        answer = verify_in_process(folder / "receipt.json")
        assert answer.code == "ok", f"baseline {b.name} does not verify: {answer.said}"
    cases = make_cases(baselines, CASES, SEED)
    paths = stage(tmp_path_factory.mktemp("cases"), cases)
    started = time.perf_counter()
    python = {c.n: verify_in_process(*paths[c.n]) for c in cases}
    return Judged(cases, paths, python, time.perf_counter() - started)


def judge_all(verifier: Verifier, judged: Judged, cases: list[Case] | None = None):
    """{case: Answer} from `verifier`: in one process where it takes many cases at once
    (Node), else over a thread pool (each case its own process)."""
    todo = judged.cases if cases is None else cases
    answers = verifier.run_many([judged.paths[c.n] for c in todo], WORKERS)
    return dict(zip((c.n for c in todo), answers, strict=True))


def disagreements(judged: Judged, others: dict[str, dict[int, Answer]]) -> list[Candidate]:
    """A Candidate for each case on which some verifier's key differs from Python's."""
    out = []
    for c in judged.cases:
        answers = {"python": judged.python[c.n]}
        answers |= {name: got[c.n] for name, got in others.items() if c.n in got}
        if len({a.key() for a in answers.values()}) > 1:
            out.append(
                Candidate(
                    f"diff-{SEED}-{c.n:04d}",
                    c.what,
                    c.receipt,
                    c.ledger,
                    c.ledger_name,
                    c.explicit_ledger,
                    answers,
                )
            )
    return out


def _report(candidates: list[Candidate], folder: Path) -> str:
    shown = "\n".join(
        f"  {c.name}: {c.description}: "
        + "; ".join(f"{name} {a.brief()}" for name, a in c.answers.items())
        for c in candidates[:20]
    )
    more = f"\n  ... and {len(candidates) - 20} more" if len(candidates) > 20 else ""
    return (
        f"{len(candidates)} cases judged differently; written as vector candidates under "
        f"{folder} (manifest.json lists them):\n{shown}{more}"
    )


# ------------------------------------------------------------------ the other two


@pytest.fixture(scope="session")
def others(go_verifier) -> dict[str, Verifier]:
    return {"js": find_js(), "go": go_verifier}  # the Go binary: built once a session


def runnable(others: dict[str, Verifier], name: str) -> Verifier:
    v = others[name]
    if v.absent:
        pytest.skip(f"{name} verifier absent: {v.absent}")
    if v.broken:
        pytest.fail(f"{name} verifier present but cannot run: {v.broken}")
    return v


@pytest.fixture(scope="session")
def external(judged, others) -> dict[str, dict[int, Answer]]:
    """Every case through every runnable verifier besides Python: {name: {case: Answer}}."""
    return {name: judge_all(v, judged) for name, v in others.items() if v.runnable}


# ------------------------------------------------------------------ the tests


def test_docket_verify_detects_every_edit_and_accepts_every_same_receipt(judged):
    wrong = [
        f"{c.name} {c.what}: wanted {c.want}, got {judged.python[c.n].brief()}"
        for c in judged.cases
        if (c.want == DETECTED and judged.python[c.n].exit not in mutations.DETECTED)
        or (
            c.want == UNCHECKED
            and judged.python[c.n].exit not in mutations.DETECTED
            and not any(d in judged.python[c.n].said for d in DISCLOSED)
        )
        or (c.want == OK and judged.python[c.n].code != "ok")
    ]
    unreadable = [f"{c.name}: {judged.python[c.n].said}" for c in judged.cases
                  if judged.python[c.n].code is None]  # fmt: skip
    wants = [c.want for c in judged.cases]
    assert wants.count(DETECTED) + wants.count(UNCHECKED) >= CASES * 0.95
    assert wants.count(UNCHECKED) <= CASES // 20  # the exemption stays an exception
    assert unreadable == [], "docket verify's output is not section 10's"
    assert wrong == [], "\n".join(wrong)


def test_the_in_process_verify_is_the_command(judged):
    command = python_command(sys.executable)
    picked = random.Random(SEED).sample(judged.cases, CROSSCHECK)
    got = judge_all(command, judged, picked)
    differ = [f"{c.name}: in process {judged.python[c.n].brief()}, command {got[c.n].brief()}"
              for c in picked if got[c.n].key() != judged.python[c.n].key()]  # fmt: skip
    assert differ == []


@pytest.mark.parametrize("name", ["js", "go"])
def test_each_verifier_agrees_with_docket_verify_on_every_case(name, others, judged, external):
    runnable(others, name)
    mine = {name: external[name]}
    candidates = disagreements(judged, mine)
    if candidates:
        all_said = disagreements(judged, external)  # each candidate with every verifier's word
        folder = write_candidates(CANDIDATES / f"{name}-seed{SEED}", all_said)
        pytest.fail(_report(candidates, folder))
    agreed = len(judged.cases)
    print(f"\n{name}: agreed with docket verify on {agreed} of {agreed} cases")


@pytest.mark.parametrize("name", ["js", "go"])
def test_each_verifier_gives_every_vector_its_verdict(name, others):
    v = runnable(others, name)
    vectors = manifest()
    answers = v.run_many([vector_paths(vec) for vec in vectors], WORKERS)
    wrong = [f"{vec['name']}: want {expected(vec)}, got {a.key()} ({a.said[:120]})"
             for vec, a in zip(vectors, answers, strict=True)
             if a.key() != expected(vec)]  # fmt: skip
    assert len(vectors) >= 60
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("name", ["js", "go"])
def test_each_verifier_gives_every_attestation_vector_its_verdict(name, others):
    """spec/docket-attestation-1.md section 7: each vector's verdict and code, as
    tests/test_vectors.py holds `docket verify --attestation` to them."""
    v = runnable(others, name)
    vectors = attestation_manifest()
    answers = v.run_args_many([attestation_args(vec) for vec in vectors], WORKERS)
    wrong = [f"{vec['name']}: want {expected(vec)}, got {a.key()} ({a.said[:120]})"
             for vec, a in zip(vectors, answers, strict=True)
             if a.key() != expected(vec)]  # fmt: skip
    assert len(vectors) >= 6
    assert wrong == [], "\n".join(wrong)


# ---------------------------------------------- the harness, shown to bite


LIAR = """\
import subprocess, sys
# docket verify, except that it calls every failed check malformed_line at seq 0
done = subprocess.run([sys.executable, "-m", "docket", "verify", *sys.argv[1:]],
                      capture_output=True, text=True)
out = done.stdout
if done.returncode == 1:
    out = "FAIL malformed_line at seq 0, byte 0: " + out.split(": ", 1)[1]
sys.stdout.write(out)
sys.stderr.write(done.stderr)
sys.exit(done.returncode)
"""


def test_a_verifier_that_disagrees_fails_and_leaves_loadable_candidates(judged, tmp_path):
    liar = tmp_path / "liar.py"
    liar.write_text(LIAR)
    picked = [c for c in judged.cases if judged.python[c.n].exit in (0, 1)][:12]
    said = judge_all(Verifier("liar", [sys.executable, str(liar)]), judged, picked)
    lied_on = {c.n for c in picked if judged.python[c.n].exit == 1}
    sub = Judged(picked, judged.paths, judged.python, 0.0)
    candidates = disagreements(sub, {"liar": said})
    assert {int(c.name.rsplit("-", 1)[1]) for c in candidates} == lied_on != set()

    folder = write_candidates(tmp_path / "candidates", candidates)
    doc = json.loads((folder / "manifest.json").read_text())
    committed = manifest()[0]
    for entry, c in zip(doc["vectors"], candidates, strict=True):
        assert set(committed) - {"events", "head", "bytes", "unbacked"} <= set(entry)
        receipt, ledger = vector_paths(entry, folder)
        assert receipt.read_bytes() == c.receipt
        # the candidate is the case: the reference verifier gives it the same answer again
        assert verify_in_process(receipt, ledger).key() == c.answers["python"].key()
        assert entry["seen"]["liar"]["code"] == "malformed_line"


def test_a_verifier_present_but_unable_to_run_is_broken_not_absent(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    assert find_js(tree).absent == "verify-js/ is not in this tree"
    assert find_go(tree, tmp_path / "b0").absent == "verify-go/ is not in this tree"
    (tree / "verify-js").mkdir()
    js = find_js(tree)
    if js.absent:  # no node here: the folder alone says nothing
        pytest.skip(js.absent)
    assert js.broken == "verify-js/ is in the tree but verify-js/verify.mjs is not"
    (tree / "verify-js" / "verify.mjs").write_text("this is not javascript (\n")
    assert "on spec/vectors/ok-minimal (an ok vector) it gave exit 1" in find_js(tree).broken
    (tree / "verify-js" / "verify.mjs").write_text("console.log('ok: 2 events'); process.exit(0)\n")
    assert "unreadable" in find_js(tree).broken  # exit 0 is not enough: the line must be read
    (tree / "verify-go").mkdir()
    (tree / "verify-go" / "go.mod").write_text("module example.com/broken\n\ngo 1.19\n")
    (tree / "verify-go" / "main.go").write_text("package main\nfunc main() { nope }\n")
    go = find_go(tree, tmp_path / "b1")
    if go.absent:
        pytest.skip(go.absent)
    assert go.broken and go.broken.startswith("go build in verify-go/ failed (exit ")
    assert "undefined: nope" in go.broken  # the compiler's own words, to fix it by


def envelope_mutations(good: bytes, rng: random.Random, count: int) -> list[bytes]:
    """Seeded edits of a signed envelope's bytes: a byte flipped, a byte deleted, the
    text cut short, a byte inserted; each verifier must name the same failure."""
    out = []
    for _ in range(count):
        data = bytearray(good)
        at = rng.randrange(len(data))
        kind = rng.choice(("flip", "delete", "truncate", "insert"))
        if kind == "flip":
            data[at] ^= 1 << rng.randrange(8)
        elif kind == "delete":
            del data[at]
        elif kind == "truncate":
            del data[at:]
        else:
            data.insert(at, rng.choice(b'"{}[],:\\ 0aZ+/=\x00\xff'))
        out.append(bytes(data))
    return out


def test_the_three_verifiers_agree_on_mutated_envelopes(others, tmp_path):
    """docket verify --attestation, verify-js and verify-go on seeded edits of the good
    envelope (and of one signed as application/json): one exit code and failure code."""
    good = attestation_manifest()[0]
    assert good["name"] == "attest-ok"
    rng = random.Random(SEED)
    folder = ROOT / "spec" / "vectors"
    sources = [folder / "attest-ok/attestation.dsse.json",
               folder / "attest-wrong-payload-type/attestation.dsse.json"]  # fmt: skip
    jobs = []
    for n, data in enumerate(
        m for src in sources for m in envelope_mutations(src.read_bytes(), rng, max(20, CASES // 5))
    ):
        path = tmp_path / f"envelope-{n}.json"
        path.write_bytes(data)
        args = attestation_args(good)
        args[2] = str(path)
        jobs.append(args)
    python = [verify_args_in_process(args) for args in jobs]
    assert {a.code for a in python} >= {"signature_invalid", "attestation_not_json"}
    for name, v in others.items():
        if not v.runnable:
            continue
        theirs = v.run_args_many(jobs, WORKERS)
        wrong = [f"{args[2]}: docket verify {p.key()}, {name} {t.key()} ({t.said[:100]})"
                 for args, p, t in zip(jobs, python, theirs, strict=True) if p.key() != t.key()]  # fmt: skip
        assert wrong == [], "\n".join(wrong)
