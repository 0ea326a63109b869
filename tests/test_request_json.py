"""The boundary's side: request bodies whose JSON readers would
read differently are refused before anything is forwarded or charged.

A member named twice (`"model"`, `"max_tokens"`) was forwarded byte for byte while
Docket recorded and capped the last value: an upstream that takes the first runs a
call nobody recorded. Nesting past MAX_REQUEST_DEPTH is refused too, never a 500.
Each is a 400 in the provider's own shape with its policy.denied event; over real
sockets, read back from the ledger's bytes.
"""

from __future__ import annotations

import json

import pytest
import trio
from conftest import TOKEN
from hypothesis import given
from hypothesis import strategies as st

from docket.boundary.providers.base import MAX_REQUEST_DEPTH, nests_deeper

CHAT = "/openai/v1/chat/completions"
MESSAGES = "/anthropic/v1/messages"
DEADLINE = 20
ANTHROPIC = {"x-api-key": TOKEN, "anthropic-version": "2023-06-01"}
JSON = {"content-type": "application/json"}
HI = [{"role": "user", "content": "hi"}]

TWICE = [
    # (route, body, the member named twice, the answer's shape)
    (
        CHAT,
        b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"model":"gpt-4o"}',
        "model",
        "openai",
    ),
    (
        CHAT,
        b'{"model":"gpt-4o-mini","max_tokens":1,"messages":[],"max_tokens":100000}',
        "max_tokens",
        "openai",
    ),
    (
        MESSAGES,
        b'{"model":"claude-haiku-4-5","max_tokens":1,"max_tokens":64000,'
        b'"messages":[{"role":"user","content":"hi"}]}',
        "max_tokens",
        "anthropic",
    ),
    (
        MESSAGES,
        b'{"model":"claude-haiku-4-5","max_tokens":8,'
        b'"messages":[{"role":"user","content":"hi","role":"assistant"}]}',
        "role",
        "anthropic",
    ),
]


def deep(depth: int) -> bytes:
    """A chat request whose body nests `depth` levels (the body's own object is 1)."""
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"x":' + inner + b"}"


def error_of(kind: str, content: bytes) -> dict:
    body = json.loads(content)
    if kind == "anthropic":
        assert body["type"] == "error"
    return body["error"]


async def test_a_member_named_twice_is_refused_in_the_providers_shape(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            stub_server("anthropic") as an,
            boundary_rig({"openai": oa, "anthropic": an}) as rig,
            rig.client() as http,
        ):
            answers = []
            for route, body, _, kind in TWICE:
                headers = JSON | (ANTHROPIC if kind == "anthropic" else {})
                answers.append(await http.post(route, content=body, headers=headers))
            served = await http.post(CHAT, json={"model": "gpt-4o-mini", "messages": HI})
            forwarded = len(oa.log) + len(an.log)
        events = rig.events()
    assert served.status_code == 200
    assert forwarded == 1  # only the well-formed call went upstream
    denied = [e for e in events if e["type"] == "policy.denied"]
    assert len(denied) == len(TWICE)
    assert [e["type"] for e in events].count("model.request") == 1
    for (_, _, member, kind), answer, event in zip(TWICE, answers, denied, strict=True):
        assert answer.status_code == 400
        assert answer.headers["x-should-retry"] == "false"
        error = error_of(kind, answer.content)
        assert error["type"] == "docket_bad_request"
        assert error["param"] == member and error["code"] == "duplicate_key"
        assert f'"{member}" twice' in error["message"]
        assert event["rule"] == "bad_request" and event["code"] == "duplicate_key"
        assert event["param"] == member and event["error_type"] == "docket_bad_request"


@pytest.mark.parametrize("record_bodies", [False, True])
async def test_a_body_nested_past_the_bound_is_a_400_never_a_500(
    record_bodies, stub_server, boundary_rig
):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            boundary_rig({"openai": oa}, {"ledger": {"record_bodies": record_bodies}}) as rig,
            rig.client() as http,
        ):
            at_bound = await http.post(CHAT, content=deep(MAX_REQUEST_DEPTH), headers=JSON)
            answers = [
                await http.post(CHAT, content=deep(depth), headers=JSON)
                for depth in (MAX_REQUEST_DEPTH + 1, 500, 3_000, 200_000)
            ]
            forwarded = len(oa.log)
        events = rig.events()
    assert at_bound.status_code == 200, at_bound.content
    assert forwarded == 1
    denied = [e for e in events if e["type"] == "policy.denied"]
    assert len(denied) == len(answers)
    for answer, event in zip(answers, denied, strict=True):
        assert answer.status_code == 400, answer.content
        error = error_of("openai", answer.content)
        assert error["type"] == "docket_bad_request" and error["code"] == "too_deep"
        assert f"more than {MAX_REQUEST_DEPTH} levels deep" in error["message"]
        assert event["rule"] == "bad_request" and event["code"] == "too_deep"


# ---------------------------------------------------------------- nests_deeper, property-tested

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=30,
)


def _depth(value: object) -> int:
    """The reference: recursive, for the small values hypothesis draws."""
    if type(value) is dict:
        return 1 + max(map(_depth, value.values()), default=0)
    if type(value) is list:
        return 1 + max(map(_depth, value), default=0)
    return 0


@given(value=_json_values, limit=st.integers(min_value=1, max_value=8))
def test_nests_deeper_agrees_with_the_recursive_depth(value, limit):
    wrapped = {"body": value}  # parse_json_object only ever walks an object
    assert nests_deeper(wrapped, limit) == (_depth(wrapped) > limit)


def test_nests_deeper_needs_no_stack_of_pythons():
    value: list = []
    for _ in range(100_000):  # far past the interpreter's recursion limit
        value = [value]
    assert nests_deeper({"a": value}, MAX_REQUEST_DEPTH)
    assert not nests_deeper({"a": value}, 100_002)


async def test_a_refusal_quoting_the_body_does_not_copy_a_secret(stub_server, boundary_rig):
    """The refusal names the member twice: a member named with the run token is not
    written into the record, nor echoed."""
    body = b'{"model":"gpt-4o-mini","messages":[],"%s":1,"%s":2}' % (TOKEN.encode(), TOKEN.encode())
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            boundary_rig({"openai": oa}) as rig,
            rig.client() as http,
        ):
            answer = await http.post(CHAT, content=body, headers=JSON)
        raw = rig.raw()
    assert answer.status_code == 400
    assert error_of("openai", answer.content)["code"] == "duplicate_key"
    assert TOKEN.encode() not in raw and TOKEN.encode() not in answer.content
    assert b"[redacted]" in raw
