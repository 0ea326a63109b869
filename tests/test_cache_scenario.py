"""scenarios/cache-loop.yaml through the real `docket chaos`: an
agent stuck on one greedy question, [cache] on. Everything is read from the run's folder:
the hits happened, the provider saw only the calls the cache could not answer, the
receipt's saving is the sum over the cache.hit events, each hit replays a stored
model.response to the same request bytes, and `docket verify` re-derives the receipt."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal

from helpers import read_chain

from chaos.data.locate import folder as data_folder
from docket.values import format_usd

TIMEOUT = 60


def docket(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "docket", *argv], capture_output=True, text=True, timeout=TIMEOUT
    )


def test_the_cache_loop_scenario_serves_the_repeats_and_the_receipt_adds_up(tmp_path):
    scenario = data_folder("scenarios") / "cache-loop.yaml"
    run_dir = tmp_path / "run"
    done = docket("chaos", "--scenario", str(scenario), "--dir", str(run_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr

    events = read_chain(run_dir / "ledger.jsonl")
    by_seq = {e["seq"]: e for e in events}
    requests = {e["call_id"]: e for e in events if e["type"] == "model.request"}
    hits = [e for e in events if e["type"] == "cache.hit"]
    # 20 identical calls: the 503 (call 1) and the answer without usage (call 2) are not
    # stored, call 3's is, and the 17 after it are served from the cache.
    assert len(requests) == 3 and len(hits) == 17
    assert len({e["request_sha256"] for e in [*requests.values(), *hits]}) == 1
    assert [e["cache_refused"] for e in events if "cache_refused" in e] == [
        "not_2xx",
        "usage_missing",
    ]
    for hit in hits:
        replayed = by_seq[hit["replays_seq"]]
        assert replayed["type"] == "model.response" and replayed["cache_stored"] is True
        assert requests[replayed["call_id"]]["request_sha256"] == hit["request_sha256"]
        assert replayed["seq"] < hit["seq"]
        assert hit["saved_nusd"] == replayed["cost_nusd"] > 0
    assert [h["hits"] for h in hits] == list(range(1, 18))

    receipt = json.loads((run_dir / "receipt.json").read_text())
    cache = receipt["ops"]["cache"]
    assert cache["saved_nusd"] == sum(h["saved_nusd"] for h in hits)
    assert (cache["hits"], cache["misses"], cache["stored"]) == (17, 3, 1)
    assert cache["refused_by_reason"] == {"not_2xx": 1, "usage_missing": 1}
    assert receipt["totals"]["model_calls"] == 3  # the hits were not paid for

    # the provider saw the three forwarded calls, never a hit; the agent got 20 answers
    stub_log = (run_dir / "stub-openai.jsonl").read_text().splitlines()
    assert len(stub_log) == 3
    report = json.loads((run_dir / "agents" / "looper.out").read_text().splitlines()[-1])
    assert (report["mode"], report["calls"], report["ok"]) == ("repeat", 20, 19)
    assert report["refused"] == {"503": 1}

    saved = format_usd(Decimal(cache["saved_nusd"]) / 10**9)
    assert f"cache: 17 hit(s) saving ${saved}, 3 miss(es), 1 stored" in done.stdout, done.stdout
    verified = docket("verify", str(run_dir / "receipt.json"))
    assert verified.returncode == 0, verified.stdout + verified.stderr
