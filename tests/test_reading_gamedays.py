"""explain over the nine game-day phases' real ledgers: the runaway loop and the retry
storms are named where the ledgers show them, and nothing is named where they show neither.

The game day runs once for the whole suite (tests/conftest.py gameday_run, in a child
process); each phase's evidence is kept (--keep) and read back from disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from docket.cli import main
from docket.reading.explain import explain_ledger

# What each phase's ledger shows, by the evidence in it (docs/reading.md):
# - runaway-loop (both runs): a loop and a hammer send near-same calls until a cap refuses them.
# - retry-storm: the hammer calls again within milliseconds of each 429 that said Retry-After.
# - partition: the looper and the hammer call again within milliseconds of each load-shed
#   503 that said Retry-After: 1 s (~49 times): the same storm, against the bulkhead.
# - retry-budget: the backing-off agent rides out the breaker's outage with more retries
#   than 0.1 per call + 3 (the phase raises its own budget's floor so that it can).
SHOWS = {
    "circuit-breaker/run": {"retry-budget"},
    "runaway-loop/deny": {"runaway-loop"},
    "runaway-loop/kill": {"runaway-loop"},
    "retry-storm/run": {"retry-storm"},
    "partition/run": {"retry-storm"},
}
# The phases that show neither: nothing may be named (their loops stop short of any cap,
# their few quick retries are no storm, and their spend follows their calls).
NEITHER = [
    "upstream-failure/run",
    "upstream-latency/run",
    "ledger-pressure/events",
    "ledger-pressure/bytes",
    "evidence-loss/goes-on",
    "evidence-loss/fail-fast",
    "supervisor-killed/kill",
    "supervisor-killed/mid-write",  # torn by the kill: read through doctor's repaired copy
]


@pytest.fixture(scope="module")
def evidence(gameday_run) -> Path:
    """The session's one game day (tests/conftest.py gameday_run), its kept evidence."""
    if not gameday_run.keep.is_dir():
        pytest.fail(f"the game day kept no evidence: {gameday_run.output[-2000:]}")
    return gameday_run.keep


def ledger_of(evidence: Path, name: str) -> Path:
    phase, run = name.split("/")
    folder = evidence / phase / run
    return folder / "run" / "ledger.jsonl" if (folder / "run").is_dir() else folder / "ledger.jsonl"


def named(path: Path) -> set[str]:
    return {f["pattern"] for f in explain_ledger(path)["findings"]}


def test_every_phases_ledger_was_kept(evidence):
    for name in [*SHOWS, *NEITHER]:
        assert ledger_of(evidence, name).is_file(), name


@pytest.mark.parametrize("name", sorted(SHOWS))
def test_explain_names_what_the_phase_shows(evidence, name):
    found = named(ledger_of(evidence, name))
    assert SHOWS[name] <= found, f"{name}: named {found}"
    other = {"runaway-loop", "retry-storm"} - SHOWS[name]
    assert not (found & other), f"{name}: named {found & other} too"


@pytest.mark.parametrize("name", NEITHER)
def test_explain_names_nothing_where_the_phase_shows_neither(evidence, name, tmp_path, capsys):
    path = ledger_of(evidence, name)
    if name == "supervisor-killed/mid-write":
        # The kill tore the ledger's last line: explain refuses it, naming the tear...
        assert main(["explain", str(path)]) == 2
        assert "torn tail" in capsys.readouterr().err
        # ...and explains the readable prefix doctor keeps.
        copy = tmp_path / "ledger.jsonl"
        shutil.copy(path, copy)
        assert main(["doctor", "--quarantine-torn-tail", str(copy)]) == 0
        path = tmp_path / "ledger.jsonl.repaired"
    assert named(path) == set()


def test_retry_budget_on_a_real_ledger_agrees_with_its_receipt(evidence):
    ledger = ledger_of(evidence, "circuit-breaker/run")
    (found,) = [f for f in explain_ledger(ledger)["findings"] if f["pattern"] == "retry-budget"]
    ev = found["evidence"]
    receipt = json.loads((ledger.parent / "receipt.json").read_text())
    # the receipt counts the forwarded retries; the budget counts the refused ones too
    forwarded = receipt["ops"]["client_retries"]["retries"]
    assert ev["retries"] - ev["refused_retries"] == forwarded
    assert ev["retries"] > 3 + 0.1 * ev["first_attempts"]
    assert ev["arithmetic"].startswith(f"{ev['retries']} retries > 0.1 x {ev['first_attempts']}")


def test_diff_of_real_receipts(evidence, capsys):
    storm = ledger_of(evidence, "retry-storm/run").parent / "receipt.json"
    kill = ledger_of(evidence, "runaway-loop/kill").parent / "receipt.json"
    assert main(["diff", str(storm), str(storm)]) == 0
    assert main(["diff", str(storm), str(kill), "--json"]) == 1
    out = capsys.readouterr().out
    assert '"figure": "caps.breached.max_model_calls"' in out
    assert '"figure": "refusals.resilience.max_calls_per_second"' in out
