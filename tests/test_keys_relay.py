"""An upstream that echoes the provider key never hands it to the
agent. The boundary over real sockets; the upstream quotes the key it was really
sent (read from its own request's headers) in an error body, in a header and in a
stream whose chunks cut the key in two."""

from __future__ import annotations

import json

import trio
from conftest import REAL_KEY
from test_boundary import CHAT, DEADLINE, chat

from docket.boundary import forward
from docket.guards.scrub import SCRUB_MARKER, Scrubber


def key_sent(request) -> bytes:
    auth = request.header(b"authorization") or b""
    assert auth.startswith(b"Bearer "), auth
    return auth[len(b"Bearer ") :]


async def echo_in_error(request, respond):
    await request.read_body()
    key = key_sent(request)
    body = json.dumps(
        {"error": {"message": f"Incorrect API key provided: {key.decode()}", "type": "auth"}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"x-echo", b"key=" + key)]
    await respond.simple(401, headers, body)


def stream_frames(key: bytes) -> list[bytes]:
    """An OpenAI stream whose second event carries the key, cut across three writes."""

    def event(payload: dict) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    quoting = event({"choices": [{"index": 0, "delta": {"content": "KEY" + key.decode()}}]})
    at = quoting.index(key)
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    return [
        event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]}),
        quoting[: at + 5],
        quoting[at + 5 : at + 12],
        quoting[at + 12 :],
        event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}),
        b"data: [DONE]\n\n",
    ]


async def echo_in_stream(request, respond):
    await request.read_body()
    await respond.start(200, [(b"content-type", b"text/event-stream")])
    for frame in stream_frames(key_sent(request)):
        await respond.send(frame)
        await trio.sleep(0.01)  # separate reads at the boundary, so the key is cut there
    await respond.end()


class SeenHeld(Scrubber):
    """The boundary's scrubber, noting when it held bytes back between two reads."""

    held: list[bytes] = []

    def feed(self, data: bytes) -> bytes:
        out = super().feed(data)
        if self._held:
            SeenHeld.held.append(self._held)
        if self._events is not None and self._events._partial:  # an event not yet whole
            SeenHeld.held.append(self._events._partial)
        return out


async def test_a_key_echoed_by_the_upstream_is_scrubbed_from_what_the_agent_gets(
    upstream_server, boundary_rig, monkeypatch
):
    key = REAL_KEY.encode()
    monkeypatch.setattr(forward, "Scrubber", SeenHeld)
    SeenHeld.held = []
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(echo_in_error, "openai") as err,
            upstream_server(echo_in_stream, "openai") as streamed,
            boundary_rig({"openai": err, "streamed": streamed}) as rig,
            rig.client() as http,
        ):
            r1 = await http.post(CHAT, json=chat(max_tokens=20))
            # Asking for usage itself, the agent gets the upstream's chunks as they come
            # (the boundary strips nothing), so the key arrives cut across reads.
            r2 = await http.post(
                "/streamed/v1/chat/completions",
                json=chat(max_tokens=20, stream=True, stream_options={"include_usage": True}),
            )
            # Not asking, the boundary asks for it and relays whole events, usage stripped.
            r3 = await http.post(
                "/streamed/v1/chat/completions", json=chat(max_tokens=20, stream=True)
            )
    assert r1.status_code == 401
    assert key not in r1.content and SCRUB_MARKER in r1.content
    assert json.loads(r1.content)["error"]["type"] == "auth"  # the rest is relayed as it came
    assert r1.headers["x-echo"] == "key=" + SCRUB_MARKER.decode()
    assert r2.status_code == 200
    assert key not in r2.content
    assert b"KEY" + SCRUB_MARKER in r2.content and r2.content.endswith(b"data: [DONE]\n\n")
    # The key really was cut across the boundary's reads: a prefix of it was held back.
    assert any(key[:5] in held and key not in held for held in SeenHeld.held), SeenHeld.held
    assert r3.status_code == 200 and key not in r3.content
    assert b"KEY" + SCRUB_MARKER in r3.content
    # The scrub is on record: the call's closing event counts the keys taken out.
    error, response = rig.events("model.error"), rig.events("model.response")
    assert [e["key_scrubbed"] for e in error] == [2]  # the body and the header
    assert [e["key_scrubbed"] for e in response] == [1, 1]
    assert key not in rig.raw()


async def test_answers_without_the_key_are_relayed_byte_for_byte(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as stub,
            boundary_rig({"openai": stub}) as rig,
            rig.client() as http,
        ):
            r = await http.post(CHAT, json=chat(max_tokens=20, stream=True))
    assert r.status_code == 200 and SCRUB_MARKER not in r.content
    (close,) = rig.events("model.response")
    assert "key_scrubbed" not in close


def encoded_forms(key: bytes) -> list[bytes]:
    """The forms an agent recovered the key from."""
    import base64

    return [
        key.replace(b"-", b"\\u002d"),
        base64.b64encode(b"k=" + key),
        base64.urlsafe_b64encode(key),
        key.hex().encode(),
        key.hex().upper().encode(),
    ]


def leaks(key: bytes, data: bytes) -> list[bytes]:
    return [form for form in encoded_forms(key) if form in data] + ([key] if key in data else [])


async def echo_encoded_in_stream(request, respond):
    """Each form in its own SSE delta, each cut across two writes (two reads at the
    boundary), the error body quoting every form too."""
    await request.read_body()
    forms = encoded_forms(key_sent(request))
    await respond.start(200, [(b"content-type", b"text/event-stream")])
    for form in forms:
        event = b'data: {"choices": [{"index": 0, "delta": {"content": "' + form + b'"}}]}\n\n'
        cut = event.index(form) + len(form) // 2
        await respond.send(event[:cut])
        await trio.sleep(0.01)  # separate reads at the boundary, so the form is cut there
        await respond.send(event[cut:])
    await respond.send(b"data: [DONE]\n\n")
    await respond.end()


async def echo_encoded_in_error(request, respond):
    await request.read_body()
    body = b'{"error": {"message": "' + b" ".join(encoded_forms(key_sent(request))) + b'"}}'
    await respond.simple(400, [(b"content-type", b"application/json")], body)


async def test_a_key_echoed_escaped_base64_or_hex_reaches_neither_agent_nor_ledger(
    upstream_server, boundary_rig
):
    key = REAL_KEY.encode()
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(echo_encoded_in_error, "openai") as err,
            upstream_server(echo_encoded_in_stream, "openai") as streamed,
            boundary_rig({"openai": err, "streamed": streamed}) as rig,
            rig.client() as http,
        ):
            r1 = await http.post(CHAT, json=chat(max_tokens=20))
            r2 = await http.post(
                "/streamed/v1/chat/completions",
                json=chat(max_tokens=20, stream=True, stream_options={"include_usage": True}),
            )
    assert r1.status_code == 400 and leaks(key, r1.content) == []
    assert r2.status_code == 200 and leaks(key, r2.content) == []
    assert r2.content.count(SCRUB_MARKER) == 5 and r2.content.endswith(b"data: [DONE]\n\n")
    assert leaks(key, rig.raw()) == []
    (error,) = rig.events("model.error")
    assert error["key_scrubbed_forms"] == {"base64": 2, "hex": 2, "json": 1}
    (response,) = rig.events("model.response")
    assert response["key_scrubbed"] == 5


async def echo_split_across_deltas(request, respond):
    """The key's two halves in two deltas: no byte run holds it, the joined text does."""
    await request.read_body()
    key = key_sent(request).decode()
    half = len(key) // 2
    await respond.start(200, [(b"content-type", b"text/event-stream")])
    for text in ("here: ", key[:half], key[half:], " done"):
        payload = {"choices": [{"index": 0, "delta": {"content": text}}]}
        await respond.send(b"data: " + json.dumps(payload).encode() + b"\n\n")
        await trio.sleep(0.01)  # separate reads at the boundary
    await respond.send(b"data: [DONE]\n\n")
    await respond.end()


async def test_a_key_split_across_stream_deltas_never_joins_up_for_the_agent(
    upstream_server, boundary_rig
):
    key = REAL_KEY
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(echo_split_across_deltas, "openai") as split,
            boundary_rig({"openai": split}) as rig,
            rig.client() as http,
        ):
            r = await http.post(
                CHAT, json=chat(max_tokens=20, stream=True, stream_options={"include_usage": True})
            )
    assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")
    texts = [
        json.loads(line[6:])["choices"][0]["delta"]["content"]
        for line in r.content.split(b"\n")
        if line.startswith(b"data: {")
    ]
    joined = "".join(texts)
    assert joined == "here: [redacted] done", texts
    assert key[len(key) // 2 :] not in joined  # not even the second half
    (response,) = rig.events("model.response")
    assert response["key_scrubbed"] == 1
    assert key.encode() not in rig.raw() and key[len(key) // 2 :].encode() not in rig.raw()
