"""End to end: `docket run`'s supervisor, a real agent process,
the real ledger on disk, the receipt, and `docket verify`.

A harness's probe (RunHooks.call_probe, the documented door) raises at each await
point of the call path in turn, one point per call: every model.request still gets
exactly one closing event, the agent gets a 5xx in the provider's shape (or a cut
stream) and its next call is served, and the receipt verifies. And a closing event
that the disk never takes leaves the call open, which the receipt discloses.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap

import trio
from helpers import read_chain, read_events, running, wait_until

from docket.cli import main
from docket.ledger.faults import os_error
from docket.receipts.verify import verify
from docket.run.hooks import CALL_POINTS, RunHooks
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

DEADLINE = 90  # one supervised run on a shared 2-core machine
REAL_KEY = "sk-real-upstream-key-closing-0a1b2c3d"

# Calls alternate whole and streamed answers; each line of stdout is one call's outcome.
AGENT = textwrap.dedent(
    """
    import json, os, sys, httpx
    base, token = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    calls = int(sys.argv[1])
    with httpx.Client(headers={"authorization": "Bearer " + token}, timeout=20) as http:
        for n in range(calls):
            stream = n % 2 == 1
            body = {"model": "gpt-4o-mini", "max_tokens": 8, "stream": stream,
                    "messages": [{"role": "user", "content": "hello"}]}
            try:
                r = http.post(base + "/chat/completions", json=body)
                try:
                    kind = r.json()["error"]["type"]
                except Exception:
                    kind = None
                print(json.dumps({"n": n, "status": r.status_code, "error": kind,
                                  "done": b"[DONE]" in r.content}), flush=True)
            except httpx.HTTPError as exc:
                print(json.dumps({"n": n, "cut": type(exc).__name__}), flush=True)
    """
)


class InTurn:
    """Raise at each call point in turn: the first call to pass a point not yet hit
    raises there, one point per call (so every call shows one fault, alone)."""

    def __init__(self) -> None:
        self.hit: list[str] = []
        self._armed = False

    def __call__(self, point: str) -> None:
        if point == "request.read":
            self._armed = True  # a new call
        if self._armed and point not in self.hit:
            self._armed = False
            self.hit.append(point)
            raise RuntimeError(f"probe at {point}")


def options(tmp_path, stub_url: str, calls: int, out) -> RunOptions:
    policy = tmp_path / "docket.toml"
    policy.write_text(
        f'[providers.openai]\nkind = "openai"\nbase_url = "{stub_url}"\nkey_env = "STUB_KEY"\n'
    )
    return RunOptions(
        command=[sys.executable, "-c", AGENT, str(calls)],
        policy_path=str(policy),
        ledger_dir=str(tmp_path / "run"),
        stdout=out,
    )


def pairs(events: list[dict]) -> dict[str, list[str]]:
    calls: dict[str, list[str]] = {}
    for e in events:
        if e["type"] in ("model.request", "model.response", "model.error"):
            calls.setdefault(e["call_id"], []).append(e["type"])
    return calls


async def test_a_probe_at_every_await_point_in_turn_leaves_a_verifiable_record(
    stub_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    probe = InTurn()
    calls = 2 * len(CALL_POINTS) + 4  # enough for each point on a call that passes it
    out_path = tmp_path / "agent.out"
    with trio.fail_after(DEADLINE), out_path.open("w") as out:
        async with stub_server("openai", token_delay=0.02, reply_tokens=4) as stub:
            run = options(tmp_path, stub.url, calls, out)
            outcome = await Supervisor(run, hooks=RunHooks(call_probe=probe)).run()
    assert outcome.exit_status == 0, outcome.reason
    assert sorted(probe.hit) == sorted(CALL_POINTS)  # every point was made to raise
    answers = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert len(answers) == calls
    # The agent saw a 500 docket_internal_error (or a cut stream) for each fault, and
    # every other call answered: the boundary kept serving.
    faulted = [a for a in answers if a.get("status") != 200]
    assert len(faulted) == len(CALL_POINTS), faulted
    for a in faulted:
        assert "cut" in a or (a["status"] == 500 and a["error"] == "docket_internal_error"), a
    streamed_ok = [a for a in answers if a.get("status") == 200 and a["n"] % 2 == 1]
    assert streamed_ok and all(a["done"] for a in streamed_ok), answers

    events = read_chain(outcome.ledger)
    for call_id, types in pairs(events).items():
        assert types[0] == "model.request" and len(types) == 2, (call_id, types)
    errors = [e for e in events if e["type"] == "model.error"]
    assert all(e["reason"] == "internal_error" and e["cost_nusd"] > 0 for e in errors)
    denied = [e for e in events if e["type"] == "policy.denied"]
    assert all(e["rule"] == "internal_error" for e in denied)
    assert len(denied) == 4  # the points before the model.request: nothing forwarded
    receipt = json.loads(outcome.receipt.read_text())
    assert "open_calls" not in receipt["ops"]
    assert receipt["totals"]["errors"] == len(errors) and receipt["totals"]["refused"] == 4
    verdict = verify(outcome.receipt)
    assert verdict.ok and verdict.complete, verdict.summary()


class LoseFirstResponse:
    """The disk refuses the first model.response (EIO): its call stays open."""

    def __init__(self) -> None:
        self.lost: list[int] = []

    def before_write(self, ordinal: int, type: str):
        if type == "model.response" and not self.lost:
            self.lost.append(ordinal)
            return os_error(errno.EIO)
        return None


async def test_a_closing_event_the_disk_refused_is_disclosed_as_an_open_call(
    stub_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    faults = LoseFirstResponse()
    out_path = tmp_path / "agent.out"
    with trio.fail_after(DEADLINE), out_path.open("w") as out:
        async with stub_server("openai", reply_tokens=4) as stub:
            run = options(tmp_path, stub.url, 3, out)
            outcome = await Supervisor(run, hooks=RunHooks(write_faults=faults)).run()
    assert faults.lost
    events = read_chain(outcome.ledger)
    requests = [e for e in events if e["type"] == "model.request"]
    receipt = json.loads(outcome.receipt.read_text())
    assert receipt["ops"]["evidence"]["ledger_complete"] is False
    assert receipt["ops"]["open_calls"] == [
        {"call_id": requests[0]["call_id"], "seq": requests[0]["seq"]}
    ]
    verdict = verify(outcome.receipt)
    assert verdict.ok and not verdict.complete, verdict.summary()
    # The same receipt hiding the open call is caught there.
    del receipt["ops"]["open_calls"]
    outcome.receipt.write_text(json.dumps(receipt))
    verdict = verify(outcome.receipt)
    assert (verdict.code, verdict.field) == ("open_call", "ops.open_calls[0]"), verdict.summary()


def test_a_call_in_flight_when_the_supervisor_is_killed_is_named_by_doctor(tmp_path, capsys):
    """SIGKILL with a call in flight: no receipt, and `docket doctor` names the call
    the ledger leaves open (its model.request, durable before the call was forwarded)."""
    black_hole = socket.socket()  # accepts connections (the backlog), never answers
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(8)
    url = f"http://127.0.0.1:{black_hole.getsockname()[1]}"
    out = (tmp_path / "agent.out").open("w")
    run = options(tmp_path, url, 1, out)
    ledger = tmp_path / "run" / "ledger.jsonl"
    argv = [sys.executable, "-m", "docket", "run", "--policy", run.policy_path]
    argv += ["--ledger-dir", run.ledger_dir, "--", *run.command]
    env = os.environ | {"STUB_KEY": REAL_KEY}
    supervisor = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.DEVNULL)
    try:
        wait_until(
            lambda: ledger.exists() and b'"type":"model.request"' in ledger.read_bytes(),
            DEADLINE,
            "the model.request on disk",
        )
        spawn = next(e for e in read_events(ledger) if e["type"] == "process.spawn")
        supervisor.kill()
        supervisor.wait(timeout=DEADLINE)
        wait_until(lambda: not running(spawn["pid"]), 10, "the agent to die with the supervisor")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=DEADLINE)
        black_hole.close()
        out.close()
    assert not (tmp_path / "run" / "receipt.json").exists()
    (request,) = [e for e in read_events(ledger) if e["type"] == "model.request"]
    capsys.readouterr()
    assert main(["doctor", "--json", str(ledger)]) in (0, 1)
    diagnosis = json.loads(capsys.readouterr().out)
    assert diagnosis["open_calls"] == [{"call_id": request["call_id"], "seq": request["seq"]}]
    main(["doctor", str(ledger)])
    text = capsys.readouterr().out
    assert (
        f'open     1 model.request with no closing event (in flight where the ledger ends): "{request["call_id"]}" at seq {request["seq"]}'
        in text
    )
