"""docket.replay.match: the recorded calls of a ledger and the matcher, pure (no I/O)."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket.replay.match import Matcher, Miss, NotReplayable, json_diff, recorded_calls


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ledger_events(bodies: list[tuple[str, bytes]]) -> list[tuple[dict, str]]:
    """A run's model.request/model.response pairs, one per (provider, body), with line hashes."""
    events: list[tuple[dict, str]] = []
    seq = 1
    for i, (provider, body) in enumerate(bodies):
        request = {
            "seq": seq,
            "type": "model.request",
            "call_id": f"c-{i}",
            "provider": provider,
            "base_url": f"https://{provider}.example/v1",
            "url": f"https://{provider}.example/v1/chat/completions",
            "request_sha256": _sha(body),
            "request_body": body.decode(),
        }
        answer = json.dumps({"answer": i})
        closing = {
            "seq": seq + 1,
            "type": "model.response",
            "call_id": f"c-{i}",
            "status": 200,
            "response_body": answer,
        }
        events += [(request, f"{seq:064x}"), (closing, f"{seq + 1:064x}")]
        seq += 2
    return events


# Bodies drawn from a small alphabet, so equal bodies (and equal digests) are common.
body_values = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["m1", "m2"]),
        "messages": st.lists(st.sampled_from(["hi", "yes", "no"]), min_size=1, max_size=3),
    }
)
recordings = st.lists(
    st.tuples(st.sampled_from(["openai", "anthropic"]), body_values), min_size=1, max_size=12
)


def _encode(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


@given(recordings, st.sampled_from(["exact", "order", "model+messages"]))
def test_a_replay_in_order_matches_every_call_once(recording, policy):
    bodies = [(provider, _encode(value)) for provider, value in recording]
    matcher = Matcher(recorded_calls(ledger_events(bodies)), policy)
    answered = []
    for provider, body in bodies:
        result = matcher.match(provider, "chat/completions", body)
        assert not isinstance(result, Miss), result.describe()
        answered.append(result.call.index)
    # Each recorded answer once, each to the request it was recorded for (equal bodies
    # are interchangeable: the one served must have the same provider and digest).
    assert sorted(answered) == list(range(len(bodies)))
    for (provider, body), index in zip(bodies, answered, strict=True):
        call = matcher.calls[index]
        assert (call.provider, call.digest) == (provider, _sha(body))
    assert matcher.unused == []
    # One more request than was recorded is a miss under every policy.
    provider, body = bodies[0]
    assert isinstance(matcher.match(provider, "chat/completions", body), Miss)


@given(recordings, st.data())
def test_a_changed_request_is_a_miss_naming_the_nearest_call(recording, data):
    bodies = [(provider, _encode(value)) for provider, value in recording]
    calls = recorded_calls(ledger_events(bodies))
    matcher = Matcher(calls, "exact")
    i = data.draw(st.integers(0, len(bodies) - 1))
    provider, _ = bodies[i]
    changed = dict(recording[i][1], messages=[*recording[i][1]["messages"], "a new question"])
    result = matcher.match(provider, "chat/completions", _encode(changed))
    assert isinstance(result, Miss)
    assert result.nearest is not None
    # The nearest differs from the changed request in no more places than any other
    # recorded call of that provider, and the diff shown is that difference.
    sizes = {
        c.index: len(json_diff(c.request_json, changed)) for c in calls if c.provider == provider
    }
    assert len(result.diff) == sizes[result.nearest.index] == min(sizes.values())
    assert any(d["path"].startswith("messages") for d in result.diff)
    assert result.nearest.provider == provider


def test_order_serves_the_nth_answer_and_refuses_another_body():
    bodies = [
        ("openai", b'{"model":"m","messages":["a"]}'),
        ("openai", b'{"model":"m","messages":["b"]}'),
    ]
    matcher = Matcher(recorded_calls(ledger_events(bodies)), "order")
    miss = matcher.match("openai", "chat/completions", bodies[1][1])  # the 2nd body first
    assert isinstance(miss, Miss) and miss.nearest is not None and miss.nearest.index == 1
    assert "differs from recorded call #0" in miss.reason
    assert matcher.match("openai", "chat/completions", bodies[1][1]).call.index == 1


def test_model_messages_ignores_what_the_user_names_and_only_that():
    recorded = [("openai", b'{"model":"m","messages":["a"],"user":"u1","metadata":{"k":1}}')]
    asked = b'{"metadata": {"k": 2}, "messages": ["a"], "model": "m", "user": "u2"}'
    assert isinstance(
        Matcher(recorded_calls(ledger_events(recorded)), "exact").match(
            "openai", "chat/completions", asked
        ),
        Miss,
    )
    strict = Matcher(recorded_calls(ledger_events(recorded)), "model+messages")
    miss = strict.match("openai", "chat/completions", asked)
    assert isinstance(miss, Miss)
    assert [d["path"] for d in miss.diff] == ["metadata.k", "user"]
    loose = Matcher(recorded_calls(ledger_events(recorded)), "model+messages", ["metadata", "user"])
    assert loose.match("openai", "chat/completions", asked).call.index == 0
    with pytest.raises(ValueError, match="never ignored"):
        Matcher([], "model+messages", ["messages"])


def test_boundary_changed_paths_do_not_count():
    body = b'{"model":"m","messages":["a"],"stream":true}'
    events = ledger_events([("openai", body)])
    events[0][0]["forwarded_changes"] = ["stream_options.include_usage"]
    forwarded = (
        b'{"model":"m","messages":["a"],"stream":true,"stream_options":{"include_usage":true}}'
    )
    events[0][0]["forwarded_sha256"] = _sha(forwarded)
    calls = recorded_calls(events)
    assert Matcher(calls, "exact").match("openai", "chat/completions", forwarded).call.index == 0
    assert (
        Matcher(calls, "model+messages").match("openai", "chat/completions", forwarded).call.index
        == 0
    )


@pytest.mark.parametrize(
    ("where", "edit", "said"),
    [
        (0, {"request_body": None}, "recorded without bodies (seq 1"),
        (
            0,
            {"request_body_not_recorded": "not_utf8"},
            "request body at seq 1 was not recorded (not_utf8)",
        ),
        (
            1,
            {"response_body": None, "response_body_not_recorded": "malformed"},
            "response body at seq 2 was not recorded (malformed)",
        ),
        (1, {"response_body_truncated": True}, "seq 2 was recorded cut"),
    ],
)
def test_a_recording_that_cannot_be_served_is_refused_naming_the_seq(where, edit, said):
    events = ledger_events([("openai", b'{"model":"m","messages":[]}')])
    event = events[where][0]
    for key, value in edit.items():
        if value is None:
            event.pop(key)
        else:
            event[key] = value
    with pytest.raises(NotReplayable, match=said.replace("(", r"\(").replace(")", r"\)")):
        recorded_calls(events)


def test_stream_events_are_served_in_order_whole():
    events = ledger_events([("openai", b"{}")])
    events[1][0]["response_body"] = 'data: {"a":1}\n\ndata: {"a":2}\n\ndata: [DONE]\n\n'
    events[1][0]["events"] = 3
    (call,) = recorded_calls(events)
    assert call.answer.stream and call.answer.events() == [
        'data: {"a":1}\n\n',
        'data: {"a":2}\n\n',
        "data: [DONE]\n\n",
    ]
    assert "".join(call.answer.events()) == call.answer.body
