"""Faults on replayed answers (`docket chaos --replay`), in process.

The decision (chaos/replay.py damage_of: the stub's plan() on a recorded answer) is
pure and property-tested over seeds; the replay upstream's performance of a Damage is
tested on real sockets with a real boundary and ledger (the boundary_rig): an
injected 503 reaches the agent in the provider's shape, is recorded `replay_fault`
(not `replayed_from`), costs nothing, and leaves the recorded answer for the retry;
a cut stream is cut where the fault says. The end-to-end runs with the SDKs are in
tests/test_replay.py (slow).
"""

from __future__ import annotations

import hashlib
import json

import pytest
import trio
from conftest import Upstream
from helpers import serving
from hypothesis import given
from hypothesis import strategies as st
from test_replay_upstream import KEY, RUN, STREAM_ANSWER, STREAMED, WHOLE, WHOLE_ANSWER, recording

from chaos.faults.schedule import SEED_LIMIT, FaultSchedule
from chaos.replay import damage_of
from docket.boundary.replayed import miss_header, replay_mark
from docket.cli import main
from docket.replay.faults import Damage, cut_events
from docket.replay.match import Hit, Matcher, recorded_calls
from docket.replay.upstream import ReplayUpstream

DEADLINE = 20
CALLS = 64
seeds = st.integers(0, SEED_LIMIT - 1)


def placement(seed: int, texts: list[str], stream: bool = False) -> list[tuple]:
    """Per call 1..CALLS, the faults performed and what they do to the answer."""
    schedule = FaultSchedule.parse(seed, texts)
    answer = recording()[1 if stream else 0].answer
    out = []
    for call in range(1, CALLS + 1):
        d = damage_of(schedule, call, "openai", answer)
        out.append((tuple(e["fault"] for e in d.injected), d.error, d.cut_after_events))
    return out


@given(seeds)
def test_the_same_seed_places_the_same_faults(seed):
    texts = ["upstream:status(503)@30%", "upstream:cut_stream(after=2)@40%"]
    assert placement(seed, texts, stream=True) == placement(seed, texts, stream=True)


@given(seeds, seeds)
def test_another_seed_places_them_elsewhere(a, b):
    """Where the grammar draws (a percentage), two seeds agree on 64 calls at 50% with
    probability 2**-64: a different placement is the property."""
    if a == b:
        return
    texts = ["upstream:status(503)@50%"]
    assert placement(a, texts) != placement(b, texts)


@given(seeds)
def test_what_fires_is_what_the_schedule_resolves(seed):
    texts = ["upstream:status(503)@25%", "upstream:latency(10ms, jitter=5ms)@call 3.."]
    schedule = FaultSchedule.parse(seed, texts)
    resolved = {(o, t) for o, t in schedule.resolve(CALLS)}
    performed = {
        (call, fault)
        for call, (faults, _, _) in enumerate(placement(seed, texts), start=1)
        for fault in faults
    }
    assert performed == resolved


def test_an_error_replaces_the_answer_in_the_providers_shape():
    schedule = FaultSchedule.parse(1, ["upstream:status(503, retry_after=2s)@call 3"])
    answer = recording()[0].answer
    assert damage_of(schedule, 2, "openai", answer) == Damage()
    damage = damage_of(schedule, 3, "openai", answer)
    status, body = damage.error
    assert status == 503 and json.loads(body)["error"]["message"].startswith("Injected")
    assert damage.retry_after == "2" and not damage.faithful
    assert [e["ordinal"] for e in damage.injected] == [3]
    anthropic = damage_of(schedule, 3, "anthropic", answer)
    assert json.loads(anthropic.error[1])["type"] == "error"  # Anthropic's envelope


def test_missing_usage_and_malformed_rewrite_the_recorded_body():
    whole, streamed = (c.answer for c in recording())
    schedule = FaultSchedule.parse(0, ["upstream:missing_usage"])
    assert "usage" not in json.loads(damage_of(schedule, 1, "openai", whole).body)
    rewritten = damage_of(schedule, 1, "openai", streamed).body
    assert rewritten.count("data: ") == 3 and "prompt_tokens" not in rewritten
    broken = damage_of(FaultSchedule.parse(0, ["upstream:malformed_json"]), 1, "openai", whole)
    with pytest.raises(ValueError):  # the malformed body must not parse
        json.loads(broken.body)
    latency = damage_of(FaultSchedule.parse(0, ["upstream:latency(20ms)"]), 1, "openai", whole)
    assert latency.faithful and latency.first_byte_delay == 0.02  # a delay alone: as recorded


def test_cut_events_keeps_what_the_fault_leaves():
    events = [b"a" * 10, b"b" * 10, b"c" * 10]
    assert cut_events(events, Damage()) == (events, False)
    assert cut_events(events, Damage(cut_after_events=2)) == (events[:2], True)
    assert cut_events(events, Damage(cut_after_events=3)) == (events, False)  # past the end
    assert cut_events(events, Damage(truncate_bytes=15)) == ([b"a" * 10, b"b" * 5], True)


def _upstream(texts: list[str], seed: int = 0) -> tuple[ReplayUpstream, list[dict]]:
    schedule = FaultSchedule.parse(seed, texts)
    recorded: list[dict] = []

    async def faults(call, provider, kind, rec):
        damage = damage_of(schedule, call, kind, rec.answer)
        recorded.extend(damage.injected)
        return damage

    replay = ReplayUpstream(
        Matcher(recording()), run_id=RUN, key=KEY, kinds={"openai": "openai"}, faults=faults
    )
    return replay, recorded


async def test_an_injected_503_is_free_and_the_retry_gets_the_recorded_answer(boundary_rig):
    replay, injected = _upstream(["upstream:status(503)@call 1"])
    at_replay = serving(replay.serve, lambda url, _: Upstream(f"{url}/openai", "openai"))
    with trio.fail_after(DEADLINE):
        async with at_replay as up, boundary_rig({"openai": up}) as rig:
            rig.boundary.routes["openai"].replay_key = KEY
            async with rig.client() as client:
                failed = await client.post("/openai/v1/chat/completions", content=json.dumps(WHOLE))
                retried = await client.post(
                    "/openai/v1/chat/completions", content=json.dumps(WHOLE)
                )
    assert failed.status_code == 503 and failed.json()["error"]["type"] == "server_error"
    assert retried.status_code == 200 and retried.text == WHOLE_ANSWER
    assert [e["ordinal"] for e in injected] == [1]
    error, response = rig.events("model.error")[0], rig.events("model.response")[0]
    assert error["replay_fault"] is True and "replayed_from" not in error
    assert error["cost_nusd"] == 0 and response["cost_nusd"] == 0
    assert response["replayed_from"]["seq"] == 2  # the recorded answer, on the retry
    assert replay.matcher.matched == 1 and replay.faulted == 1 and not replay.misses


async def test_a_cut_stream_is_cut_after_the_faults_events(boundary_rig):
    replay, injected = _upstream(["upstream:cut_stream(after=2)@call 2"])
    at_replay = serving(replay.serve, lambda url, _: Upstream(f"{url}/openai", "openai"))
    with trio.fail_after(DEADLINE):
        async with at_replay as up, boundary_rig({"openai": up}) as rig:
            rig.boundary.routes["openai"].replay_key = KEY
            async with rig.client() as client:
                await client.post("/openai/v1/chat/completions", content=json.dumps(WHOLE))
                got = b""
                try:
                    async with client.stream(
                        "POST", "/openai/v1/chat/completions", content=json.dumps(STREAMED)
                    ) as streamed:
                        async for piece in streamed.aiter_raw():
                            got += piece
                except Exception as exc:  # noqa: BLE001 - the cut is the point; its type is httpx's
                    cut = exc
                else:
                    cut = None
    events = [e + "\n\n" for e in STREAM_ANSWER.split("\n\n") if e]
    assert got.decode() == "".join(events[:2]) and cut is not None
    assert [e["kind"] for e in injected] == ["cut_stream"]
    close = [e for e in rig.events() if e.get("replay_fault")]
    assert len(close) == 1 and close[0]["cost_nusd"] == 0
    assert replay.faulted == 1 and replay.matcher.matched == 1  # the stream's call left unused


def _calls(bodies: list[int]) -> list:
    pairs = []
    for i, b in enumerate(bodies):
        data = json.dumps({"model": "m", "messages": [{"role": "user", "content": str(b)}]})
        request = {
            "seq": 2 * i + 1,
            "type": "model.request",
            "call_id": f"c{i}",
            "provider": "openai",
            "base_url": "http://x",
            "url": "http://x/v1/chat/completions",
            "request_sha256": hashlib.sha256(data.encode()).hexdigest(),
            "request_body": data,
        }
        close = {"seq": 2 * i + 2, "type": "model.response", "call_id": f"c{i}", "status": 200}
        pairs += [(request, f"{2 * i + 1:064x}"), (close | {"response_body": "{}"}, "0" * 64)]
    return recorded_calls(pairs)


@given(
    st.lists(st.integers(0, 3), max_size=12),
    st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=30),
)
def test_exact_matching_with_releases_is_the_earliest_unused_equal_call(bodies, steps):
    """The exact policy's index (and release, for a faulted answer) against the rule it
    keeps: a request gets the earliest unused recorded call with its bytes."""
    calls = _calls(bodies)
    matcher = Matcher(calls)
    used: set[int] = set()
    hits = []
    for release, b in steps:
        if release and hits:
            call = hits.pop()
            matcher.release(call)
            used.discard(call.index)
            continue
        asked = json.dumps({"model": "m", "messages": [{"role": "user", "content": str(b)}]})
        expected = next((c for c in calls if c.index not in used and bodies[c.index] == b), None)
        got = matcher.match("openai", "v1/chat/completions", asked.encode())
        if expected is None:
            assert not isinstance(got, Hit)
        else:
            assert isinstance(got, Hit) and got.call == expected
            used.add(expected.index)
            hits.append(expected)
    assert matcher.matched == len(used)


def test_the_fault_mark_is_read_only_with_the_key():
    assert replay_mark([miss_header(KEY, "fault")], KEY) == "fault"
    assert replay_mark([miss_header("f" * 32, "fault")], KEY) is None


def test_chaos_replay_refuses_what_it_cannot_do_in_one_line(tmp_path, capsys):
    """Checked before the recording is read: a fault that acts on a connection, the
    recorder or a process; a mode it does not take; replay options without --replay."""
    run = str(tmp_path / "no-such-run")
    cases = [
        (["--replay", run, "--fault", "net:reset_peer@call 1", "--", "true"], "upstream faults"),
        (["--replay", run, "--fault", "ledger:eio@seq 3", "--", "true"], "upstream faults"),
        (["--replay", run, "--agent", "once"], "not with --agent"),
        (["--policy", "docket.toml", "--agent", "once"], "go with --replay"),
    ]
    for args, said in cases:
        status = main(["chaos", "--seed", "1", "--dir", str(tmp_path / "out"), *args])
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and said in err, (args, err)
        assert not (tmp_path / "out").exists()  # refused before anything was made


async def _retry_until_answered(boundary_rig, seed: int) -> tuple[list, list]:
    """The agent's view (status and body of each try) of a request retried until it
    gets an answer, under a 503 at 50%, and the faults recorded."""
    replay, injected = _upstream(["upstream:status(503)@50%"], seed=seed)
    at_replay = serving(replay.serve, lambda url, _: Upstream(f"{url}/openai", "openai"))
    seen = []
    with trio.fail_after(DEADLINE):
        async with at_replay as up, boundary_rig({"openai": up}) as rig:
            rig.boundary.routes["openai"].replay_key = KEY
            async with rig.client() as client:
                for _ in range(12):
                    got = await client.post(
                        "/openai/v1/chat/completions", content=json.dumps(WHOLE)
                    )
                    seen.append((got.status_code, got.text))
                    if got.status_code == 200:
                        break
    return seen, injected


def _fires(seed: int, calls: int) -> list[bool]:
    schedule = FaultSchedule.parse(seed, ["upstream:status(503)@50%"])
    return [schedule.decide(0, call) for call in range(1, calls + 1)]


async def test_the_same_seed_twice_is_the_same_run_for_the_agent(boundary_rig):
    # a seed whose 503s stop at call 3: fewer in a row than open the boundary's breaker
    seed = next(s for s in range(1000) if _fires(s, 3) == [True, True, False])
    first, first_faults = await _retry_until_answered(boundary_rig, seed)
    second, second_faults = await _retry_until_answered(boundary_rig, seed)
    assert first == second and first_faults == second_faults
    assert [status for status, _ in first] == [503, 503, 200]
    assert first[-1][1] == WHOLE_ANSWER  # the retry that got through got the recorded answer
    assert [e["ordinal"] for e in first_faults] == list(range(1, len(first)))
