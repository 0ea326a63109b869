"""`docket verify --json`: one object per verdict, in the other two verifiers' shape.

Every committed vector goes through the CLI's main() in-process (fast) and its
object must name the manifest's verdict, exit, code, seq, offset and field; one
vector per verdict goes through node's verify.mjs --json too, and the two objects
must agree on every name they share. On ok, `claims` is held to verify.CLAIMS (the one
table the comparison walks, which must cover every claim member of the receipt) and to
what the ok vectors' ledgers on disk say."""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from docket.cli import main
from docket.receipts.receipt import RECEIPT_SHAPE, _Optional
from docket.receipts.tally import OPTIONAL_CLAIMS, Tally
from docket.receipts.verify import CLAIMS, REQUIRED, verify
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


def run_json(vector: dict, capsys, parse_float=float) -> tuple[int, dict, str]:
    if vector["name"] in FOLDER_AS_RUN:
        code = verify_json_command(str(VECTORS / vector["receipt"]), None)
    else:
        code = main(["verify", *argv(vector), "--json"])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1, out  # one object, one line, whatever the verdict
    return code, json.loads(lines[0], parse_float=parse_float), err


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


# ------------------------------------------------ every claim verify compares, named

# The receipt's members that are not claims: the format's name, the ledger's own figures
# (the verdict's events, head and bytes) and ops.evidence, the writer's disclosure (held to
# the ledger, not derived from it). Every other member is a claim.
NOT_CLAIMS = {"format", "ledger", "ops.evidence"}
OK_VECTORS = sorted(n for n, v in BY_NAME.items() if v["verdict"] == "ok")
OPTIONAL_PARENTS = {p: {m for q, m in OPTIONAL_CLAIMS if q == p} for p, _ in OPTIONAL_CLAIMS}


def receipt_members() -> dict[str, object]:
    """The receipt's members and ops' (each with its shape), as dotted paths."""
    members = {k: s for k, s in RECEIPT_SHAPE.items() if k != "ops"}
    members |= {f"ops.{k}": s for k, s in RECEIPT_SHAPE["ops"].items()}
    return {p: s for p, s in members.items() if p not in NOT_CLAIMS}


def test_the_table_names_every_member_of_the_receipt_that_is_a_claim():
    """verify compares only what CLAIMS lists, and CLAIMS lists every member of the receipt's
    shape but the three that are not claims: a new member of the receipt fails here until
    the table (hence the comparison and --json's `claims`) has it."""
    paths = [c.path for c in CLAIMS]
    assert len(set(paths)) == len(paths)
    members = receipt_members()
    assert set(paths) == set(members)
    # what a receipt without the member states: the table's `absent` exactly when the shape
    # lets the receipt omit it
    for claim in CLAIMS:
        assert (claim.absent is REQUIRED) is not isinstance(members[claim.path], _Optional)
    # every claim the tally's fold gives is in the table (derive_claims keeps only those)
    assert set(Tally().to_claims()) <= set(paths)


def test_the_spec_lists_the_claims_in_the_tables_order():
    """Section 10's `claims` paragraph names CLAIMS' paths, in its order."""
    text = " ".join((ROOT / "spec" / "docket-receipt-1.md").read_text(encoding="utf-8").split())
    start = text.index("in the order compared (section 8, steps 11 and 12): ")
    listed = text[start : text.index(". Each holds", start)]
    assert re.findall(r"`([a-z_.]+)`", listed) == [c.path for c in CLAIMS]


@pytest.mark.parametrize("name", OK_VECTORS)
def test_the_claims_are_the_tables_paths_in_its_order(name, capsys):
    code, report, _ = run_json(BY_NAME[name], capsys)
    assert code == 0
    assert list(report["claims"]) == [c.path for c in CLAIMS]


def ledger_of(vector: dict) -> Path:
    """The ledger an ok vector verifies against: the manifest's, else the receipt's own."""
    if vector["ledger"]:
        return VECTORS / vector["ledger"]
    receipt = VECTORS / vector["receipt"]
    return receipt.parent / json.loads(receipt.read_text(encoding="utf-8"))["ledger"]["file"]


def first_leaf(value: object, path: str) -> tuple[str, object] | None:
    """The first integer or string in `value` (keys in code-point order), as (path, it)."""
    if type(value) is int or type(value) is str:
        return path, value
    items = sorted(value.items()) if isinstance(value, dict) else []
    if isinstance(value, list):
        items = [(i, v) for i, v in enumerate(value)]
    for key, member in items:
        found = first_leaf(member, f"{path}[{key}]" if type(key) is int else f"{path}.{key}")
        if found:
            return found
    return None


def changed(value: int | str) -> int | str:
    """A different value of the same form: a count one more; a text whose last character
    becomes a digit, another one if it was one (a hex digest and a price stay well formed)."""
    if type(value) is int:
        return value + 1
    return value[:-1] + ("1" if value.endswith("0") else "0")


def set_at(document: dict, path: str, value: object) -> None:
    keys = re.findall(r"[^.\[\]]+", path)
    holder: Any = document
    for key in keys[:-1]:
        holder = holder[int(key) if type(holder) is list else key]
    holder[int(keys[-1]) if type(holder) is list else keys[-1]] = value


@pytest.mark.parametrize("path", sorted(receipt_members()))
def test_each_claim_of_the_receipt_is_compared_under_its_tables_code(path, tmp_path):
    """For every member of the receipt that is a claim: change one value of it in an ok
    vector's receipt, and verify fails with the code CLAIMS gives that path, naming it. A
    claim compared outside the table, or not at all, fails here."""
    code = {c.path: c.code for c in CLAIMS}[path]
    for name in OK_VECTORS:
        vector = BY_NAME[name]
        receipt = json.loads((VECTORS / vector["receipt"]).read_text(encoding="utf-8"))
        holder = receipt["ops"] if path.startswith("ops.") else receipt
        member = path.removeprefix("ops.")
        leaf = first_leaf(holder[member], path) if member in holder else None
        if leaf is not None:
            break
    else:
        pytest.fail(f"no ok vector's receipt states a number or text under {path}")
    written = tmp_path / "receipt.json"
    written.write_text(json.dumps(receipt), encoding="utf-8")
    assert verify(written, ledger_of(vector)).ok  # re-encoded as it was, it still holds
    where, value = leaf
    set_at(receipt, where, changed(value))
    written.write_text(json.dumps(receipt), encoding="utf-8")
    verdict = verify(written, ledger_of(vector))
    assert (verdict.ok, verdict.code, verdict.field) == (False, code, where), verdict.detail


# What a ledger's lines on disk say, by hand from spec sections 7.5-7.8.


def ok_ledger_events(vector: dict) -> list[dict]:
    """The events an ok vector's receipt vouches for: its first ledger.events lines."""
    lines = ledger_of(vector).read_bytes().split(b"\n")[: vector["events"]]
    return [json.loads(line) for line in lines]


def open_calls_by_hand(events: list[dict]) -> list[dict]:
    closed = {e["call_id"] for e in events if e["type"] in ("model.response", "model.error")}
    return [
        {"call_id": e["call_id"], "seq": e["seq"]}
        for e in events
        if e["type"] == "model.request" and e["call_id"] not in closed
    ]


def client_retries_by_hand(events: list[dict]) -> dict:
    attempts = [e["client_attempt"] for e in events if "client_attempt" in e]
    return {
        "marked": len(attempts),
        "retries": sum(a >= 1 for a in attempts),
        "by_attempt": {str(a): attempts.count(a) for a in sorted(set(attempts))},
    }


def cache_by_hand(events: list[dict]) -> dict:
    hits = [e for e in events if e["type"] == "cache.hit"]
    refused = [e["cache_refused"] for e in events if "cache_refused" in e]
    return {
        "hits": len(hits),
        "misses": sum(e.get("cache") == "miss" for e in events),
        "stored": sum(e.get("cache_stored") is True for e in events),
        "refused_by_reason": {r: refused.count(r) for r in sorted(set(refused))},
        "saved_nusd": sum(e["saved_nusd"] for e in hits),
    }


def snapshot_by_hand(events: list[dict]) -> list[dict]:
    roots = []
    for taken in sorted(
        (e for e in events if e["type"] == "snapshot.taken"), key=lambda e: e["index"]
    ):
        changes = [
            e["counts"]
            for e in events
            if e["type"] == "snapshot.changes" and e["index"] == taken["index"]
            if "error" not in e
        ]
        restored = [
            {"applied": e["applied"], "failed": len(e["failed"]), "verified": e["verified"]}
            for e in events
            if e["type"] == "snapshot.restored" and e["index"] == taken["index"]
        ]
        keys = ("index", "root", "manifest_sha256", "files", "bytes")
        roots.append(
            {k: taken[k] for k in keys}
            | {
                "changes": changes[-1] if changes else None,
                "restored": restored[-1] if restored else None,
            }
        )
    return roots


@pytest.mark.parametrize("name", OK_VECTORS)
def test_the_claims_hold_what_the_ledger_on_disk_says(name, capsys):
    """ops.open_calls, ops.client_retries, ops.cache and snapshot as `claims` gives them are
    what the vector's ledger lines say, counted by hand; and every claim is the receipt's
    where it states one (an ok verdict), the section 6.5 claims the receipt omits aside."""
    vector = BY_NAME[name]
    # numbers compared by value, as verify compares them (1e+300 is 10**300)
    code, report, _ = run_json(vector, capsys, parse_float=Decimal)
    assert code == 0
    claims, events = report["claims"], ok_ledger_events(vector)
    assert claims["ops.open_calls"] == open_calls_by_hand(events)
    assert claims["ops.client_retries"] == client_retries_by_hand(events)
    assert claims["ops.cache"] == cache_by_hand(events)
    assert claims["snapshot"] == snapshot_by_hand(events)
    text = (VECTORS / vector["receipt"]).read_text(encoding="utf-8")
    receipt = json.loads(text, parse_float=Decimal)
    for claim in CLAIMS:
        holder = receipt["ops"] if claim.path.startswith("ops.") else receipt
        stated = holder.get(claim.path.removeprefix("ops."), claim.absent)
        if claim.path in vector["unbacked"]:
            assert claims[claim.path] is None
        elif claim.path in OPTIONAL_PARENTS:
            # whole: every optional claim of section 6.5, whether the receipt makes it or not
            assert {k: claims[claim.path][k] for k in stated} == stated, claim.path
            assert OPTIONAL_PARENTS[claim.path] <= set(claims[claim.path])
        else:
            assert claims[claim.path] == stated, claim.path
