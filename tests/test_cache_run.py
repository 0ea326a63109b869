"""A looping agent under a real `docket run` with [cache] on: the real
openai SDK asks the same greedy question five times (and one stream twice, and a
sampled question twice); the repeats are served from the cache, the receipt's
ops.cache says so, its saving equals the sum over the cache.hit events on disk,
and verify re-derives it (and catches a receipt that overstates the saving)."""

from __future__ import annotations

import json
import sys
import textwrap

import trio
from helpers import read_chain

from chaos.stub.server import Behaviour, Stub, StubConfig
from docket.reading.explain import explain_ledger
from docket.receipts.verify import verify
from docket.run.hooks import RunHooks
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

DEADLINE = 90  # one supervised run on a shared 2-core machine
REAL_KEY = "sk-real-upstream-key-cache-0a1b2c3d"

AGENT = textwrap.dedent(
    """
    import openai
    client = openai.OpenAI(max_retries=0, timeout=20)
    ask = [{"role": "user", "content": "are we there yet?"}]
    for _ in range(5):  # the loop: the same call, again and again
        client.chat.completions.create(model="gpt-4o-mini", messages=ask, temperature=0, max_tokens=8)
    for _ in range(2):
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=ask, temperature=0, max_tokens=8, stream=True
        )
        print("".join(c.choices[0].delta.content or "" for c in stream if c.choices), flush=True)
    for _ in range(2):  # sampled: never served from the cache
        client.chat.completions.create(model="gpt-4o-mini", messages=ask, temperature=0.9, max_tokens=8)
    """
)


async def run_agent(stub_server, tmp_path, cache: str):
    policy = tmp_path / "docket.toml"
    out_path = tmp_path / "agent.out"
    with trio.fail_after(DEADLINE), out_path.open("w") as out:
        async with stub_server("openai", reply_tokens=6) as stub:
            policy.write_text(
                f'[providers.openai]\nkind = "openai"\nbase_url = "{stub.url}"\n'
                f'key_env = "STUB_KEY"\n{cache}'
            )
            run = RunOptions(
                command=[sys.executable, "-c", AGENT],
                policy_path=str(policy),
                ledger_dir=str(tmp_path / "run"),
                stdout=out,
            )
            outcome = await Supervisor(run).run()
            forwarded = len(stub.log)
    assert outcome.exit_status == 0, outcome.reason
    return outcome, forwarded, out_path


async def test_a_looping_agent_is_served_from_the_cache(stub_server, tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    cache = '[cache]\nenabled = true\nttl = "10m"\n'
    outcome, forwarded, out_path = await run_agent(stub_server, tmp_path, cache)
    streamed = out_path.read_text().splitlines()
    assert len(streamed) == 2 and streamed[0] and streamed[0] == streamed[1]
    assert forwarded == 4  # one greedy whole, one greedy stream, two sampled

    events = read_chain(outcome.ledger)
    hits = [e for e in events if e["type"] == "cache.hit"]
    by_seq = {e["seq"]: e for e in events}
    assert len(hits) == 5
    for hit in hits:  # each saving is what the answer it replays cost
        assert hit["saved_nusd"] == by_seq[hit["replays_seq"]]["cost_nusd"] > 0
    receipt = json.loads(outcome.receipt.read_text())
    assert receipt["ops"]["cache"] == {
        "hits": 5,
        "misses": 2,
        "stored": 2,
        "refused_by_reason": {"temperature": 2},
        "saved_nusd": sum(h["saved_nusd"] for h in hits),
    }
    assert receipt["totals"]["model_calls"] == 4
    verdict = verify(outcome.receipt)
    assert verdict.ok, verdict.summary()
    # explain's cache-miss pattern: the hits were not paid for, so nothing to name.
    names = [f["pattern"] for f in explain_ledger(outcome.ledger)["findings"]]
    assert "cache-miss" not in names, names

    receipt["ops"]["cache"]["saved_nusd"] += 1  # a receipt that claims more than was saved
    outcome.receipt.write_text(json.dumps(receipt))
    verdict = verify(outcome.receipt)
    assert not verdict.ok and verdict.code == "cache_mismatch", verdict.summary()
    assert verdict.field == "ops.cache.saved_nusd"


async def test_the_same_loop_without_the_cache_pays_every_time(stub_server, tmp_path, monkeypatch):
    """The contrast: no [cache], every call forwarded and paid, no cache member anywhere,
    and explain names the repeats."""
    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    outcome, forwarded, _ = await run_agent(stub_server, tmp_path, "")
    assert forwarded == 9
    events = read_chain(outcome.ledger)
    assert not [e for e in events if e["type"] == "cache.hit"]
    assert not [e for e in events if {"cache", "cache_stored", "cache_refused"} & set(e)]
    receipt = json.loads(outcome.receipt.read_text())
    assert "cache" not in receipt["ops"]
    names = [f["pattern"] for f in explain_ledger(outcome.ledger)["findings"]]
    assert "cache-miss" in names, names


LOOP3 = textwrap.dedent(
    """
    import openai
    client = openai.OpenAI(max_retries=0, timeout=20)
    ask = [{"role": "user", "content": "are we there yet?"}]
    for _ in range(3):
        client.chat.completions.create(model="gpt-4o-mini", messages=ask, temperature=0, max_tokens=8)
    """
)


async def test_a_fault_the_harness_records_keeps_that_answer_out(tmp_path, monkeypatch):
    """The harness's way in (RunHooks): the stub records a fault.injected through the
    run handle before its first answer, as chaos's stubs do. That answer is not stored
    (fault_injected); the second is, and the third is a hit."""
    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    handle: dict = {}
    ready = trio.Event()

    async def started(run_handle) -> None:
        handle["run"] = run_handle
        ready.set()

    async def record_fault(fields: dict) -> None:
        await ready.wait()
        await handle["run"].record_fault(fields)

    fault = {"fault": "upstream:latency(5ms)@1", "seed": None, "ordinal": 1, "counter": 0}
    fault |= {"target": "upstream", "kind": "latency"}

    def choose(arrival):
        if arrival.ordinal == 0:
            return Behaviour(first_byte_delay=0.005, injected=(fault,))
        return Behaviour()

    stub = Stub(StubConfig(kind="openai", reply_tokens=6), choose=choose, record_fault=record_fault)
    policy = tmp_path / "docket.toml"
    with trio.fail_after(DEADLINE), (tmp_path / "agent.out").open("w") as out:
        async with trio.open_nursery() as nursery:
            listening = await nursery.start(stub.serve)
            policy.write_text(
                f'[providers.openai]\nkind = "openai"\nbase_url = "{listening.url}"\n'
                'key_env = "STUB_KEY"\n[cache]\nenabled = true\n'
            )
            run = RunOptions(
                command=[sys.executable, "-c", LOOP3],
                policy_path=str(policy),
                ledger_dir=str(tmp_path / "run"),
                stdout=out,
            )
            outcome = await Supervisor(run, hooks=RunHooks(started=started)).run()
            nursery.cancel_scope.cancel()
    assert outcome.exit_status == 0, outcome.reason
    events = read_chain(outcome.ledger)
    kinds = [e["type"] for e in events if e["type"] not in ("process.spawn", "process.exit")]
    assert kinds[1:-1] == [
        "model.request",
        "fault.injected",
        "model.response",
        "model.request",
        "model.response",
        "cache.hit",
    ]
    responses = [e for e in events if e["type"] == "model.response"]
    assert [r.get("cache_refused") for r in responses] == ["fault_injected", None]
    assert responses[1]["cache_stored"] is True
    verdict = verify(outcome.receipt)
    assert verdict.ok, verdict.summary()
