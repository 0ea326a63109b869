"""Secrets stay out of the record: the ledger's raw bytes and the receipt are searched
for every secret a client planted in its headers, its URL and its body, for the run
token and for the real provider key. And bodies are recorded only when the policy
asks (record_bodies), redacted by the same rules."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import textwrap

import trio
from conftest import REAL_KEY, TOKEN
from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.boundary import bodies, forward
from docket.guards.credential_names import is_credential_member
from docket.http.client import UpstreamPool
from docket.receipts.verify import verify
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

DEADLINE = 20
CHAT = "/openai/v1/chat/completions"

# One distinct secret per place a client can put one.
PLANTED = {
    "authorization": "s3cret-authorization-7f3a91",
    "x-api-key": "s3cret-x-api-key-52be07",
    "api-key": "s3cret-api-key-c41d88",
    "cookie": "s3cret-cookie-9e2210",
    "proxy-authorization": "s3cret-proxy-auth-0b77f4",
    "query-key": "s3cret-query-key-61aa3c",
    "query-token": "s3cret-query-token-d09e5b",
    "userinfo": "s3cret-userinfo-pass-88c1e2",
    "body-api-key": "s3cret-body-api-key-4410aa",
}


def chat_body(**extra) -> bytes:
    payload = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"my run token is {TOKEN}, keep it"}],
        "max_tokens": 8,
        "metadata": {"api_key": PLANTED["body-api-key"], "max_tokens_note": "kept"},
        **extra,
    }
    return json.dumps(payload).encode()


def assert_no_secret_in(data: bytes, where: str) -> None:
    forbidden = {**PLANTED, "run token": TOKEN, "real key": REAL_KEY}
    userinfo = f"user:{PLANTED['userinfo']}".encode()
    forbidden_bytes = {name: value.encode() for name, value in forbidden.items()}
    forbidden_bytes["userinfo as basic auth"] = base64.b64encode(userinfo)
    found = [name for name, value in forbidden_bytes.items() if value in data]
    assert not found, f"{where} holds secrets: {found}"


async def post(pool: UpstreamPool, target: str, headers: list, body: bytes) -> tuple[int, bytes]:
    async with pool.request("POST", target, headers, body) as resp:
        return resp.status, await resp.read()


async def test_planted_secrets_never_reach_the_ledger(stub_server, upstream_server, boundary_rig):
    """Every header and URL place a credential can hide, on calls forwarded and refused,
    with record_bodies on (the most the ledger ever holds). An upstream that echoes
    the key it was sent puts the real key into the response body."""

    async def echo_key(request, respond):
        await request.read_body()
        key = request.header(b"x-api-key") or b""
        body = json.dumps(
            {
                "type": "message",
                "content": [{"type": "text", "text": "your key is " + key.decode()}],
                "usage": {"input_tokens": 3, "output_tokens": 4},
            }
        ).encode()
        await respond.simple(200, [(b"content-type", b"application/json")], body)

    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            upstream_server(echo_key, "anthropic") as an,
            boundary_rig(
                {"openai": oa, "anthropic": an}, {"ledger": {"record_bodies": True}}
            ) as rig,
        ):
            host = rig.url.removeprefix("http://")
            query = f"key={PLANTED['query-key']}&token={PLANTED['query-token']}&n=1"
            pool = UpstreamPool(rig.url)
            try:
                answers = [
                    # Absolute form, userinfo and a secret query, plus api-key, cookie and
                    # proxy-authorization beside the run token.
                    await post(
                        pool,
                        f"http://user:{PLANTED['userinfo']}@{host}{CHAT}?{query}",
                        [
                            (b"authorization", f"Bearer {TOKEN}".encode()),
                            (b"api-key", PLANTED["api-key"].encode()),
                            (b"cookie", f"session={PLANTED['cookie']}".encode()),
                            (
                                b"proxy-authorization",
                                f"Basic {PLANTED['proxy-authorization']}".encode(),
                            ),
                            (b"content-type", b"application/json"),
                        ],
                        chat_body(),
                    ),
                    # x-api-key beside the bearer token: dropped, never used.
                    await post(
                        pool,
                        f"{CHAT}?{query}",
                        [
                            (b"authorization", f"Bearer {TOKEN}".encode()),
                            (b"x-api-key", PLANTED["x-api-key"].encode()),
                        ],
                        chat_body(stream=True),
                    ),
                    # Anthropic: a Basic authorization the boundary must not take as the token.
                    await post(
                        pool,
                        "/anthropic/v1/messages",
                        [
                            (b"authorization", f"Basic {PLANTED['authorization']}".encode()),
                            (b"x-api-key", TOKEN.encode()),
                            (b"anthropic-version", b"2023-06-01"),
                        ],
                        json.dumps(
                            {
                                "model": "claude-haiku-4-5",
                                "max_tokens": 8,
                                "messages": [{"role": "user", "content": "hi"}],
                            }
                        ).encode(),
                    ),
                    # Refused: a wrong bearer (a secret) in place of the run token.
                    await post(
                        pool,
                        f"{CHAT}?{query}",
                        [(b"authorization", f"Bearer {PLANTED['authorization']}".encode())],
                        chat_body(),
                    ),
                    # Refused: userinfo in an absolute-form target for no configured provider.
                    await post(
                        pool,
                        f"http://user:{PLANTED['userinfo']}@{host}/user:{PLANTED['userinfo']}@x/v1",
                        [(b"authorization", f"Bearer {TOKEN}".encode())],
                        chat_body(),
                    ),
                ]
            finally:
                await pool.aclose()
    assert [status for status, _ in answers] == [200, 200, 200, 401, 400]
    # The echoing upstream sent the real key back; the agent got the marker in its
    # place (tests/test_keys_relay.py).
    assert REAL_KEY.encode() not in answers[2][1]
    assert b"your key is [redacted]" in answers[2][1]

    raw = rig.raw()
    assert_no_secret_in(raw, "the ledger")
    events = rig.events()
    requests = [e for e in events if e["type"] == "model.request"]
    assert len(requests) == 3 and len(rig.events("policy.denied")) == 2
    # Recorded, not dropped: the URL with its secret values marked, the bodies redacted.
    assert requests[0]["url"] == "/v1/chat/completions?key=[redacted]&token=[redacted]&n=1"
    recorded = json.loads(requests[0]["request_body"])
    assert recorded["metadata"] == {"api_key": "[redacted]", "max_tokens_note": "kept"}
    assert recorded["messages"][0]["content"] == "my run token is [redacted], keep it"
    assert recorded["max_tokens"] == 8
    assert requests[0]["request_body_redacted"] is True
    assert requests[0]["request_sha256"] == hashlib.sha256(chat_body()).hexdigest()
    (echoed,) = [
        e for e in events if e["type"] == "model.response" and e["provider"] == "anthropic"
    ]
    assert "your key is [redacted]" in echoed["response_body"]


async def test_client_cookies_are_not_forwarded_upstream(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as oa, boundary_rig({"openai": oa}) as rig:
            async with rig.client() as http:
                r = await http.post(CHAT, content=chat_body(), headers={"cookie": "session=abc"})
                assert r.status_code == 200
            (seen,) = oa.log
    assert "cookie" not in [name for name, _ in seen["headers"]]


async def test_bodies_are_not_recorded_by_default(stub_server, boundary_rig):
    body = chat_body()
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            boundary_rig({"openai": oa}) as rig,
            rig.client() as http,
        ):
            r = await http.post(CHAT, content=body)
            assert r.status_code == 200
    (request,) = rig.events("model.request")
    (response,) = rig.events("model.response")
    assert request["request_bytes"] == len(body)
    assert request["request_sha256"] == hashlib.sha256(body).hexdigest()
    assert response["bytes"] == len(r.content)
    assert not [k for e in (request, response) for k in e if "_body" in k]
    assert b"keep it" not in rig.raw() and r.content not in rig.raw()


async def test_record_bodies_stores_request_and_response_as_text(stub_server, boundary_rig):
    plain = json.dumps(
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "naïve ☃"}]},
        ensure_ascii=False,
    ).encode()
    streamed = json.dumps(
        {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "s"}]}
    ).encode()
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=3) as oa,
            boundary_rig({"openai": oa}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            whole = await http.post(CHAT, content=plain)
            stream = await http.post(CHAT, content=streamed)
    requests = rig.events("model.request")
    responses = rig.events("model.response")
    # Nothing to redact: the text is the bytes as they came, byte for byte.
    assert [r["request_body"].encode() for r in requests] == [plain, streamed]
    assert responses[0]["response_body"].encode() == whole.content
    assert not [k for e in requests + responses for k in e if k.endswith(("redacted", "truncated"))]
    # The stream as the upstream sent it: with the usage chunk the boundary asked for
    # and kept from the client.
    recorded = responses[1]["response_body"]
    assert recorded.endswith("data: [DONE]\n\n")
    assert '"choices":[]' in recorded and '"choices":[]' not in stream.text
    assert responses[1]["bytes"] == len(recorded.encode())


async def test_record_bodies_marks_binary_and_cut_bodies(
    upstream_server, boundary_rig, monkeypatch
):
    monkeypatch.setattr(bodies, "RECORDED_BODY_BYTES", 64)  # the request's and the answer's
    binary = b"\xff\xfe\x00 not text " + REAL_KEY.encode()

    async def binary_error(request, respond):
        await request.read_body()
        await respond.simple(502, [(b"content-type", b"application/octet-stream")], binary)

    big = chat_body()  # longer than 64 bytes: recorded cut
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(binary_error, "openai") as up,
            boundary_rig({"openai": up}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            r = await http.post(CHAT, content=big)
    # Relayed as it came, but for the key.
    assert r.status_code == 502 and r.content == binary.replace(REAL_KEY.encode(), b"[redacted]")
    (request,) = rig.events("model.request")
    (error,) = rig.events("model.error")
    # The cut prefix went through the parser; the token the cut split is dropped.
    assert big[:64].startswith(request["request_body"].encode())
    assert len(request["request_body"]) > 32
    assert request["request_body_truncated"] is True
    # Not text: recorded as its hash and length only, never as clear base64.
    assert error["response_body_not_recorded"] == "not_utf8"
    assert error["response_body_sha256"] == hashlib.sha256(binary).hexdigest()
    assert error["response_body_bytes"] == len(binary)
    assert not [k for k in error if k.endswith(("_body", "_base64"))]
    assert_no_secret_in(rig.raw(), "the ledger")


AGENT = textwrap.dedent(
    """
    import os, sys, httpx
    if "STUB_KEY" in os.environ:
        sys.exit("the real key reached the agent")
    base, token = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    p = {k: os.environ["PLANTED_" + k.upper().replace("-", "_")] for k in PLANTED_NAMES}
    body = {"model": "gpt-4o-mini", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hello"}]}
    headers = {"authorization": "Bearer " + token, "api-key": p["api-key"],
               "cookie": "session=" + p["cookie"],
               "proxy-authorization": "Basic " + p["proxy-authorization"]}
    params = {"key": p["query-key"], "token": p["query-token"]}
    r1 = httpx.post(base + "/chat/completions", json=body, headers=headers, params=params)
    # Userinfo in the URL: httpx sends it as Basic auth; the run token goes in x-api-key.
    with_userinfo = base.replace("http://", "http://user:" + p["userinfo"] + "@")
    r2 = httpx.post(with_userinfo + "/chat/completions", json=body, headers={"x-api-key": token})
    # A wrong bearer (a secret) in place of the run token: refused.
    r3 = httpx.post(base + "/chat/completions", json=body,
                    headers={"authorization": "Bearer " + p["authorization"]})
    statuses = (r1.status_code, r2.status_code, r3.status_code)
    sys.exit(0 if statuses == (200, 200, 401) else f"statuses {statuses}")
    """
).replace("PLANTED_NAMES", repr(list(PLANTED)))


async def test_a_supervised_run_leaves_no_secret_in_ledger_or_receipt(
    stub_server, tmp_path, monkeypatch
):
    """The whole of `docket run`: a real agent process planting secrets, the real
    supervisor, its ledger and its receipt, which `verify` accepts."""
    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as oa:
            policy = tmp_path / "docket.toml"
            policy.write_text(
                f'[providers.openai]\nkind = "openai"\nbase_url = "{oa.url}"\n'
                'key_env = "STUB_KEY"\n'
            )
            planted_env = {"PLANTED_" + k.upper().replace("-", "_"): v for k, v in PLANTED.items()}
            options = RunOptions(
                command=[sys.executable, "-c", AGENT],
                policy_path=str(policy),
                ledger_dir=str(tmp_path / "run"),
                extra_env=planted_env,
            )
            outcome = await Supervisor(options).run()
            forwarded = len(oa.log)
    assert outcome.exit_status == 0, outcome.reason
    assert forwarded == 2
    ledger, receipt = outcome.ledger.read_bytes(), outcome.receipt.read_bytes()
    assert_no_secret_in(ledger, "the ledger")
    assert_no_secret_in(receipt, "the receipt")
    assert verify(outcome.receipt).ok
    assert b"key=[redacted]&token=[redacted]" in ledger


# ---------------------------------------------------------------- recorded_body, property-tested

BODY_SECRETS = ("sk-secretA1b2C3d4e5", "dkt-tokenZ9y8X7w6v5")
_safe_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).filter(
    lambda k: not is_credential_member(k)
)
_secret_keys = st.sampled_from(
    [
        "api_key",
        "apiKey",
        "x-api-key",
        "password",
        "access_token",
        "client_secret",
        "token",
        "Authorization",
        "cookie",
    ]
)


def _json_values(planted: bool):
    strings = st.text(max_size=20)
    if planted:
        # Secrets inside ordinary strings, anywhere.
        strings = st.tuples(strings, st.sampled_from(BODY_SECRETS), strings).map("".join) | strings
    leaves = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | strings
    keys = (_safe_keys | _secret_keys) if planted else _safe_keys
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=12,
    )


@settings(max_examples=io_examples(), deadline=None)
@given(
    body=st.dictionaries(_safe_keys | _secret_keys, _json_values(planted=True), max_size=5),
    credential=st.sampled_from(BODY_SECRETS) | st.text(min_size=1, max_size=12),
)
def test_recorded_json_bodies_hold_no_secret(body, credential):
    body["api_key"] = credential  # always one credential-named member
    data = json.dumps(body, ensure_ascii=False).encode()
    fields = forward.recorded_body("request", data, BODY_SECRETS)
    text = fields["request_body"]
    for secret in BODY_SECRETS:
        assert secret not in text
    assert json.loads(text)["api_key"] == "[redacted]"
    assert fields["request_body_redacted"] is True


@settings(max_examples=io_examples(), deadline=None)
@given(body=st.dictionaries(_safe_keys, _json_values(planted=False), max_size=5))
def test_recorded_bodies_without_secrets_are_the_bytes_as_sent(body):
    data = json.dumps(body, ensure_ascii=False).encode()
    assert forward.recorded_body("response", data, BODY_SECRETS) == {"response_body": data.decode()}


@settings(deadline=None)
@given(data=st.binary(max_size=200), at=st.integers(0, 200), secret=st.sampled_from(BODY_SECRETS))
def test_recorded_binary_bodies_hold_no_secret(data, at, secret):
    data = data[:at] + secret.encode() + data[at:]
    fields = forward.recorded_body("response", data, BODY_SECRETS)
    if "response_body" in fields:
        assert secret not in fields["response_body"]
        assert fields["response_body_redacted"] is True
    else:  # not UTF-8, or not JSON: the hash and length only
        assert set(fields) == {
            "response_body_not_recorded",
            "response_body_sha256",
            "response_body_bytes",
        }
