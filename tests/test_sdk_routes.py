"""Small things, with the real SDKs through the boundary to the stub: the
models list is relayed and recorded as a provider.call (no spend), and the stub
answers the Responses API and embeddings the boundary routes."""

from __future__ import annotations

import trio
from conftest import REAL_KEY, TOKEN
from helpers import LazyModule

from chaos.stub.common import make_reply
from chaos.stub.server import fingerprint
from docket.receipts.tally import Tally

anthropic = LazyModule("anthropic")
openai = LazyModule("openai")

DEADLINE = 20


def _tally(events: list[dict]) -> Tally:
    tally = Tally()
    for event in events:
        tally.add(event)
    return tally


async def test_models_list_is_relayed_and_recorded_without_spend(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            stub_server("anthropic") as an,
            boundary_rig({"openai": oa, "anthropic": an}) as rig,
        ):
            o = openai.AsyncOpenAI(base_url=f"{rig.url}/openai/v1", api_key=TOKEN, max_retries=0)
            a = anthropic.AsyncAnthropic(
                base_url=f"{rig.url}/anthropic", api_key=TOKEN, max_retries=0
            )
            try:
                listed = [m.id async for m in o.models.list()]
                claude = [m.id async for m in a.models.list()]
                one = await o.models.retrieve("gpt-4o")
                other = await a.models.retrieve("claude-haiku-4-5")
                try:
                    await o.models.retrieve("no-such-model")
                    missing = None
                except openai.NotFoundError as exc:
                    missing = exc.status_code
                # not a listing: still refused as not a model call
                try:
                    await o.files.list()
                    refused = None
                except openai.BadRequestError as exc:
                    refused = exc.status_code
                bad_token = openai.AsyncOpenAI(
                    base_url=f"{rig.url}/openai/v1", api_key="not-the-token", max_retries=0
                )
                try:
                    await bad_token.models.list()
                    unauthorized = None
                except openai.AuthenticationError as exc:
                    unauthorized = exc.status_code
                await bad_token.close()
            finally:
                await o.close()
                await a.close()
            upstream_keys = {e["key"] for e in oa.log} | {e["key"] for e in an.log}
            upstream_paths = [e["path"] for e in oa.log] + [e["path"] for e in an.log]
    assert listed == ["gpt-4o-mini", "gpt-4o", "gpt-4.1-mini"]
    assert claude == ["claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1"]
    assert (one.id, other.id, missing) == ("gpt-4o", "claude-haiku-4-5", 404)
    assert refused == 400 and unauthorized == 401
    assert upstream_paths == [  # neither refusal went upstream
        "/v1/models",
        "/v1/models/gpt-4o",
        "/v1/models/no-such-model",
        "/v1/models",
        "/v1/models/claude-haiku-4-5",
    ]
    assert upstream_keys == {fingerprint(REAL_KEY)}  # the real key, not the run token

    events = rig.events()  # from the ledger's bytes
    calls = [e for e in events if e["type"] == "provider.call"]
    assert [(c["provider"], c["endpoint"], c["method"], c["status"]) for c in calls] == [
        ("openai", "models.list", "GET", 200),
        ("anthropic", "models.list", "GET", 200),
        ("openai", "models.retrieve", "GET", 200),
        ("anthropic", "models.retrieve", "GET", 200),
        ("openai", "models.retrieve", "GET", 404),
    ]
    assert all(c["bytes"] > 0 and c["duration_ms"] >= 0 for c in calls)
    assert calls[0]["client_attempt"] == 0  # the SDKs mark a listing's attempts too
    assert not [e for e in events if e["type"].startswith("model.")]
    totals = _tally(events).to_claims()["totals"]
    assert (totals["model_calls"], totals["cost_nusd"]) == (0, 0)
    denied = [e for e in events if e["type"] == "policy.denied"]
    assert sorted(d["rule"] for d in denied) == ["auth", "endpoint"]


async def test_responses_and_embeddings_through_the_boundary(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=5) as up,
            boundary_rig({"openai": up}) as rig,
        ):
            o = openai.AsyncOpenAI(base_url=f"{rig.url}/openai/v1", api_key=TOKEN, max_retries=0)
            try:
                whole = await o.responses.create(
                    model="gpt-4o-mini", input="sixteen bytes!!!", max_output_tokens=50
                )
                cut = await o.responses.create(
                    model="gpt-4o-mini", input="sixteen bytes!!!", max_output_tokens=3
                )
                async with o.responses.stream(model="gpt-4o-mini", input="sixteen bytes!!!") as s:
                    streamed = "".join(
                        [e.delta async for e in s if e.type == "response.output_text.delta"]
                    )
                    final = await s.get_final_response()
                vectors = await o.embeddings.create(
                    model="text-embedding-3-small", input=["sixteen bytes!!!", "four"]
                )
                floats = await o.embeddings.create(
                    model="text-embedding-3-small", input="four", encoding_format="float"
                )
            finally:
                await o.close()
    assert whole.output_text == make_reply(5, None).text and whole.status == "completed"
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (4, 5)
    assert cut.status == "incomplete" and cut.usage.output_tokens == 3
    assert streamed == make_reply(5, None).text == final.output_text
    assert (final.usage.input_tokens, final.usage.output_tokens) == (4, 5)
    assert [len(d.embedding) for d in vectors.data] == [8, 8]  # base64, decoded by the SDK
    assert vectors.data[1].embedding == floats.data[0].embedding  # same text, same vector
    assert vectors.usage.prompt_tokens == 5

    events = rig.events()
    requests = [e for e in events if e["type"] == "model.request"]
    assert [(r["endpoint"], r["stream"]) for r in requests] == [
        ("responses", False),
        ("responses", False),
        ("responses", True),
        ("embeddings", False),
        ("embeddings", False),
    ]
    closing = [e for e in events if e["type"] in ("model.response", "model.error")]
    assert [e["type"] for e in closing] == ["model.response"] * 5
    assert [(e["usage"]["input_tokens"], e["usage"]["output_tokens"]) for e in closing] == [
        (4, 5),
        (4, 3),
        (4, 5),
        (5, 0),
        (1, 0),
    ]


def test_only_model_listings_are_relayed():
    from docket.boundary.non_model import non_model_endpoint

    assert non_model_endpoint("GET", "/v1/models") == "models.list"
    assert non_model_endpoint("GET", "/v1/models/") == "models.list"
    assert non_model_endpoint("GET", "/v1/models/gpt-4o-mini") == "models.retrieve"
    assert non_model_endpoint("GET", "/v1/models/ft:gpt-4o:org@x.y") == "models.retrieve"
    for method, path in [
        ("POST", "/v1/models"),
        ("DELETE", "/v1/models/ft:x"),
        ("GET", "/v1/files"),
        ("GET", "/v1/models/a/b"),
        ("GET", "/v1/models/" + "x" * 129),
        ("GET", "/v1/models/%2e%2e"),
        ("GET", "/v1/models/../files"),
        ("GET", "/v2/models"),
    ]:
        assert non_model_endpoint(method, path) is None, (method, path)


async def test_an_unreachable_provider_is_recorded_and_answered_502(boundary_rig):
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with trio.fail_after(DEADLINE):
        async with boundary_rig({"openai": ("openai", f"http://127.0.0.1:{port}")}) as rig:
            o = openai.AsyncOpenAI(base_url=f"{rig.url}/openai/v1", api_key=TOKEN, max_retries=0)
            try:
                await o.models.list()
                status = None
            except openai.APIStatusError as exc:
                status = exc.status_code
            finally:
                await o.close()
    assert status == 502
    (call,) = rig.events("provider.call")
    assert call["reason"] == "connect" and "status" not in call


async def test_client_marks_carry_no_secret_into_the_ledger(stub_server, boundary_rig):
    """The run token and the provider key, sent as the client's ids, and marks out of
    grammar: none reaches the ledger's bytes; the headers' names are listed instead."""
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}) as rig,
        ):
            o = openai.AsyncOpenAI(base_url=f"{rig.url}/openai/v1", api_key=TOKEN, max_retries=0)
            try:
                await o.chat.completions.create(
                    model="gpt-4o-mini",
                    messages=[{"role": "user", "content": "hi"}],
                    extra_headers={
                        "idempotency-key": f"key-{TOKEN}",
                        "x-request-id": REAL_KEY,
                        "x-client-request-id": "ok-1",
                        "x-stainless-retry-count": "99999",
                    },
                )
            finally:
                await o.close()
    raw = rig.raw()
    assert TOKEN.encode() not in raw and REAL_KEY.encode() not in raw
    (request,) = rig.events("model.request")
    assert request["client_ids"] == {"client_request_id": "ok-1"}
    assert request["client_marks_rejected"] == [
        "idempotency-key",
        "x-request-id",
        "x-stainless-retry-count",
    ]
    assert "client_attempt" not in request


async def test_a_hostile_models_answer_is_scrubbed_or_refused(upstream_server, boundary_rig):
    """An upstream that echoes the provider key in its models list (the key never
    reaches the agent), and one whose list is past 4 MiB (a protocol failure, 502)."""
    import httpx

    from docket.boundary.non_model import MAX_ANSWER_BYTES

    async def echo(request, respond):
        auth = dict(request.headers).get(b"authorization", b"")
        await respond.simple(200, [(b"x-echo", auth)], b'{"data": [], "key": "' + auth + b'"}')

    async def huge(request, respond):
        await respond.simple(200, [], b" " * (MAX_ANSWER_BYTES + 1))

    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(echo, "openai") as e,
            upstream_server(huge, "openai") as h,
            boundary_rig({"echo": e, "huge": h}) as rig,
        ):
            auth = {"authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(timeout=10) as http:
                echoed = await http.get(f"{rig.url}/echo/v1/models", headers=auth)
                too_big = await http.get(f"{rig.url}/huge/v1/models", headers=auth)
    assert echoed.status_code == 200 and REAL_KEY not in echoed.text
    assert REAL_KEY not in echoed.headers["x-echo"] and "[redacted]" in echoed.text
    assert too_big.status_code == 502
    calls = rig.events("provider.call")
    assert [(c["provider"], c.get("status"), c.get("reason")) for c in calls] == [
        ("echo", 200, None),
        ("huge", None, "protocol"),
    ]
    assert REAL_KEY.encode() not in rig.raw()
