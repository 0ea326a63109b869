"""The three verifiers of spec/docket-receipt-1.md side by side: find, build, run, read.

`docket verify` (Python, the reference), `verify-js/verify.mjs` (Node 18+) and
`verify-go/` (Go 1.19, built once into a folder the caller owns) are written
apart from each other so that a bug shared by the recorder and its verifier
cannot make a false receipt verify (docs/resilience.md, F18). Here each is run
through its command line and its answer read as section 10 of the spec prints
it, so the three are compared on what a third party sees: the exit code, the
failure code, and where the spec gives one the seq and byte offset (for ok, the
events, head and bytes).

An implementation whose folder is not in the tree, or whose tool (node, go) is
not installed, is *absent*, with the reason; one whose folder and tool are
there but which cannot build or answer a known-good vector is *broken*: a
failure, never a skip.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from docket.cli import main

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "spec" / "vectors"
# The smoke check: a vector every conforming verifier passes (exit 0).
SMOKE_VECTOR = "ok-minimal"
RUN_TIMEOUT_S = 120.0  # one verification; the 100 MB benchmark ledger is the longest
BUILD_TIMEOUT_S = 300.0

_OK = re.compile(r"^ok: (\d+) events, head ([0-9a-f]{64}), (\d+) bytes")
# verify --attestation's ok line: the envelope's findings, then a run's receipt line
_ATTESTED = re.compile(r"^attested (?:run|game-day report) \(key [0-9a-f]{64}; [^)]*\)(?:; (.*))?$")
_FAIL = re.compile(r"^FAIL ([a-z_]+)(?: at ([^:]*))?: ")
_INPUT = re.compile(r"\(([a-z_]+)\)\s*$")


@dataclass(frozen=True)
class Answer:
    """What one verifier said about one receipt, read from its exit code and line."""

    exit: int | None  # None: it did not finish within its time
    code: str | None = None  # the failure code; "ok" for ok; None when unreadable
    seq: int | None = None
    offset: int | None = None
    events: int | None = None  # for ok: the chain's events, head and bytes
    head: str | None = None
    bytes: int | None = None
    said: str = ""  # the line it printed (or why there is none)

    def key(self) -> tuple:
        """What must be the same across verifiers (section 12: verdict, code, seq, offset)."""
        if self.exit == 0:
            return (0, self.code, self.events, self.head, self.bytes)
        if self.exit == 1:
            return (1, self.code, self.seq, self.offset)
        return (self.exit, self.code)

    def brief(self) -> str:
        if self.exit == 0 and self.code == "ok":
            return f"ok ({self.events} events, {self.bytes} bytes)"
        if self.exit == 1 and self.code:
            at = [f"seq {self.seq}"] if self.seq is not None else []
            at += [f"byte {self.offset}"] if self.offset is not None else []
            return f"exit 1 {self.code}" + (f" at {', '.join(at)}" if at else "")
        if self.exit == 2 and self.code:
            return f"exit 2 {self.code}"
        return f"exit {self.exit}, unreadable: {self.said[:200]!r}"


def read_answer(exit_code: int | None, stdout: str, stderr: str) -> Answer:
    """An Answer from a verifier's exit code and output, as spec section 10 prints them."""
    out = stdout.strip().splitlines()
    err = stderr.strip().splitlines()
    line = out[-1] if out else ""
    if exit_code == 0 and (m := _ATTESTED.match(line)):
        if m[1] is None:  # a game-day report: no receipt, so no chain figures
            return Answer(0, "ok", said=line)
        inner = _OK.match(m[1])
        if inner is None:
            return Answer(0, None, said=line)
        return Answer(0, "ok", events=int(inner[1]), head=inner[2], bytes=int(inner[3]), said=line)
    if exit_code == 0 and (m := _OK.match(line)):
        return Answer(0, "ok", events=int(m[1]), head=m[2], bytes=int(m[3]), said=line)
    if exit_code == 1 and (m := _FAIL.match(line)):
        where = m[2] or ""
        seq = re.search(r"\bseq (\d+)", where)
        offset = re.search(r"\bbyte (\d+)", where)
        return Answer(
            1,
            m[1],
            seq=int(seq[1]) if seq else None,
            offset=int(offset[1]) if offset else None,
            said=line,
        )
    last_err = err[-1] if err else ""
    if exit_code == 2 and (m := _INPUT.search(last_err)):
        return Answer(2, m[1], said=last_err)
    said = " | ".join(x for x in (line, last_err) if x) or "(nothing printed)"
    return Answer(exit_code, None, said=said)


# ------------------------------------------------------------------ the verifiers


@dataclass
class Verifier:
    """One implementation. `argv` is its command before RECEIPT (None unless runnable)."""

    name: str  # "python", "js", "go"
    argv: list[str] | None = None
    absent: str | None = None  # why it is not here: a skip, with this reason
    broken: str | None = None  # here but cannot run: a failure, with this reason
    # A command that takes many jobs at once (a JSON array of argument lists on stdin, a
    # JSON line {exit, stdout, stderr} out per job), for a verifier whose start is the
    # cost (Node); None: each job is its own process.
    each: list[str] | None = None

    @property
    def runnable(self) -> bool:
        return self.argv is not None and self.absent is None and self.broken is None

    def run(self, receipt: Path, ledger: Path | None = None, timeout_s: float = RUN_TIMEOUT_S):
        """Verify `receipt` (with `ledger` given explicitly, or the one it names)."""
        return self.run_args(receipt_args(receipt, ledger), timeout_s)

    def run_args(self, args: list[str], timeout_s: float = RUN_TIMEOUT_S) -> Answer:
        """The verifier's command with `args` after it (a receipt's, or an attestation's)."""
        if self.argv is None or not self.runnable:
            raise RuntimeError(f"{self.name} verifier cannot run: {self.absent or self.broken}")
        try:
            done = subprocess.run(
                [*self.argv, *args], capture_output=True, timeout=timeout_s, check=False,
                env=_child_env(),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Answer(None, said=f"no answer within {timeout_s:g}s")
        return read_answer(
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def run_many(self, jobs: list[tuple[Path, Path | None]], workers: int = 2) -> list[Answer]:
        """`run` over many (receipt, ledger) pairs, the answers in order."""
        return self.run_args_many([receipt_args(*job) for job in jobs], workers)

    def run_args_many(self, jobs: list[list[str]], workers: int = 2) -> list[Answer]:
        """`run_args` over many argument lists, the answers in order: in one process
        where the verifier has an `each` command, else over `workers` threads."""
        if self.each is None or not self.runnable:
            with ThreadPoolExecutor(workers) as pool:
                return list(pool.map(self.run_args, jobs))
        timeout_s = RUN_TIMEOUT_S + len(jobs)  # one start, then each case's own work
        try:
            done = subprocess.run(
                self.each, input=json.dumps(jobs).encode(), capture_output=True,
                timeout=timeout_s, check=False, env=_child_env(),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return [
                Answer(None, said=f"no answer to {len(jobs)} jobs within {timeout_s:g}s")
            ] * len(jobs)
        lines = done.stdout.decode("utf-8", "replace").splitlines()
        if done.returncode != 0 or len(lines) != len(jobs):
            why = done.stderr.decode("utf-8", "replace").strip()[-300:]
            said = f"{' '.join(self.each)} exited {done.returncode} after {len(lines)} of {len(jobs)} jobs: {why}"
            return [Answer(None, said=said)] * len(jobs)
        answers = []
        for line in lines:
            got = json.loads(line)
            answers.append(read_answer(got["exit"], got["stdout"], got["stderr"]))
        return answers


def receipt_args(receipt: Path, ledger: Path | None = None) -> list[str]:
    return [str(receipt)] + (["--ledger", str(ledger)] if ledger else [])


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DOCKET_DEBUG"}
    env.setdefault("PYTHONUTF8", "1")
    return env


def python_command(python: str) -> Verifier:
    """`python -m docket verify`: the reference, as a command."""
    return Verifier("python", [python, "-m", "docket", "verify"])


def verify_in_process(receipt: Path, ledger: Path | None = None) -> Answer:
    """`docket verify` through the CLI's own entry point in this process (no interpreter
    start per case), read like the others. Not thread-safe: it redirects stdout."""
    return verify_args_in_process(receipt_args(receipt, ledger))


def verify_args_in_process(args: list[str]) -> Answer:
    """verify_in_process for any argument list (an attestation's, say)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["verify", *args])
    return read_answer(code, out.getvalue(), err.getvalue())


def find_js(root: Path = ROOT) -> Verifier:
    folder = root / "verify-js"
    v = Verifier("js")
    if not folder.is_dir():
        v.absent = "verify-js/ is not in this tree"
        return v
    node = shutil.which("node")
    if node is None:
        v.absent = "node is not on PATH (the JavaScript verifier needs Node 18+)"
        return v
    version = _tool_output([node, "--version"])
    major = re.match(r"v(\d+)\.", version or "")
    if major is None:
        v.broken = f"`node --version` said {version!r}, not vN.N.N"
        return v
    if int(major[1]) < 18:
        v.absent = f"node is {(version or '').strip()}, older than the 18 verify.mjs needs"
        return v
    script = folder / "verify.mjs"
    if not script.is_file():
        v.broken = "verify-js/ is in the tree but verify-js/verify.mjs is not"
        return v
    v.argv = [node, str(script)]
    v.each = [node, str(ROOT / "chaos" / "verify_js_each.mjs"), str(script)]
    return _smoke(v)


def find_go(root: Path = ROOT, build_dir: Path | None = None) -> Verifier:
    """The Go verifier, built into build_dir (once: a binary already there is reused)."""
    folder = root / "verify-go"
    v = Verifier("go")
    if not folder.is_dir():
        v.absent = "verify-go/ is not in this tree"
        return v
    go = shutil.which("go")
    if go is None:
        v.absent = "go is not on PATH (apt-get install golang-go)"
        return v
    if build_dir is None:
        raise ValueError("find_go needs a build_dir for the binary")
    binary = build_dir / "docket-verify-go"
    if not binary.exists():
        build_dir.mkdir(parents=True, exist_ok=True)
        # Standard library only (the rule): with the proxy off, a dependency
        # fails the build rather than being fetched.
        env = {**_child_env(), "GOPROXY": "off", "GOTOOLCHAIN": "local"}
        try:
            done = subprocess.run(
                [go, "build", "-o", str(binary), "."],
                cwd=folder,
                capture_output=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
                env=env,
            )
        except subprocess.TimeoutExpired:
            v.broken = f"go build in verify-go/ took over {BUILD_TIMEOUT_S:g}s"
            return v
        if done.returncode != 0 or not binary.exists():
            tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-5:]
            v.broken = f"go build in verify-go/ failed (exit {done.returncode}): {' | '.join(tail)}"
            return v
    v.argv = [str(binary)]
    return _smoke(v)


def _tool_output(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def _smoke(v: Verifier) -> Verifier:
    """Present is not enough: it must pass a known-good vector, or it is broken."""
    receipt = VECTORS / SMOKE_VECTOR / "receipt.json"
    try:
        answer = v.run(receipt, timeout_s=60)
    except OSError as exc:
        v.broken = f"cannot start {' '.join(v.argv or [])}: {exc}"
        return v
    if answer.key()[:2] != (0, "ok"):
        v.broken = f"on spec/vectors/{SMOKE_VECTOR} (an ok vector) it gave {answer.brief()}"
    return v


# ------------------------------------------------------------------ vectors


def manifest(folder: Path = VECTORS) -> list[dict]:
    return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["vectors"]


def expected(vector: dict) -> tuple:
    """The key (Answer.key) the manifest gives a vector."""
    if vector["verdict"] == "ok":
        return (0, "ok", vector["events"], vector["head"], vector["bytes"])
    if vector["verdict"] == "fail":
        return (1, vector["code"], vector["seq"], vector["offset"])
    return (2, vector["code"])


def vector_paths(vector: dict, folder: Path = VECTORS) -> tuple[Path, Path | None]:
    ledger = folder / vector["ledger"] if vector["ledger"] else None
    return folder / vector["receipt"], ledger


def attestation_manifest(folder: Path = VECTORS) -> list[dict]:
    """The attestation vectors (spec/docket-attestation-1.md section 7); `expected`
    reads their entries as it reads the receipt vectors'."""
    return json.loads((folder / "attestations.json").read_text(encoding="utf-8"))["vectors"]


def attestation_args(vector: dict, folder: Path = VECTORS) -> list[str]:
    """RUN --attestation ENVELOPE --pubkey KEY, as every verifier takes them."""
    return [
        str(folder / vector["run"]),
        "--attestation",
        str(folder / vector["attestation"]),
        "--pubkey",
        str(folder / vector["pubkey"]),
    ]


# ------------------------------------------------------------------ candidates


@dataclass
class Candidate:
    """A case the verifiers disagreed on, to be written out as a vector candidate."""

    name: str
    description: str
    receipt: bytes
    ledger: bytes
    ledger_name: str  # the file name the receipt's ledger.file gives
    explicit_ledger: bool  # was the ledger passed with --ledger
    answers: dict[str, Answer] = field(default_factory=dict)


def write_candidates(folder: Path, candidates: list[Candidate]) -> Path:
    """Each candidate in the layout of spec/vectors (NAME/receipt.json beside its ledger)
    and a manifest.json listing them. The expected verdict is left null: it is written
    down from the spec by whoever adds the vector (spec section 12), never taken from a
    verifier; `seen` holds what each verifier said."""
    if folder.is_dir():  # this run's candidates only: an earlier run's would mislead
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    entries = []
    for c in candidates:
        (folder / c.name).mkdir(exist_ok=True)
        (folder / c.name / "receipt.json").write_bytes(c.receipt)
        (folder / c.name / c.ledger_name).write_bytes(c.ledger)
        entries.append(
            {
                "name": c.name,
                "description": c.description,
                "receipt": f"{c.name}/receipt.json",
                "ledger": f"{c.name}/{c.ledger_name}" if c.explicit_ledger else None,
                "verdict": None,
                "exit": None,
                "code": None,
                "seq": None,
                "offset": None,
                "field": None,
                "seen": {name: asdict(a) for name, a in c.answers.items()},
            }
        )
    doc = {
        "format": "docket-receipt-1 vector candidates",
        "spec": "spec/docket-receipt-1.md",
        "paths": "relative to the folder holding this manifest",
        "note": "verifiers disagreed on these; decide each verdict from the spec, then add "
        "the case to spec/vectors/make_vectors.py",
        "vectors": entries,
    }
    (folder / "manifest.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return folder


__all__ = [
    "ROOT",
    "VECTORS",
    "Answer",
    "Candidate",
    "Verifier",
    "attestation_args",
    "attestation_manifest",
    "expected",
    "find_go",
    "find_js",
    "manifest",
    "python_command",
    "read_answer",
    "receipt_args",
    "vector_paths",
    "verify_args_in_process",
    "verify_in_process",
    "write_candidates",
]
