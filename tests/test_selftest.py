"""`docket selftest`: every check passes on a sound Docket, quickly, and each one
fails when the mechanism it proves is broken (one guard monkeypatched at a time),
so no check passes by construction."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import docket.boundary.providers as providers
import docket.boundary.providers.base as provider_base
import docket.boundary.providers.openai as openai_shape
import docket.ledger.doctor as doctor
import docket.receipts.verify as verify_module
import docket.selftest.checks_evidence as checks_evidence
from docket.boundary.app import Boundary
from docket.boundary.metrics import Metrics
from docket.boundary.recorder import Recorder
from docket.cli import main
from docket.clock import Clock
from docket.guards.breaker import CircuitBreaker
from docket.guards.bulkhead import BulkheadCore
from docket.guards.caps import CapsGuard
from docket.guards.egress import Allowed, EgressRule
from docket.guards.limiter import Admit, RateLimiter
from docket.guards.redact import Redactor
from docket.ledger.reader import iter_lines
from docket.selftest import all_checks
from docket.selftest.runner import Check, CheckFailed, Registry, expect, run_one

ROOT = Path(__file__).resolve().parent.parent
CHECKS = {c.name: c for c in all_checks()}


def test_the_whole_selftest_passes_in_json(capsys):
    started = time.monotonic()
    code = main(["selftest", "--json"])
    took = time.monotonic() - started
    out = capsys.readouterr().out
    report = json.loads(out)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert code == 0 and report["ok"] and failed == [], failed
    assert report["passed"] == len(report["checks"]) >= 19
    assert {c["group"] for c in report["checks"]} == {"calls", "guards", "caps", "evidence"}
    # A bound for a hang, not a speed (speed is the benchmarks' to measure): 4.5 s on a
    # quiet machine, 16 s once beside the suite's game day and a fork-bomb probe.
    assert took < 60, f"selftest took {took:.1f} s"


def test_the_table_and_the_exit_codes_through_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "docket", "selftest", "--only", "record", "--only", "tamper"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "calls/record" in done.stdout and "evidence/tamper" in done.stdout
    assert "2 checks, all passed" in done.stdout
    header = next(line for line in done.stdout.splitlines() if "check" in line and "┃" in line)
    cells = [c.strip() for c in header.strip("┃ ").split("┃")]
    assert cells[:3] == ["check", "status", "s"], header  # every column named
    bad = subprocess.run(
        [sys.executable, "-m", "docket", "selftest", "--only", "no-such-check"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("docket: selftest --only no-such-check: no such check")


def test_a_failed_check_is_exit_1_and_named(monkeypatch, capsys):
    monkeypatch.setattr(RateLimiter, "admit", lambda self, now: Admit(None, None))
    assert main(["selftest", "--only", "limiter", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 1 and report["checks"][0]["name"] == "limiter"
    assert "429" in report["checks"][0]["detail"]


async def test_a_check_that_raises_or_hangs_fails_with_its_reason():
    reg = Registry("t")

    @reg.check("raises", "x")
    async def raises(folder: Path) -> str:
        raise KeyError("boom")

    @reg.check("hangs", "x")
    async def hangs(folder: Path) -> str:
        import trio

        await trio.sleep_forever()
        return ""

    @reg.check("expects", "x")
    async def expects(folder: Path) -> str:
        expect(1 == 2, "one is not two")
        return ""

    results = [await run_one(c, deadline=0.2) for c in reg.checks]
    assert [(r.ok, r.detail) for r in results] == [
        (False, "KeyError: 'boom'"),
        (False, "did not finish within 0.2 s"),
        (False, "one is not two"),
    ]
    assert issubclass(CheckFailed, Exception)


def _under_reserve(original):
    def reserve(self, *, model, request_bytes, max_output_tokens):
        return original(self, model=model, request_bytes=request_bytes, max_output_tokens=1)

    return reserve


def _endless_queue(original):
    def try_enter(self, now, deadline=None):
        self.max_queue = 10**6
        return original(self, now, deadline)

    return try_enter


def _flipped_manifest(tmp_path: Path):
    def folder() -> Path:
        copy = tmp_path / "vectors"
        shutil.copytree(ROOT / "spec" / "vectors", copy)
        data = json.loads((copy / "manifest.json").read_text())
        data["vectors"][0]["verdict"] = "fail"  # what the verifier gives is now wrong
        (copy / "manifest.json").write_text(json.dumps(data))
        return copy

    return folder


def _deny_kills(self, cap, events):
    # on_breach read wrong: every breach stops the run, deny or not
    if any(e.type == "cap.exceeded" for e in events):
        self._stopped_by = self._stopped_by or cap
        return True
    return False


# (check, what to break, how): each a real mechanism, broken the way a bug would break it.
SABOTAGE = {
    "auth": lambda mp, tmp: mp.setattr(providers, "token_matches", lambda a, b: True),
    "breaker": lambda mp, tmp: mp.setattr(CircuitBreaker, "_note", lambda self, failed: None),
    "limiter": lambda mp, tmp: mp.setattr(
        RateLimiter, "admit", lambda self, now: Admit(None, None)
    ),
    "bulkhead": lambda mp, tmp: mp.setattr(
        BulkheadCore, "try_enter", _endless_queue(BulkheadCore.try_enter)
    ),
    "redaction": lambda mp, tmp: (
        mp.setattr(Redactor, "fields", lambda self, fields: fields),
        mp.setattr(Redactor, "text", lambda self, text: (text, False)),
        mp.setattr(Redactor, "maybe", lambda self, text: False),
    ),
    "egress": lambda mp, tmp: mp.setattr(
        EgressRule, "check", lambda self, host, port: Allowed(host, port, "egress.allow[0]")
    ),
    "caps-reserve": lambda mp, tmp: mp.setattr(
        CapsGuard, "reserve", _under_reserve(CapsGuard.reserve)
    ),
    "caps-deny": lambda mp, tmp: mp.setattr(CapsGuard, "_stop_if_kill", _deny_kills),
    "caps-kill": lambda mp, tmp: mp.setattr(Boundary, "stop", lambda self, *a, **k: None),
    "evidence-guard": lambda mp, tmp: mp.setattr(
        Recorder, "evidence_lost", lambda self, lost: None
    ),
    "clock-step": lambda mp, tmp: mp.setattr(Clock, "mono", lambda self: self._raw_mono()),
    "stream": lambda mp, tmp: mp.setattr(provider_base, "parse_block", lambda block: None),
    "metrics": lambda mp, tmp: mp.setattr(Metrics, "refused", lambda self, p, e: None),
    "key-swap": lambda mp, tmp: mp.setattr(
        openai_shape, "credential", lambda key: (b"authorization", b"Bearer not-the-key")
    ),
    "receipt": lambda mp, tmp: mp.setattr(
        verify_module, "first_difference", lambda *a: ("totals.usd", "differs")
    ),
    "torn-tail": lambda mp, tmp: mp.setattr(
        doctor, "iter_lines", lambda p: (x for x in iter_lines(p) if x.complete)
    ),
    "vectors": lambda mp, tmp: mp.setattr(
        checks_evidence, "vectors_folder", _flipped_manifest(tmp)
    ),
}


# Without one here: record, bad-request, deadline, unpriced and write-fault (no seam that
# breaks them alone without reaching into a line of code), and tamper (two defences catch
# a flipped byte, the chain and the claims: no one break lets it through).


@pytest.mark.parametrize("name", sorted(SABOTAGE))
async def test_a_check_fails_when_its_mechanism_is_broken(name, monkeypatch, tmp_path):
    check: Check = CHECKS[name]  # it passes unbroken: the first test runs them all
    SABOTAGE[name](monkeypatch, tmp_path)
    result = await run_one(check)
    assert not result.ok, f"{name} passed with its mechanism broken: {result.detail}"


def test_the_wheel_carries_every_vector_file():
    """pyproject maps spec/vectors into docket.selftest.vectors; its package-data globs
    must take every vector file (a new kind of file would be left out of the wheel)."""
    import fnmatch
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["docket.selftest.vectors"] == "spec/vectors"
    globs = setuptools["package-data"]["docket.selftest.vectors"]
    folder = ROOT / "spec" / "vectors"
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert len(on_disk) > 90  # the walk found the vectors
    # the generators (modules of the package, shipped as such) and git's settings
    on_disk -= {"make_vectors.py", "make_attestation_vectors.py", ".gitattributes"}
    left_out = {
        n for n in on_disk - {"make_vectors.py"} if not any(fnmatch.fnmatch(n, g) for g in globs)
    }
    assert left_out == set()
