"""The receipt tells every refusal, and which endpoint answered, over the game day's
real ledgers (spec section 6.5).

For each of the nine phases, every receipt it left is read beside its ledger's raw
lines on disk, counted here from the spec's table (not by docket.receipts): refusals by
rule, breaker transitions, faults by layer, calls per provider and per upstream base
URL. The receipt must state exactly those counts, and all three verifiers (Python,
JavaScript, Go) must accept it. The game day is the suite's one shared run
(tests/conftest.py gameday_run, its --keep folder), never run again here.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from chaos.verifiers import find_go, find_js, verify_in_process

ROOT = Path(__file__).resolve().parent.parent
# The nine shipped phases, by the names their evidence is kept under (gamedays/NN-NAME.yaml).
PHASES = sorted(re.sub(r"^\d+-", "", p.stem) for p in (ROOT / "gamedays").glob("*.yaml"))
# A phase that kills the supervisor leaves no receipt: nothing wrote one.
NO_RECEIPT = {"supervisor-killed"}

# Spec section 6.5: the refusal events that are one guard's, and the rule each counts under.
GUARDS = {
    "x-docket.rate-limited": "rate_limit",
    "x-docket.breaker-open": "breaker",
    "load.shed": "load_shed",
    "net.denied": "egress",
}


def test_the_nine_phases_are_there():
    assert len(PHASES) == 9, PHASES


@pytest.fixture(scope="module")
def evidence(gameday_run) -> Path:
    if not gameday_run.keep.is_dir():
        pytest.fail(f"the game day kept no evidence: {gameday_run.output[-2000:]}")
    return gameday_run.keep


@pytest.fixture(scope="module")
def verifiers(tmp_path_factory):
    """The JavaScript and Go verifiers (Python's runs in this process)."""
    found = [find_js(), find_go(build_dir=tmp_path_factory.mktemp("go-verifier"))]
    for v in found:
        if v.broken:
            pytest.fail(f"the {v.name} verifier cannot run: {v.broken}")
    absent = [f"{v.name}: {v.absent}" for v in found if v.absent]
    if absent:
        pytest.skip("; ".join(absent))
    return found


def receipts_of(evidence: Path, phase: str) -> list[Path]:
    return sorted((evidence / phase).rglob("receipt.json"))


def ledger_events(receipt: dict, receipt_path: Path) -> list[dict]:
    """The ledger's first `ledger.events` lines (what the receipt vouches for), decoded
    with the standard library from the bytes on disk."""
    data = (receipt_path.parent / receipt["ledger"]["file"]).read_bytes()
    lines = data.split(b"\n")[: receipt["ledger"]["events"]]
    return [json.loads(line) for line in lines]


def counted(events: list[dict]) -> dict:
    """Section 6.5's counts, from the events by hand."""
    rules: Counter[str] = Counter()
    transitions: dict = defaultdict(lambda: defaultdict(Counter))
    layers: Counter[str] = Counter()
    calls_by_provider: Counter[str] = Counter()
    calls_by_upstream: Counter[str] = Counter()
    for e in events:
        kind = e["type"]
        if kind in GUARDS:
            rules[GUARDS[kind]] += 1
        elif kind == "policy.denied":
            rule = e.get("rule")
            rules["policy" if rule is None else rule.split(".")[0]] += 1
        elif kind == "session.end":
            rules.update(e.get("refused_unrecorded") or {})
        elif kind == "breaker.state":
            transitions[e.get("upstream") or ""][e["from"]][e["to"]] += 1
        elif kind == "fault.injected":
            target = e.get("target")
            layers[e["fault"].lstrip(" \t").split(":")[0] if target is None else target] += 1
        elif kind == "model.request":
            calls_by_provider[e.get("provider") or ""] += 1
            calls_by_upstream[e.get("base_url") or ""] += 1
    return {
        "refused_by_rule": dict(rules),
        "breaker_transitions": {
            u: {f: dict(tos) for f, tos in froms.items()} for u, froms in transitions.items()
        },
        "by_layer": dict(layers),
        "calls_by_provider": dict(calls_by_provider),
        "calls_by_upstream": dict(calls_by_upstream),
    }


def stated(receipt: dict) -> dict:
    """The same counts as the receipt states them (an empty claim is omitted: {})."""
    totals = receipt["totals"]
    return {
        "refused_by_rule": totals.get("refused_by_rule", {}),
        "breaker_transitions": totals.get("breaker_transitions", {}),
        "by_layer": receipt["faults"].get("by_layer", {}),
        "calls_by_provider": {
            p: c["model_calls"]
            for p, c in totals.get("by_provider", {}).items()
            if c["model_calls"]
        },
        "calls_by_upstream": {
            u: c["model_calls"]
            for u, c in totals.get("by_upstream", {}).items()
            if c["model_calls"]
        },
    }


@pytest.fixture(scope="module")
def by_phase(evidence) -> dict[str, list[tuple[Path, dict, dict]]]:
    """Each phase's receipts: (path, the receipt, the counts its ledger's lines give)."""
    out = {}
    for phase in PHASES:
        out[phase] = []
        for path in receipts_of(evidence, phase):
            receipt = json.loads(path.read_text(encoding="utf-8"))
            out[phase].append((path, receipt, counted(ledger_events(receipt, path))))
    return out


@pytest.mark.parametrize("phase", PHASES)
def test_the_receipt_counts_what_the_ledger_holds(phase, by_phase, evidence, verifiers):
    runs = by_phase[phase]
    if phase in NO_RECEIPT:
        # The supervisor was killed: no receipt, and no session.end in any of its ledgers.
        assert runs == []
        ledgers = sorted((evidence / phase).rglob("ledger.jsonl"))
        assert ledgers, f"{phase} kept no ledger"
        for ledger in ledgers:
            assert b'"type":"session.end"' not in ledger.read_bytes(), ledger
        return
    assert runs, f"{phase} left no receipt under {evidence / phase}"
    for path, receipt, from_ledger in runs:
        assert stated(receipt) == from_ledger, path
        # ...and what the receipt states re-derives in all three verifiers.
        answers = {"python": verify_in_process(path)}
        answers |= {v.name: v.run(path) for v in verifiers}
        for name, answer in answers.items():
            assert answer.code == "ok", f"{name} on {path}: {answer.said}"


def test_some_phase_refuses_by_rate_limit_and_by_breaker(by_phase):
    """The counts above are not all zero: the game day's guards refuse, and the
    receipts say so (a receipt that stopped counting one would fail the test above)."""
    totals: Counter[str] = Counter()
    transitions = 0
    for runs in by_phase.values():
        for _, receipt, from_ledger in runs:
            totals.update(from_ledger["refused_by_rule"])
            transitions += sum(
                n
                for froms in from_ledger["breaker_transitions"].values()
                for tos in froms.values()
                for n in tos.values()
            )
            assert receipt["totals"].get("refused_by_rule", {}) == from_ledger["refused_by_rule"]
    assert totals["rate_limit"] > 0, totals
    assert totals["breaker"] > 0, totals
    assert transitions > 0


def test_a_receipt_that_hides_a_rate_limited_call_fails_in_all_three(by_phase, verifiers, tmp_path):
    """One rate-limited refusal taken out of a real receipt: each verifier names the claim."""
    path, receipt = next(
        (p, r)
        for runs in by_phase.values()
        for p, r, counts in runs
        if counts["refused_by_rule"].get("rate_limit")
    )
    forged = json.loads(json.dumps(receipt))
    forged["totals"]["refused_by_rule"]["rate_limit"] -= 1
    forged_path = tmp_path / "receipt.json"
    forged_path.write_text(json.dumps(forged, indent=2, sort_keys=True), encoding="utf-8")
    ledger = path.parent / receipt["ledger"]["file"]
    answers = {"python": verify_in_process(forged_path, ledger)}
    answers |= {v.name: v.run(forged_path, ledger) for v in verifiers}
    for name, answer in answers.items():
        assert answer.code == "total_mismatch", f"{name}: {answer.said}"
        assert "totals.refused_by_rule.rate_limit" in answer.said, f"{name}: {answer.said}"
