"""The client's own retries, on the record: the real openai SDK, retrying a
503ing stub, under a real `docket run` supervisor; the ledger's bytes and the receipt
say which requests were its retries, and verify re-derives the count."""

from __future__ import annotations

import json
import sys
import textwrap

import trio
from helpers import read_chain

from chaos.stub.server import Behaviour, steady
from docket.receipts.verify import verify
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

DEADLINE = 90  # one supervised run on a shared 2-core machine
REAL_KEY = "sk-real-upstream-key-retries-0a1b2c3d"

# Two logical calls, each retried twice by the SDK (3 attempts). The 503 carries
# Retry-After 0.01, which the SDK honours, so the retries cost milliseconds.
AGENT = textwrap.dedent(
    """
    import json, openai
    client = openai.OpenAI(max_retries=2, timeout=20)
    for n in range(2):
        try:
            client.chat.completions.create(
                model="gpt-4o-mini", max_tokens=8,
                messages=[{"role": "user", "content": "hello"}],
                extra_headers={"x-client-request-id": f"logical-{n}"},
            )
            print(json.dumps({"n": n, "ok": True}), flush=True)
        except openai.InternalServerError as exc:
            print(json.dumps({"n": n, "status": exc.status_code}), flush=True)
    """
)


def _options(tmp_path, stub_url: str, out) -> RunOptions:
    policy = tmp_path / "docket.toml"
    # The breaker would open at the fifth failure in a row (the default): kept out of reach.
    policy.write_text(
        f'[providers.openai]\nkind = "openai"\nbase_url = "{stub_url}"\nkey_env = "STUB_KEY"\n'
        "[resilience]\nbreaker_threshold = 10\n"
    )
    return RunOptions(
        command=[sys.executable, "-c", AGENT],
        policy_path=str(policy),
        ledger_dir=str(tmp_path / "run"),
        stdout=out,
    )


async def test_the_sdks_retries_are_marked_counted_and_verified(stub_server, tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    unavailable = steady(Behaviour(error="status", status=503, retry_after="0.01"))
    out_path = tmp_path / "agent.out"
    with trio.fail_after(DEADLINE), out_path.open("w") as out:
        async with stub_server("openai", choose=unavailable) as stub:
            outcome = await Supervisor(_options(tmp_path, stub.url, out)).run()
            seen = [
                dict((k, v) for k, v in entry["headers"]).get("x-stainless-retry-count")
                for entry in stub.log
            ]
    assert outcome.exit_status == 0, outcome.reason
    answers = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert answers == [{"n": 0, "status": 503}, {"n": 1, "status": 503}]
    # What the dependency saw: six requests, the SDK's markers passed through
    # unchanged, and no more: the boundary never retries.
    assert seen == ["0", "1", "2", "0", "1", "2"]

    events = read_chain(outcome.ledger)  # the bytes on disk, chain checked
    requests = [e for e in events if e["type"] == "model.request"]
    assert [r["client_attempt"] for r in requests] == [0, 1, 2, 0, 1, 2]
    assert [r["client_ids"]["client_request_id"] for r in requests] == ["logical-0"] * 3 + [
        "logical-1"
    ] * 3
    assert all("client_marks_rejected" not in r for r in requests)
    errors = [e for e in events if e["type"] == "model.error"]
    assert len(errors) == 6 and all(e["status"] == 503 for e in errors)

    receipt = json.loads(outcome.receipt.read_text())
    assert receipt["ops"]["client_retries"] == {
        "marked": 6,
        "retries": 4,
        "by_attempt": {"0": 2, "1": 2, "2": 2},
    }
    assert receipt["totals"]["model_calls"] == 6
    verdict = verify(outcome.receipt)
    assert verdict.ok, verdict.summary()

    # A receipt that understates the retries is caught.
    receipt["ops"]["client_retries"]["retries"] = 3
    outcome.receipt.write_text(json.dumps(receipt))
    verdict = verify(outcome.receipt)
    assert not verdict.ok and verdict.code == "client_retries_mismatch", verdict.summary()
    assert verdict.field == "ops.client_retries.retries"


async def test_the_reference_agent_marks_its_retries_like_an_sdk(
    stub_server, tmp_path, monkeypatch
):
    """docket agent --mode backoff sends x-stainless-retry-count too: its retries of a
    503 are on the record the same way (two calls, three attempts each)."""
    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    unavailable = steady(Behaviour(error="status", status=503, retry_after="0.01"))
    agent = [sys.executable, "-m", "docket", "agent", "--mode", "backoff", "--calls", "2"]
    agent += ["--max-attempts", "3", "--backoff-base", "0.01", "--backoff-cap", "0.02"]
    agent += ["--retry-floor", "4"]  # four retries: over the default budget (3 + 0.1 * 2)
    with trio.fail_after(DEADLINE), (tmp_path / "agent.out").open("w") as out:
        async with stub_server("openai", choose=unavailable) as stub:
            run = _options(tmp_path, stub.url, out)
            run = RunOptions(
                command=agent,
                policy_path=run.policy_path,
                ledger_dir=run.ledger_dir,
                stdout=out,
            )
            outcome = await Supervisor(run).run()
    requests = [e for e in read_chain(outcome.ledger) if e["type"] == "model.request"]
    assert [r["client_attempt"] for r in requests] == [0, 1, 2, 0, 1, 2]
    receipt = json.loads(outcome.receipt.read_text())
    assert receipt["ops"]["client_retries"]["retries"] == 4
    assert verify(outcome.receipt).ok
