"""`docket replay`: a run recorded with the openai and anthropic SDKs (whole and streamed)
against stub providers, then served back to the same agent with the stubs stopped.

Real processes, since the process is the point: `docket stub` twice, `docket run` once
(module fixture), then `docket replay` per test. Marked slow (about 20 s); the fast files cover the parts
in process: test_replay_match.py (the matcher), test_replay_upstream.py (the upstream
and the boundary's mark), test_replay_recording.py (the refusals)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_replay_recording import rechained

from chaos.faults.schedule import FaultSchedule
from docket.ledger.chain import line_hash
from docket.ledger.reader import Lines
from docket.receipts.verify import verify

pytestmark = pytest.mark.slow  # ~20 s of processes: `nox -s slow` runs it
ROOT = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, str(ROOT / "tests" / "replay_agent.py")]
DEADLINE = 90  # per process, on a loaded 2-core machine
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),
    "OPENAI_KEY_FOR_TEST": "sk-test-replay-key-1234567890",
}
ENV["ANTHROPIC_KEY_FOR_TEST"] = "sk-ant-test-replay-key-1234567890"


def docket(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "docket", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env=env or ENV,
        cwd=ROOT,
    )


def start_stub(kind: str) -> tuple[subprocess.Popen, str]:
    stub = subprocess.Popen(
        [sys.executable, "-m", "docket", "stub", "--kind", kind],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert stub.stdout is not None
    line = stub.stdout.readline()  # printed once bound; the stub is killed if this fails
    if "listening on" not in line:
        stub.kill()
        raise AssertionError(f"stub {kind}: {line!r}")
    return stub, line.rsplit(" ", 1)[1].strip()


def events(ledger: Path) -> list[dict]:
    return [json.loads(line) for line in Lines(ledger)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The recorded run's folder, the policy (its base URLs now dead) and the agent's output."""
    root = tmp_path_factory.mktemp("replay")
    stubs = [start_stub("openai"), start_stub("anthropic")]
    try:
        (o, o_url), (a, a_url) = stubs
        policy = root / "policy.toml"
        policy.write_text(
            "[ledger]\nrecord_bodies = true\n"
            f'[providers.openai]\nkind = "openai"\nbase_url = "{o_url}"\n'
            'key_env = "OPENAI_KEY_FOR_TEST"\n'
            f'[providers.anthropic]\nkind = "anthropic"\nbase_url = "{a_url}"\n'
            'key_env = "ANTHROPIC_KEY_FOR_TEST"\n'
        )
        done = docket(
            "run", "--policy", str(policy), "--ledger-dir", str(root / "rec"), "--", *AGENT
        )
        assert done.returncode == 0, done.stderr
    finally:
        for stub, _ in stubs:
            stub.terminate()
            stub.wait(timeout=DEADLINE)
    # Offline from here: nothing listens where the stubs were.
    for url in (o_url, a_url):
        host, port = url.removeprefix("http://").split(":")
        with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
            pass
    return root / "rec", policy, json.loads(done.stdout)


def test_the_recorded_run_is_what_the_replay_checks(recorded):
    folder, _, said = recorded
    assert said == {  # the stub's deterministic text: a real answer to replay
        "anthropic": "This is a deterministic reply",
        "anthropic_stream": "This is a",
        "openai": "This is a deterministic reply",
        "openai_stream": "This is a deterministic",
    }
    assert verify(folder / "receipt.json").ok


def test_a_replay_serves_the_same_answers_offline_and_costs_nothing(recorded, tmp_path):
    folder, policy, said = recorded
    out = tmp_path / "replayed"
    done = docket(
        "replay",
        str(folder),
        "--check",
        "--policy",
        str(policy),
        "--ledger-dir",
        str(out),
        "--",
        *AGENT,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == said  # the same content, whole and streamed, both SDKs
    assert "4 of 4 recorded calls replayed, 0 request(s)" in done.stderr

    verdict = verify(out / "receipt.json")
    assert verdict.ok, verdict.summary()
    receipt = json.loads((out / "receipt.json").read_text())
    original = json.loads((folder / "receipt.json").read_text())
    assert receipt["replay_of"] == {
        "run_id": original["run_id"],
        "head": original["ledger"]["head"],
    }
    assert verdict.claims is not None  # verify --json names what it checked
    assert verdict.claims["replay_of"] == receipt["replay_of"]
    assert verdict.claims["fleet"] is None
    assert receipt["totals"]["cost_nusd"] == 0 and receipt["totals"]["model_calls"] == 4
    assert original["totals"]["cost_nusd"] > 0  # the recorded run paid for the same calls

    recorded_lines = list(Lines(folder / "ledger.jsonl"))
    closes = [
        e for e in events(out / "ledger.jsonl") if e["type"] in ("model.response", "model.error")
    ]
    assert [e["type"] for e in closes] == ["model.response"] * 4
    for close in closes:
        origin = close["replayed_from"]
        assert origin["run_id"] == original["run_id"]
        assert origin["line_sha256"] == line_hash(recorded_lines[origin["seq"]])
        assert json.loads(recorded_lines[origin["seq"]])["response_body"] == close["response_body"]
        assert close["cost_nusd"] == 0


def test_a_changed_agent_fails_with_the_diff(recorded, tmp_path):
    folder, policy, _ = recorded
    env = {**ENV, "REPLAY_AGENT_QUESTION": "a different question"}
    done = docket(
        "replay",
        str(folder),
        "--policy",
        str(policy),
        "--ledger-dir",
        str(tmp_path / "r"),
        "--",
        *AGENT,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    diff = done.stderr.split("the first divergence:\n", 1)[1]
    report = json.loads(diff[: diff.rindex("}") + 1])
    assert report["nearest"]["index"] == 1 and report["provider"] == "openai"
    assert report["diff"] == [
        {
            "path": "messages[0].content",
            "recorded": "and the second?",
            "asked": "a different question",
        }
    ]
    end = events(tmp_path / "r" / "ledger.jsonl")[-1]
    assert end["type"] == "session.end" and end["reason"].startswith("replay diverged")
    assert verify(tmp_path / "r" / "receipt.json").ok


def test_on_miss_error_gives_each_sdk_its_own_exception(recorded, tmp_path):
    folder, policy, said = recorded
    env = {**ENV, "REPLAY_AGENT_QUESTION": "a different question"}
    out = tmp_path / "r"
    done = docket(
        "replay",
        str(folder),
        "--on-miss",
        "error",
        "--policy",
        str(policy),
        "--ledger-dir",
        str(out),
        "--",
        *AGENT,
        env=env,
    )
    assert done.returncode == 0, done.stderr  # the agent handled it; the run is its exit
    got = json.loads(done.stdout)
    assert got["openai"] == said["openai"] and got["anthropic"] == said["anthropic"]
    assert got["openai_stream"] == {"raised": "BadRequestError", "module": "openai"}
    assert got["anthropic_stream"] == {"raised": "BadRequestError", "module": "anthropic"}
    misses = [e for e in events(out / "ledger.jsonl") if e.get("replay_miss")]
    assert [(e["type"], e["status"], e["upstream_error"]["type"]) for e in misses] == [
        ("model.error", 400, "docket_replay_miss")
    ] * 2
    # --check: two recorded calls were never asked for, and two requests had no answer.
    checked = docket(
        "replay",
        str(folder),
        "--check",
        "--on-miss",
        "error",
        "--policy",
        str(policy),
        "--ledger-dir",
        str(tmp_path / "c"),
        "--",
        *AGENT,
        env=env,
    )
    assert (
        checked.returncode == 1 and "2 of 4 recorded calls replayed, 2 request(s)" in checked.stderr
    )


# ---------------------------------------------------------------- refused recordings


def test_refusals_are_one_line_and_exit_2(recorded, tmp_path):
    folder, policy, _ = recorded
    forged = rechained(folder, tmp_path / "forged", lambda e: e.pop("request_body", None))
    done = docket("replay", str(forged), "--policy", str(policy), "--", "true")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "recorded without bodies" in done.stderr


# ---------------------------------------------------------------- docket chaos --replay


def chaos_replay(folder, policy, out, seed, *faults, env=None):
    flags = [f for text in faults for f in ("--fault", text)]
    return docket(
        "chaos",
        "--seed",
        str(seed),
        "--replay",
        str(folder),
        "--policy",
        str(policy),
        "--dir",
        str(out),
        *flags,
        "--",
        *AGENT,
        env=env,
    )


def injected(folder: Path) -> list[dict]:
    fields = ("fault", "seed", "ordinal", "counter", "target", "kind", "provider")
    found = [e for e in events(folder / "ledger.jsonl") if e["type"] == "fault.injected"]
    return [{k: e.get(k) for k in fields} for e in found]


def test_chaos_on_a_replay_same_seed_same_faults_and_the_retry_is_served(recorded, tmp_path):
    """A 503 at call 1 (the openai SDK's whole call, which retries it: call 2 gets the
    recorded answer) and a latency drawn at 50%: the same seed twice gives the same
    fault.injected events, the same answers, and every recorded call replayed."""
    folder, policy, said = recorded
    faults = ("upstream:status(503)@call 1", "upstream:latency(5ms)@50%")
    env = {**ENV, "REPLAY_AGENT_RETRIES": "2"}
    runs = [chaos_replay(folder, policy, tmp_path / f"r{n}", 7, *faults, env=env) for n in (1, 2)]
    for done in runs:
        assert done.returncode == 0, done.stderr
    outputs = [
        json.loads(line) for done in runs for line in done.stdout.splitlines() if line[:1] == "{"
    ]
    assert outputs == [said, said]  # the retry got the recorded answer
    first, second = injected(tmp_path / "r1"), injected(tmp_path / "r2")
    assert first == second and first[0]["ordinal"] == 1 and first[0]["kind"] == "status"
    schedule = FaultSchedule.parse(7, faults)
    # five requests reached the replay upstream (4 calls and the one retry)
    assert [(e["ordinal"], e["fault"]) for e in first] == schedule.resolve(5)
    assert "4 of 4 recorded calls replayed" in runs[0].stderr
    receipt = json.loads((tmp_path / "r1" / "receipt.json").read_text())
    assert receipt["faults"]["injected"] == len(first)
    assert verify(tmp_path / "r1" / "receipt.json").ok
    # another seed whose schedule draws the latency elsewhere places it elsewhere
    other = next(
        s for s in range(8, 200) if FaultSchedule.parse(s, faults).resolve(5) != schedule.resolve(5)
    )
    moved = chaos_replay(folder, policy, tmp_path / "r3", other, *faults, env=env)
    assert moved.returncode == 0, moved.stderr
    assert injected(tmp_path / "r3") != first
    assert [(e["ordinal"], e["fault"]) for e in injected(tmp_path / "r3")] == FaultSchedule.parse(
        other, faults
    ).resolve(5)


def test_a_503_at_call_3_is_the_sdks_own_error_without_retries(recorded, tmp_path):
    folder, policy, said = recorded
    done = chaos_replay(folder, policy, tmp_path / "r", 1, "upstream:status(503)@call 3")
    assert done.returncode == 0, done.stderr
    got = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][0])
    assert got["anthropic"] == {"raised": "ServiceUnavailableError", "module": "anthropic"}
    assert {k: v for k, v in got.items() if k != "anthropic"} == {
        k: v for k, v in said.items() if k != "anthropic"
    }
    assert "3 of 4 recorded calls replayed" in done.stderr
    faulted = [e for e in events(tmp_path / "r" / "ledger.jsonl") if e.get("replay_fault")]
    assert [(e["type"], e["status"], e["cost_nusd"]) for e in faulted] == [("model.error", 503, 0)]


def test_a_replay_of_a_replay_is_the_replay(recorded, tmp_path):
    """Record, replay it (bodies recorded: the same policy), replay that replay: the same
    answers, and each link names the one before it (replay_of, replayed_from)."""
    folder, policy, said = recorded
    chain = [folder, tmp_path / "once", tmp_path / "twice"]
    for source, out in zip(chain, chain[1:], strict=False):
        done = docket(
            "replay",
            str(source),
            "--check",
            "--policy",
            str(policy),
            "--ledger-dir",
            str(out),
            "--",
            *AGENT,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == said
    receipts = [json.loads((f / "receipt.json").read_text()) for f in chain]
    for earlier, later in zip(receipts, receipts[1:], strict=False):
        assert later["replay_of"] == {
            "run_id": earlier["run_id"],
            "head": earlier["ledger"]["head"],
        }
    assert verify(chain[2] / "receipt.json").ok

    def answers(f: Path) -> list[dict]:
        return [e for e in events(f / "ledger.jsonl") if e["type"] == "model.response"]

    original, once, twice = (answers(f) for f in chain)
    assert [e["response_body"] for e in twice] == [e["response_body"] for e in original]
    lines_once = list(Lines(chain[1] / "ledger.jsonl"))
    for close in twice:  # each answer names the replay's line, which names the recording's
        origin = close["replayed_from"]
        assert origin["run_id"] == receipts[1]["run_id"]
        assert origin["line_sha256"] == line_hash(lines_once[origin["seq"]])
        assert (
            json.loads(lines_once[origin["seq"]])["replayed_from"]["run_id"]
            == receipts[0]["run_id"]
        )
