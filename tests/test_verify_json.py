"""`docket verify --json`: one object per verdict, in the other two verifiers' shape.

Every committed vector goes through the CLI's main() in-process (fast) and its
object must name the manifest's verdict, exit, code, seq, offset and field; one
vector per verdict goes through node's verify.mjs --json too, and the two objects
must agree on every name they share."""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

from docket.cli import main
from docket.receipts.verify_report import verify_json_command

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "spec" / "vectors"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))["vectors"]
BY_NAME = {v["name"]: v for v in MANIFEST}


def argv(vector: dict) -> list[str]:
    args = [str(VECTORS / vector["receipt"])]
    if vector["ledger"]:
        args += ["--ledger", str(VECTORS / vector["ledger"])]
    return args


# `docket verify` takes a run's folder as the run (docket/reading/run_paths.py); the
# verifier itself, given a folder as the receipt, says receipt_unreadable as the spec has it.
FOLDER_AS_RUN = {"input-receipt-directory"}


def run_json(vector: dict, capsys) -> tuple[int, dict, str]:
    if vector["name"] in FOLDER_AS_RUN:
        code = verify_json_command(str(VECTORS / vector["receipt"]), None)
    else:
        code = main(["verify", *argv(vector), "--json"])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1, out  # one object, one line, whatever the verdict
    return code, json.loads(lines[0]), err


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_vector_as_json(name, capsys):
    vector = BY_NAME[name]
    code, report, err = run_json(vector, capsys)
    assert err == ""
    assert code == report["exit"] == vector["exit"]
    assert report["verdict"] == vector["verdict"]
    assert report["ok"] is (vector["verdict"] == "ok")
    assert report["code"] == vector["code"]
    if vector["verdict"] != "input_error":
        assert (report["seq"], report["offset"], report["field"]) == (
            vector["seq"],
            vector["offset"],
            vector["field"],
        )
    if vector["verdict"] == "ok":
        assert (report["events"], report["head"], report["bytes"]) == (
            vector["events"],
            vector["head"],
            vector["bytes"],
        )
        assert report["unbacked"] == vector["unbacked"]
        assert report["claims"]["totals"]["model_calls"] >= 0
        assert report["message"].startswith(f"ok: {vector['events']} events")


def test_the_cli_reads_a_folder_as_the_run(capsys):
    vector = BY_NAME["input-receipt-directory"]
    assert main(["verify", *argv(vector), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "ok"


def test_the_text_form_is_unchanged(capsys):
    vector = BY_NAME["ok-basic"]
    assert main(["verify", *argv(vector)]) == 0
    assert capsys.readouterr().out.startswith("ok: 16 events, head ")


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("name", ["ok-basic", "edited-field", "input-receipt-not-json"])
def test_the_same_names_as_verify_js(name, capsys):
    vector = BY_NAME[name]
    _, ours, _ = run_json(vector, capsys)
    done = subprocess.run(
        ["node", str(ROOT / "verify-js" / "verify.mjs"), *argv(vector), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    theirs = json.loads(done.stdout)
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    # Every name both give, the same value; the wording of an input error is each
    # program's own (the code is what is shared).
    shared = set(theirs) - ({"message"} if vector["verdict"] == "input_error" else set())
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}
    assert len(shared) >= 7


def test_the_claims_name_refusals_by_rule_endpoints_breakers_and_layers(capsys):
    """verify --json's `claims` (the claims it re-derived) name section 6.5's five, with
    the counts the vector's ledger holds (spec/vectors/make_vectors.py refusal_run)."""
    code, report, _ = run_json(BY_NAME["ok-refusals-by-rule"], capsys)
    assert code == 0
    totals, faults = report["claims"]["totals"], report["claims"]["faults"]
    # the builder's count of refusal_run's refusals, by hand from its events
    by_hand = runpy.run_path(str(VECTORS / "make_vectors.py"))["REFUSED_BY_RULE"]
    assert totals["refused_by_rule"] == by_hand
    assert totals["breaker_transitions"] == {
        "openai": {"closed": {"open": 1}, "open": {"half_open": 1}, "half_open": {"closed": 1}}
    }
    assert faults["by_layer"] == {"upstream": 2, "net": 1}
    assert {p: c["model_calls"] for p, c in totals["by_provider"].items()} == {
        "anthropic": 1,
        "openai": 4,
    }
    assert {u: (c["responses"], c["errors"]) for u, c in totals["by_upstream"].items()} == {
        "https://api.anthropic.com": (1, 0),
        "https://api.openai.com/v1": (2, 2),
    }


def ledger_events(name: str) -> list[dict]:
    """The events of an ok vector's ledger (beside its receipt), as on disk."""
    text = (VECTORS / name / "ledger.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_the_claims_name_a_replays_origin_and_a_fleet_runs_budget(capsys):
    """verify --json's `claims` name replay_of (section 7.9) and fleet (7.10), which verify
    checks after the others, as the ledger's own lines say them; null for a run with neither."""
    code, report, _ = run_json(BY_NAME["ok-replay"], capsys)
    assert code == 0
    start = ledger_events("ok-replay")[0]
    assert report["claims"]["replay_of"] == start["replay_of"]
    assert len(report["claims"]["replay_of"]["head"]) == 64
    assert report["claims"]["fleet"] is None

    code, report, _ = run_json(BY_NAME["ok-fleet"], capsys)
    assert code == 0
    events = ledger_events("ok-fleet")
    fleet = report["claims"]["fleet"]
    assert {k: fleet[k] for k in ("budget", "database")} == events[0]["fleet"]
    changes = [e["change"] for e in events if e["type"] == "fleet.lease"]
    assert fleet["leases"] == {c: changes.count(c) for c in sorted(set(changes))}
    assert fleet["store_failures"] == sum(e["type"] == "fleet.store" for e in events) == 1
    codes = [e["code"] for e in events if e.get("rule", "").startswith("fleet.")]
    assert fleet["refused_by_code"] == {c: codes.count(c) for c in sorted(set(codes))}
    assert fleet["ended"] == "returned" == changes[-1]
    assert report["claims"]["replay_of"] is None

    code, report, _ = run_json(BY_NAME["ok-basic"], capsys)
    assert code == 0
    assert (report["claims"]["replay_of"], report["claims"]["fleet"]) == (None, None)
