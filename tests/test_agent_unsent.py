"""A stop signal counts, as `interrupted`, only the calls the boundary can have.

tests/test_faults_process.py::test_sigterm_to_the_agent_is_recorded_before_it_lands
failed 1 run in 6 (5 in 15 under load): the agent counted a call as interrupted that
it had begun but not yet sent, so `calls + interrupted` exceeded the ledger's
model.request count. A call counts as reaching the boundary once its request's last
byte is on the wire (httpcore's trace); before that it is `unsent`. Both sides here:
a real server on 127.0.0.1 that has the whole request, and a transport that never
writes it.
"""

from __future__ import annotations

import io
import signal
from functools import partial

import httpx
import trio
import trio.testing

from docket.agent.config import config_from
from docket.agent.modes import Agent

DEADLINE = 10


def make_agent(base_url: str, transport: httpx.AsyncBaseTransport | None = None) -> Agent:
    env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "t", "DOCKET_AGENT_SEED": "1"}
    client = httpx.AsyncClient(transport=transport, timeout=DEADLINE, trust_env=False)
    return Agent(config_from(env), client, io.StringIO())


async def test_a_call_whose_request_the_server_has_is_interrupted():
    received = trio.Event()
    wanted = b""

    async def holder(stream: trio.SocketStream) -> None:
        nonlocal wanted
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < length(data):
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        wanted = data
        received.set()
        await trio.sleep_forever()  # answers nothing: the call stays in flight

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, holder, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            agent = make_agent(f"http://127.0.0.1:{port}/v1")
            async with agent.client, trio.open_nursery() as calls:
                calls.start_soon(agent.call, 1)
                await received.wait()  # the server holds the whole request
                await trio.testing.wait_all_tasks_blocked()
                agent.stop(signal.SIGTERM)
                calls.cancel_scope.cancel()
            nursery.cancel_scope.cancel()
    assert wanted.startswith(b"POST /v1/chat/completions")
    assert (agent.tally.stopped, agent.tally.interrupted, agent.tally.unsent) == ("sigterm", 1, 0)


async def test_a_call_stopped_before_its_request_left_is_unsent():
    began = trio.Event()

    async def never_sends(request: httpx.Request) -> httpx.Response:
        # a transport still before the wire (connecting, queued for a connection)
        began.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    agent = make_agent("http://127.0.0.1:9/v1", httpx.MockTransport(never_sends))
    with trio.fail_after(DEADLINE):
        async with agent.client, trio.open_nursery() as calls:
            calls.start_soon(agent.call, 1)
            await began.wait()
            agent.stop(signal.SIGTERM)
            calls.cancel_scope.cancel()
    assert (agent.tally.stopped, agent.tally.interrupted, agent.tally.unsent) == ("sigterm", 0, 1)
    assert agent.in_flight == 0 and agent.sent_in_flight == 0  # settled by the cancellation


def length(head_and_body: bytes) -> int:
    head = head_and_body.split(b"\r\n\r\n", 1)[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0
