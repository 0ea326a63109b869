"""The official openai and anthropic SDKs, unchanged, pointed at the boundary with the
run token as their API key (as `docket run` configures an agent). They run under
trio (they use anyio); retries are off so that an SDK retry cannot hide behaviour."""

from __future__ import annotations

import pytest
import trio
from conftest import REAL_KEY, TOKEN
from helpers import LazyModule

from chaos.stub.common import make_reply
from chaos.stub.server import fingerprint

anthropic = LazyModule("anthropic")
openai = LazyModule("openai")

DEADLINE = 20
QUESTION = [{"role": "user", "content": "sixteen bytes!!!"}]  # 4 input tokens at the stub


def openai_client(rig, token: str = TOKEN) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{rig.url}/openai/v1", api_key=token, max_retries=0)


def anthropic_client(rig, token: str = TOKEN) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=f"{rig.url}/anthropic", api_key=token, max_retries=0)


def calls(rig) -> list[tuple[dict, dict]]:
    """(model.request, closing event) pairs, from the ledger's bytes (chain verified)."""
    events = rig.events()
    requests = {e["call_id"]: e for e in events if e["type"] == "model.request"}
    closes = [e for e in events if e["type"] in ("model.response", "model.error")]
    assert sorted(c["call_id"] for c in closes) == sorted(requests)
    return [(requests[c["call_id"]], c) for c in closes]


async def test_openai_sdk_unchanged_through_the_boundary(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=5) as up,
            boundary_rig({"openai": up}) as rig,
        ):
            client = openai_client(rig)
            try:
                done = await client.chat.completions.create(
                    model="gpt-4o-mini", messages=QUESTION, max_tokens=50
                )
                stream = await client.chat.completions.create(
                    model="gpt-4o-mini", messages=QUESTION, stream=True, max_tokens=3
                )
                streamed = [c async for c in stream]
                asked = await client.chat.completions.create(
                    model="gpt-4o-mini",
                    messages=QUESTION,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                asked_chunks = [c async for c in asked]
            finally:
                await client.close()
            stub_keys = {e["key"] for e in up.log}
    assert done.choices[0].message.content == make_reply(5, None).text
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (4, 5)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == make_reply(3, None).text
    assert all(c.usage is None for c in streamed)  # it did not ask, so it sees none
    (usage,) = [c.usage for c in asked_chunks if c.usage is not None]
    assert (usage.prompt_tokens, usage.completion_tokens) == (4, 5)
    assert stub_keys == {fingerprint(REAL_KEY)}

    recorded = calls(rig)
    assert [(r["stream"], c["type"]) for r, c in recorded] == [
        (False, "model.response"),
        (True, "model.response"),
        (True, "model.response"),
    ]
    assert [(c["usage"]["input_tokens"], c["usage"]["output_tokens"]) for _, c in recorded] == [
        (4, 5),
        (4, 3),
        (4, 5),
    ]
    assert all(c["cost_nusd"] > 0 and c["priced"] for _, c in recorded)


async def test_anthropic_sdk_unchanged_through_the_boundary(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("anthropic", reply_tokens=5) as up,
            boundary_rig({"anthropic": up}) as rig,
        ):
            client = anthropic_client(rig)
            try:
                done = await client.messages.create(
                    model="claude-haiku-4-5", max_tokens=100, messages=QUESTION
                )
                async with client.messages.stream(
                    model="claude-haiku-4-5", max_tokens=2, messages=QUESTION
                ) as stream:
                    text = "".join([piece async for piece in stream.text_stream])
                    final = await stream.get_final_message()
                raw_stream = await client.messages.create(
                    model="claude-haiku-4-5", max_tokens=100, messages=QUESTION, stream=True
                )
                kinds = [event.type async for event in raw_stream]
            finally:
                await client.close()
            stub_keys = {e["key"] for e in up.log}
    assert done.content[0].text == make_reply(5, None).text
    assert (done.usage.input_tokens, done.usage.output_tokens) == (4, 5)
    assert text == make_reply(2, None).text
    assert final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (4, 2)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert stub_keys == {fingerprint(REAL_KEY)}

    recorded = calls(rig)
    assert [(r["stream"], r["max_output_tokens"]) for r, _ in recorded] == [
        (False, 100),
        (True, 2),
        (True, 100),
    ]
    assert [(c["usage"]["input_tokens"], c["usage"]["output_tokens"]) for _, c in recorded] == [
        (4, 5),
        (4, 2),
        (4, 5),
    ]
    assert {c["type"] for _, c in recorded} == {"model.response"}


async def test_sdks_read_the_boundarys_refusals_as_their_own_errors(stub_server, boundary_rig):
    """A refusal in the provider's shape is the SDK's typed error, with the docket_* type."""
    policy = {"caps": {"max_usd": 0.00001}}
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            stub_server("anthropic") as an,
            boundary_rig({"openai": oa, "anthropic": an}, policy) as rig,
        ):
            oai, ant = openai_client(rig), anthropic_client(rig)
            wrong_oai = openai_client(rig, token="dkt-not-the-token")
            wrong_ant = anthropic_client(rig, token="dkt-not-the-token")
            try:
                with pytest.raises(openai.PermissionDeniedError) as denied_oai:
                    await oai.chat.completions.create(
                        model="gpt-4o-mini", messages=QUESTION, max_tokens=1000
                    )
                with pytest.raises(anthropic.PermissionDeniedError) as denied_ant:
                    await ant.messages.create(
                        model="claude-haiku-4-5", max_tokens=1000, messages=QUESTION
                    )
                with pytest.raises(openai.AuthenticationError) as unauth_oai:
                    await wrong_oai.chat.completions.create(model="gpt-4o-mini", messages=QUESTION)
                with pytest.raises(anthropic.AuthenticationError) as unauth_ant:
                    await wrong_ant.messages.create(
                        model="claude-haiku-4-5", max_tokens=10, messages=QUESTION
                    )
            finally:
                for client in (oai, ant, wrong_oai, wrong_ant):
                    await client.close()
            forwarded = len(oa.log) + len(an.log)
    assert denied_oai.value.type == "docket_policy_denied"
    assert denied_oai.value.body["cap"] == "max_usd"
    assert denied_ant.value.body["error"]["type"] == "docket_policy_denied"
    assert unauth_oai.value.type == "docket_unauthorized"
    assert unauth_ant.value.body["error"]["type"] == "docket_unauthorized"
    assert forwarded == 0
    assert [e["rule"] for e in rig.events("policy.denied")] == [
        "caps.max_usd",
        "caps.max_usd",
        "auth",
        "auth",
    ]


async def test_the_openai_sdk_retries_a_deferred_cap_and_every_call_fits(stub_server, boundary_rig):
    # A cap that holds three calls' worst case, six calls at once from the SDK with its
    # retries on: the three deferred (429 docket_caps_pending, Retry-After 1 s) are
    # retried by the SDK itself and fit once the first ones settle (one wait, ~1 s).
    worst = 16 * 150 + 100 * 600  # bytes of this body at most, 100 output tokens (nUSD)
    cap_nusd = 3 * worst + 10_000
    policy = {"caps": {"max_usd": cap_nusd / 1e9, "on_breach": "deny"}}
    answers: list[str] = []
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=1) as up,
            boundary_rig({"openai": up}, policy) as rig,
        ):
            client = openai.AsyncOpenAI(
                base_url=f"{rig.url}/openai/v1", api_key=TOKEN, max_retries=6
            )
            try:

                async def one() -> None:
                    done = await client.chat.completions.create(
                        model="gpt-4o-mini", messages=QUESTION, max_tokens=100
                    )
                    answers.append(done.choices[0].finish_reason)

                async with trio.open_nursery() as nursery:
                    for _ in range(6):
                        nursery.start_soon(one)
            finally:
                await client.close()
    assert len(answers) == 6
    deferred = rig.events("policy.denied")
    assert deferred and {e["error_type"] for e in deferred} == {"docket_caps_pending"}
    assert len(calls(rig)) == 6 and not rig.events("cap.exceeded")
