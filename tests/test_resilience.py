"""The resilience guards wired into the boundary: breaker, rate limiter, bulkhead, deadlines.

Real sockets on 127.0.0.1, a stub or a scripted upstream behind the boundary,
and every claim checked against the ledger's bytes on disk, the upstream's own
view (what reached it, and when) and /docket/metrics. Nothing sleeps to wait
for something: a test that needs a cooldown to pass keeps calling, each call
refused and recorded, until one is let through, and measures when.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
import trio
from conftest import TOKEN
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from docket.agent.command import run_agent
from docket.agent.config import config_from
from docket.boundary import forward
from docket.boundary.guarded import (
    CLOSE_RESERVE_S,
    FAILURE_REASONS,
    NEUTRAL_REASONS,
    Hold,
    breaker_outcome,
)
from docket.clock import FakeClock
from docket.guards import deadline as dl
from docket.guards.limiter import Admit

DEADLINE = 20
CHAT = "/openai/v1/chat/completions"


def chat(content: str = "What is 2+2?", **extra) -> dict:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **extra}


# ---------------------------------------------------------------- pure: the deadline


@settings(deadline=None)
@given(st.binary(max_size=16) | st.from_regex(rb"\A *[0-9]{1,30} *\Z"))
def test_a_deadline_header_is_a_whole_number_of_ms_or_refused(raw):
    try:
        ms = dl.parse_deadline_ms(raw)
    except dl.BadDeadline as exc:
        assert str(exc).startswith("x-docket-deadline-ms: ")
        stripped = raw.strip()
        assert not (stripped.isdigit() and stripped.isascii() and int(stripped) <= 86_400_000)
        return
    assert raw.strip().isdigit() and 0 <= ms <= dl.MAX_DEADLINE_MS and ms == int(raw.strip())


def test_a_deadline_sent_twice_is_refused_and_none_is_no_budget():
    assert dl.caller_budget([(b"content-type", b"application/json")], 5.0) is None
    assert dl.caller_budget([(b"X-Docket-Deadline-Ms", b"250")], 5.0) == (250, 5.25)
    with pytest.raises(dl.BadDeadline, match="sent 2 times"):
        dl.caller_budget([(b"x-docket-deadline-ms", b"1"), (b"x-docket-deadline-ms", b"2")], 0)
    with pytest.raises(dl.BadDeadline, match="-5"):
        dl.caller_budget([(b"x-docket-deadline-ms", b"-5")], 0)


@settings(deadline=None)
@given(
    now=st.floats(0, 1e6),
    ms=st.integers(0, 10**7),
    since=st.floats(0, 1e4),
    reserve=st.floats(0, 1),
)
def test_an_attempt_never_outlives_the_callers_budget(now, ms, since, reserve):
    budget = dl.caller_budget([(dl.HEADER, str(ms).encode())], now)
    later = now + since
    plan = dl.plan_attempt(later, budget, reserve_s=reserve)
    deadline = budget[1]
    if isinstance(plan, dl.Spent):
        assert deadline - reserve <= later  # nothing was left after the reserve
        assert plan.remaining_s == deadline - later
        assert plan.fields()["deadline_ms"] == ms
        return
    assert plan.cut == deadline - reserve and plan.cut > later
    assert plan.budget_s == plan.cut - later and plan.deadline_ms == ms


def test_no_caller_deadline_means_no_cut():
    assert dl.plan_attempt(3.0, None, reserve_s=0.02) == dl.Attempt(math.inf, None, None)


# ---------------------------------------------------------------- pure: what a call means


def test_every_closing_reason_the_boundary_writes_is_classified_on_purpose():
    """A reason forward.py can record must be a failure or neutral by decision, not by
    falling through: the vocabulary is read from forward.py's own source."""
    import inspect
    import re

    source = inspect.getsource(forward)
    written = set(re.findall(r'_close_error\(\s*"([a-z_]+)"', source))
    for pair in re.findall(
        r'(?:reason|why) = "([a-z_]+)"(?: if [^\n]*? else "([a-z_]+)")?', source
    ):
        written |= set(pair) - {""}
    written |= set(re.findall(r'return "([a-z_]+)"', inspect.getsource(forward.error_reason)))
    written -= {"upstream_status"}
    assert {"timeout", "stream_cut", "client_abort"} <= written, "could not read the reasons"
    assert written <= FAILURE_REASONS | NEUTRAL_REASONS, written - FAILURE_REASONS - NEUTRAL_REASONS
    assert not FAILURE_REASONS & NEUTRAL_REASONS


@pytest.mark.parametrize(
    ("reason", "status", "outcome"),
    [
        (None, 200, "success"),
        ("upstream_status", 500, "failure"),
        ("upstream_status", 503, "failure"),
        ("upstream_status", 429, "ignored"),  # 4xx never counts against the upstream
        ("upstream_status", 400, "ignored"),
        ("timeout", None, "failure"),
        ("connect", None, "failure"),
        ("reset", None, "failure"),
        ("stream_cut", 200, "failure"),
        ("client_abort", None, None),
        ("cancelled", 200, None),
        ("internal_error", None, None),
        ("a_reason_from_the_future", None, None),
    ],
)
def test_breaker_outcomes(reason, status, outcome):
    assert breaker_outcome(reason, status) == outcome


def test_the_close_reserve_is_small_next_to_a_deadline_a_caller_would_send():
    assert 0 < CLOSE_RESERVE_S <= 0.05


# ---------------------------------------------------------------- upstreams for the rigs


def openai_reply(model: str = "gpt-4o-mini") -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "4"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
    ).encode()


JSON = [(b"content-type", b"application/json")]
SAD = json.dumps({"error": {"message": "upstream sad", "type": "server_error"}}).encode()


class Switchable:
    """An upstream that answers 503 while `failing`, else 200; it keeps the trio time of
    each request that reached it (the dependency's own view)."""

    def __init__(self) -> None:
        self.failing = True
        self.arrivals: list[float] = []

    async def __call__(self, request, respond) -> None:
        await request.read_body()
        self.arrivals.append(trio.current_time())
        if self.failing:
            await respond.simple(503, JSON, SAD)
        else:
            await respond.simple(200, JSON, openai_reply())


class Slow:
    """An upstream that takes `latency` seconds per call, counting the calls in flight."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.in_flight = 0
        self.peak = 0
        self.arrivals = 0

    async def __call__(self, request, respond) -> None:
        await request.read_body()
        self.arrivals += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await trio.sleep(self.latency)  # the upstream's own latency
        finally:
            self.in_flight -= 1
        await respond.simple(200, JSON, openai_reply())


class Hanging:
    """An upstream that never answers; it notes the headers it got and sets `gone`
    when the boundary closes the connection."""

    def __init__(self) -> None:
        self.headers: list[list[tuple[bytes, bytes]]] = []
        self.gone = trio.Event()

    async def __call__(self, request, respond) -> None:
        self.headers.append(list(request.headers))
        await request.read_body()
        with trio.move_on_after(30):
            await respond.wait_disconnected()
            self.gone.set()


def error_type(r: httpx.Response) -> str | None:
    if r.status_code < 400:
        return None
    try:
        return r.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return None


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict, family: str, name: str | None = None, **labels) -> float:
    """The value of one sample; `name` picks a histogram's _count or _sum."""
    wanted = name or family
    found = [
        s.value
        for s in fams[family].samples
        if s.name in (wanted, wanted + "_total")
        and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (family, name, labels, fams[family].samples)
    return found[0]


# ---------------------------------------------------------------- the breaker


async def test_breaker_opens_refuses_probes_doubles_and_closes(upstream_server, boundary_rig):
    """The whole cycle against an upstream that fails, then recovers. While the breaker is
    open nothing reaches the upstream; each refusal is a 503 with Retry-After, recorded;
    every transition is a breaker.state event; the metrics agree with the ledger."""
    up = Switchable()
    policy = {
        "resilience": {
            "breaker_threshold": 3,
            "breaker_cooldown_seconds": 0.2,
            "breaker_max_cooldown_seconds": 1.0,
        }
    }
    answers: list[httpx.Response] = []
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
            rig.client() as http,
        ):

            async def call() -> httpx.Response:
                r = await http.post(CHAT, json=chat())
                answers.append(r)
                return r

            async def until_let_through() -> httpx.Response:
                while error_type(r := await call()) == "docket_breaker_open":
                    await trio.sleep(0.01)  # pacing the polls, not waiting for an outcome
                return r

            for _ in range(3):
                assert error_type(await call()) == "server_error"  # the upstream's own 503
            refused = await call()
            assert error_type(refused) == "docket_breaker_open" and len(up.arrivals) == 3
            probe = await until_let_through()
            assert error_type(probe) == "server_error"  # the probe failed: open again
            up.failing = False
            probe = await until_let_through()
            assert probe.status_code == 200
            assert (await call()).status_code == 200
            scraped = (await http.get("/docket/metrics")).text
            durable = rig.ledger.count
            fsyncs = rig.ledger.fsyncs
    events = rig.events()

    changes = [
        (e["from"], e["to"], e["reason"], e["cooldown_s"])
        for e in events
        if e["type"] == "breaker.state"
    ]
    assert changes == [
        ("closed", "open", "consecutive_failures", 0.2),
        ("open", "half_open", "cooldown_elapsed", 0.2),
        ("half_open", "open", "probe_failed", 0.4),
        ("open", "half_open", "cooldown_elapsed", 0.4),
        ("half_open", "closed", "probe_succeeded", 0.2),
    ]
    # Nothing was forwarded while open: no model.request between an opening and the
    # next half-open, and the upstream saw exactly the calls the ledger forwarded.
    state = "closed"
    for e in events:
        if e["type"] == "breaker.state":
            state = e["to"]
        assert not (e["type"] == "model.request" and state == "open"), e
    requests = [e for e in events if e["type"] == "model.request"]
    assert len(up.arrivals) == len(requests) == 6
    # The cooldowns, as the upstream saw them: the first probe no sooner than 0.2 s
    # after the third failure, the second no sooner than 0.4 s after the first.
    third, probe_1, probe_2 = up.arrivals[2], up.arrivals[3], up.arrivals[4]
    assert probe_1 - third >= 0.2 and probe_2 - probe_1 >= 0.4
    # And no longer than that, as the breaker's own clock had it when it decided (the
    # upstream's gaps also hold the test's polling, which a busy machine stretches by
    # seconds; an event's stamp is when it was written, after the decision, and was
    # 1 ms past the cooldown once with three workers): no refusal came once the
    # cooldown had elapsed, each said the time left, and that was within the cooldown.
    opened_at = None
    for e in events:
        if e["type"] == "breaker.state":
            opened_at = (e["mono_ms"], e["cooldown_s"]) if e["to"] == "open" else None
        elif e["type"] == "x-docket.breaker-open":
            assert opened_at is not None, e
            assert 0 < e["retry_after_s"] <= opened_at[1], (e, opened_at)
            assert e["mono_ms"] >= opened_at[0], (e, opened_at)
    # Every refusal: a 503 with Retry-After (whole seconds, up), recorded with its rule.
    refusals = [e for e in events if e["type"] == "x-docket.breaker-open"]
    answered = [r for r in answers if error_type(r) == "docket_breaker_open"]
    assert len(refusals) == len(answered) >= 2
    for event, r in zip(refusals, answered, strict=True):
        assert r.status_code == 503
        assert r.headers["retry-after"] == str(math.ceil(event["retry_after_s"]))
        assert event["rule"] == "resilience.breaker" and event["upstream"] == "openai"
        assert event["state"] == "open" and 0 < event["retry_after_s"] <= 0.4
    # The metrics say what the ledger says.
    fams = families(scraped)
    assert sample(fams, "docket_breaker_refusals", upstream="openai") == len(refusals)
    assert sample(fams, "docket_breaker_state", upstream="openai") == 0
    # The gauge reads closed, as before any failure; the transition counters still show
    # the two openings the scrape would otherwise have missed, one per breaker.state.
    for to_state in ("open", "half_open", "closed"):
        moved = sum(1 for e in events if e["type"] == "breaker.state" and e["to"] == to_state)
        assert sample(fams, "docket_breaker_transitions", upstream="openai", to=to_state) == moved
    assert sample(fams, "docket_breaker_transitions", upstream="openai", to="open") == 2
    closes = [e for e in events if e["type"] in ("model.response", "model.error")]
    by_outcome: dict[str, int] = {}
    for e in closes:
        key = "ok" if e["type"] == "model.response" else e["reason"]
        by_outcome[key] = by_outcome.get(key, 0) + 1
    assert by_outcome == {"upstream_status": 4, "ok": 2}
    for outcome, n in by_outcome.items():
        assert sample(fams, "docket_model_calls", provider="openai", outcome=outcome) == n
    latency_count = sample(
        fams, "docket_upstream_latency_seconds", "docket_upstream_latency_seconds_count",
        provider="openai",
    )  # fmt: skip
    assert latency_count == len(closes)
    assert sample(fams, "docket_ledger_events") == durable
    fsync_count = sample(fams, "docket_ledger_fsync_seconds", "docket_ledger_fsync_seconds_count")
    assert fsync_count == fsyncs > 0


async def test_a_clock_step_neither_shortens_nor_lengthens_a_cooldown(
    upstream_server, boundary_rig
):
    """The guards run on trio's monotonic clock, not the recorder's Clock: stepping the
    recorder's clock an hour forward mid-cooldown does not let a call through early,
    and stepping it two hours back does not hold the probe back."""
    up = Switchable()
    clock = FakeClock()
    cooldown = 0.3
    policy = {"resilience": {"breaker_threshold": 1, "breaker_cooldown_seconds": cooldown}}
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy, clock=clock) as rig,
            rig.client() as http,
        ):
            assert error_type(await http.post(CHAT, json=chat())) == "server_error"
            opened = up.arrivals[0]
            clock.advance(3600)
            early = await http.post(CHAT, json=chat())
            assert error_type(early) == "docket_breaker_open"
            assert trio.current_time() - opened < cooldown  # still inside the cooldown
            clock.advance(-7200)
            up.failing = False
            while error_type(r := await http.post(CHAT, json=chat())) == "docket_breaker_open":
                await trio.sleep(0.01)
            assert r.status_code == 200
    probe_at = up.arrivals[1]
    assert cooldown <= probe_at - opened < cooldown + 1.0
    events = rig.events()
    assert [e["to"] for e in events if e["type"] == "breaker.state"] == [
        "open",
        "half_open",
        "closed",
    ]
    mono = [e["mono_ms"] for e in events]
    assert mono == sorted(mono)  # the recorder's own clock was clamped too


# ---------------------------------------------------------------- the rate limiter


def agent_env(rig, mode: str, calls: int, **extra: str) -> dict:
    return {
        "OPENAI_BASE_URL": f"{rig.url}/openai/v1",
        "OPENAI_API_KEY": TOKEN,
        "DOCKET_BOUNDARY_URL": rig.url,
        "DOCKET_AGENT_MODE": mode,
        "DOCKET_AGENT_CALLS": str(calls),
        "DOCKET_AGENT_SEED": "7",
        "DOCKET_AGENT_TIMEOUT": "10",
        **extra,
    }


def bucket_respected(arrivals_ms: list[float], rate: float, slack_s: float) -> bool:
    """No stretch of arrivals holds more calls than a bucket of max(rate, 1) tokens
    refilled at `rate` could admit: j - i + 1 <= burst + rate * (t_j - t_i), with a
    little slack for the hop from the boundary to the upstream."""
    burst = max(rate, 1)
    t = sorted(a / 1000 for a in arrivals_ms)
    return all(
        j - i + 1 <= burst + rate * (t[j] - t[i] + slack_s)
        for i in range(len(t))
        for j in range(i, len(t))
    )


async def test_a_backoff_agent_never_exceeds_the_limit_at_the_upstream(
    stub_server, boundary_rig, monkeypatch
):
    import io

    # The limiter's own admissions, at the clock reading each was decided on: a loaded
    # machine may delay a model.request's stamp after its admission, never the decision.
    decided: list[tuple[float, object]] = []
    asked = Hold.limiter

    def limiter(hold: Hold) -> object:
        decision = asked(hold)
        decided.append((hold.now, decision))
        return decision

    monkeypatch.setattr(Hold, "limiter", limiter)
    rate = 5
    policy = {"resilience": {"max_calls_per_second": rate}}
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, policy) as rig,
        ):
            config = config_from(
                agent_env(
                    rig,
                    "backoff",
                    12,
                    DOCKET_AGENT_BACKOFF_BASE="0.05",
                    DOCKET_AGENT_BACKOFF_CAP="0.5",
                    DOCKET_AGENT_MAX_ATTEMPTS="10",
                )
            )
            summary = await run_agent(config, err=io.StringIO())
            arrivals = [entry["mono_ms"] for entry in up.log]
            async with rig.client() as http:
                scraped = (await http.get("/docket/metrics")).text
    events = rig.events()
    assert summary["ok"] == 12 and summary["gave_up"] == {}
    assert len(arrivals) == 12 == len([e for e in events if e["type"] == "model.request"])
    # At the upstream, calls can come closer together than the boundary let them go
    # by how much the hop from one to the other varied (each clock has its own zero,
    # so the spread of the differences is the hop's jitter): a busy machine's, not a rule's.
    sent = [e["mono_ms"] for e in events if e["type"] == "model.request"]
    hops = [got - went for got, went in zip(sorted(arrivals), sent, strict=True)]
    admitted = [now * 1000 for now, decision in decided if isinstance(decision, Admit)]
    assert len(admitted) == len(sent) == 12  # every forwarded call was admitted once
    assert bucket_respected(admitted, rate, slack_s=0)  # the boundary's own admissions
    assert bucket_respected(arrivals, rate, slack_s=0.05 + (max(hops) - min(hops)) / 1000)
    limited = [e for e in events if e["type"] == "x-docket.rate-limited"]
    assert len(limited) == summary["refused"].get("429", 0) == summary["retries"] >= 1
    for e in limited:
        assert e["rule"] == "resilience.max_calls_per_second" == f"resilience.{e['limit']}"
        assert e["error_type"] == "docket_rate_limited" and 0 < e["retry_after_s"] <= 1 / rate
        assert e["tokens"] < 1 and e["per_second"] == rate
    # A refused attempt is still the client's attempt: its marker is on the refusal
    # (docs/clients.md), numbered as the agent's own retries are.
    requests = [e for e in events if e["type"] == "model.request"]
    assert all(type(e.get("client_attempt")) is int for e in limited + requests)
    assert sum(e["client_attempt"] >= 1 for e in limited + requests) == summary["retries"]
    backoffs = [e for e in events if e["type"] == "agent.backoff"]
    assert len(backoffs) == len(limited)
    assert all(b["retry_after"] == 1.0 and b["wait_s"] >= 1.0 for b in backoffs)  # whole s, up
    assert sample(families(scraped), "docket_rate_limited") == len(limited)


async def test_a_hammering_agent_is_refused_and_every_refusal_recorded(stub_server, boundary_rig):
    import io

    rate = 5
    policy = {"resilience": {"max_calls_per_second": rate, "max_calls_per_minute": 8}}
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, policy) as rig,
        ):
            config = config_from(agent_env(rig, "hammer", 30, DOCKET_AGENT_CONCURRENCY="4"))
            summary = await run_agent(config, err=io.StringIO())
            arrivals = len(up.log)
            async with rig.client() as http:
                scraped = (await http.get("/docket/metrics")).text
    events = rig.events()
    limited = [e for e in events if e["type"] == "x-docket.rate-limited"]
    assert summary["calls"] == 30 and summary["refused"] == {"429": len(limited)}
    assert summary["ok"] == arrivals == len([e for e in events if e["type"] == "model.request"])
    assert 0 < arrivals <= 8  # the per-minute window holds, whatever the bucket allows
    assert {e["limit"] for e in limited} <= {"max_calls_per_second", "max_calls_per_minute"}
    assert sample(families(scraped), "docket_rate_limited") == len(limited) == 30 - arrivals


# ---------------------------------------------------------------- the bulkhead


async def raw_post(url: str, path: str, body: bytes) -> tuple[int, bytes, float]:
    """One call on a fresh connection, as bare as a client can be (so that 200 of
    them at once measure the boundary, not the client): (status, body, seconds)."""
    host, port = url.removeprefix("http://").split(":")
    started = trio.current_time()
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\nauthorization: Bearer {TOKEN}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        await stream.send_all(head.encode() + body)
        received = bytearray()
        while chunk := await stream.receive_some(65536):
            received += chunk
    took = trio.current_time() - started
    status = int(received[9:12])
    return status, bytes(received.partition(b"\r\n\r\n")[2]), took


async def test_two_hundred_callers_against_a_bulkhead_of_four(upstream_server, boundary_rig):
    """Four calls in flight at most, eight waiting at most; everyone else is shed at
    once (sooner than one upstream call takes), and every shed is recorded."""
    latency = 0.5
    up = Slow(latency)
    policy = {"resilience": {"max_concurrent_upstream": 4, "max_queue": 8}}
    results: list[tuple[int, str | None, float]] = []
    body = json.dumps(chat()).encode()
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
        ):
            assert rig.boundary.routes["openai"].pool.max_connections == 4  # one limit

            async def caller() -> None:
                status, answer, took = await raw_post(rig.url, CHAT, body)
                kind = json.loads(answer)["error"]["type"] if status != 200 else None
                results.append((status, kind, took))

            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(caller)
            async with rig.client() as http:
                scraped = (await http.get("/docket/metrics")).text
    events = rig.events()
    ok = [r for r in results if r[0] == 200]
    shed = [r for r in results if r[1] == "docket_load_shed"]
    assert len(ok) + len(shed) == 200 and all(r[0] == 503 for r in shed)
    assert up.peak <= 4 and up.arrivals == len(ok) >= 12
    shed_events = [e for e in events if e["type"] == "load.shed"]
    assert len(shed_events) == len(shed) >= 150
    for e in shed_events:
        assert (e["reason"], e["rule"], e["queue"], e["in_flight"]) == (
            "queue_full",
            "resilience.max_queue",
            8,
            4,
        )
    # Shed at once: each was refused because the queue was full (above), never queued, so
    # sheds come back sooner than the calls let in, every one of which waited for the
    # upstream. (Medians: 200 connections at once on two shared cores take a while.)
    shed_times = sorted(r[2] for r in shed)
    ok_times = sorted(r[2] for r in ok)
    assert min(ok_times) >= latency
    assert shed_times[len(shed_times) // 2] < ok_times[len(ok_times) // 2]
    fams = families(scraped)
    assert sample(fams, "docket_load_shed", upstream="openai") == len(shed_events)
    assert sample(fams, "docket_bulkhead_in_flight", upstream="openai") == 0
    assert sample(fams, "docket_bulkhead_queued", upstream="openai") == 0


# ---------------------------------------------------------------- deadlines


async def test_a_spent_budget_is_refused_without_forwarding(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as up, boundary_rig({"openai": up}) as rig:
            async with rig.client() as http:
                spent = await http.post(CHAT, json=chat(), headers={"x-docket-deadline-ms": "0"})
                bad = await http.post(CHAT, json=chat(), headers={"x-docket-deadline-ms": "soon"})
                fine = await http.post(CHAT, json=chat(), headers={"x-docket-deadline-ms": "10000"})
            upstream_saw = up.log
    assert spent.status_code == 504 and error_type(spent) == "docket_upstream_timeout"
    assert bad.status_code == 400 and "x-docket-deadline-ms" in bad.json()["error"]["message"]
    assert fine.status_code == 200
    events = rig.events()
    denied = [e for e in events if e["type"] == "policy.denied"]
    assert [(e["rule"], e["error_type"]) for e in denied] == [
        ("deadline", "docket_upstream_timeout"),
        ("bad_request", "docket_bad_request"),
    ]
    assert denied[0]["deadline_ms"] == 0 and denied[0]["remaining_ms"] <= 0
    assert len(upstream_saw) == 1 == len([e for e in events if e["type"] == "model.request"])
    # The deadline is the boundary's business: it never reaches the provider.
    assert all(name != "x-docket-deadline-ms" for name, _ in upstream_saw[0]["headers"])


async def test_a_slow_upstream_is_cut_at_the_callers_deadline(upstream_server, boundary_rig):
    up = Hanging()
    policy = {
        "boundary": {"upstream_timeout": 10},
        "resilience": {"breaker_threshold": 1, "breaker_cooldown_seconds": 30},
    }
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
            rig.client() as http,
        ):
            started = trio.current_time()
            r = await http.post(CHAT, json=chat(), headers={"x-docket-deadline-ms": "300"})
            took = trio.current_time() - started
            await up.gone.wait()  # the boundary closed the upstream connection
            after = await http.post(CHAT, json=chat())
    assert r.status_code == 504 and error_type(r) == "docket_upstream_timeout"
    assert 0.3 - CLOSE_RESERVE_S <= took < 0.3 + 1.0  # cut at the deadline, not at 10 s
    assert error_type(after) == "docket_breaker_open"  # the timeout counted
    assert len(up.headers) == 1
    assert all(name.lower() != b"x-docket-deadline-ms" for name, _ in up.headers[0])
    events = rig.events()
    (error,) = [e for e in events if e["type"] == "model.error"]
    assert error["reason"] == "timeout" and error["deadline_ms"] == 300
    types = [e["type"] for e in events]
    assert types.index("model.error") < types.index("breaker.state")
    (change,) = [e for e in events if e["type"] == "breaker.state"]
    assert (change["to"], change["reason"]) == ("open", "consecutive_failures")


async def test_a_queued_caller_is_shed_when_its_deadline_cannot_be_met(
    upstream_server, boundary_rig
):
    """One slot. A caller queued behind a slow call is shed when its deadline passes in
    the queue; once a call's duration is known, a caller whose deadline is shorter
    than the expected wait is shed at once, without queueing."""
    latency = 0.6
    up = Slow(latency)
    policy = {"resilience": {"max_concurrent_upstream": 1, "max_queue": 4}}
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
            rig.client() as http,
        ):

            async def slow_call(results: list) -> None:
                results.append(await http.post(CHAT, json=chat()))

            first: list[httpx.Response] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow_call, first)
                while up.in_flight == 0:
                    await trio.sleep(0.005)  # until the first call holds the slot
                started = trio.current_time()
                queued = await http.post(CHAT, json=chat(), headers={"x-docket-deadline-ms": "150"})
                queued_took = trio.current_time() - started
            second: list[httpx.Response] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow_call, second)
                while up.in_flight == 0:
                    await trio.sleep(0.005)
                started = trio.current_time()
                hopeless = await http.post(
                    CHAT, json=chat(), headers={"x-docket-deadline-ms": "100"}
                )
                hopeless_took = trio.current_time() - started
    assert first[0].status_code == second[0].status_code == 200 and up.arrivals == 2
    assert error_type(queued) == error_type(hopeless) == "docket_load_shed"
    assert 0.15 - CLOSE_RESERVE_S <= queued_took < latency  # waited for its deadline, no more
    assert hopeless_took < latency / 2  # not queued (the event below says so exactly)
    in_queue, at_once = [e for e in rig.events() if e["type"] == "load.shed"]
    assert (in_queue["reason"], in_queue["rule"], in_queue["expected_wait_s"]) == (
        "deadline",
        "deadline",
        None,
    )
    assert in_queue["waited_s"] >= 0.15 - CLOSE_RESERVE_S
    assert (at_once["reason"], at_once["queue"]) == ("deadline", 0) and "waited_s" not in at_once
    assert at_once["expected_wait_s"] >= latency  # the first call's duration, learnt


class Stalling:
    """An upstream that streams one SSE event, then stalls until the connection closes."""

    def __init__(self) -> None:
        self.gone = trio.Event()

    async def __call__(self, request, respond) -> None:
        await request.read_body()
        await respond.start(200, [(b"content-type", b"text/event-stream")])
        chunk = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
        }
        await respond.send(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        with trio.move_on_after(30):
            await respond.wait_disconnected()
            self.gone.set()


async def test_a_stream_past_the_callers_deadline_is_cut_and_recorded(
    upstream_server, boundary_rig
):
    up = Stalling()
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}) as rig,
            rig.client() as http,
        ):
            started = trio.current_time()
            with pytest.raises(httpx.RemoteProtocolError):  # cut, not ended cleanly
                async with http.stream(
                    "POST",
                    CHAT,
                    json=chat(stream=True),
                    headers={"x-docket-deadline-ms": "300"},
                ) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_bytes():
                        pass
            took = trio.current_time() - started
            await up.gone.wait()
    assert 0.3 - CLOSE_RESERVE_S <= took < 0.3 + 1.0
    (error,) = rig.events("model.error")
    assert (error["reason"], error["status"], error["deadline_ms"]) == ("timeout", 200, 300)
    assert error["cost_nusd"] > 0  # output may have been billed: charged its reservation


class Trickling:
    """An upstream that streams an SSE comment every `every` seconds, never ending: each
    gap is under the read timeout, so only a total bound ends it."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.sent = 0

    async def __call__(self, request, respond) -> None:
        await request.read_body()
        await respond.start(200, [(b"content-type", b"text/event-stream")])
        with trio.move_on_after(30):  # ended sooner by the boundary closing the connection
            while True:
                await respond.send(b": still here\n\n")
                self.sent += 1
                await trio.sleep(self.every)


async def test_a_stream_that_trickles_forever_is_cut_at_the_total_timeout(
    upstream_server, boundary_rig
):
    """A byte every 0.2 s never trips a 1 s read timeout; upstream_total_timeout (1.5 s
    here, 600 s by default) ends the call, recorded as a timeout and charged."""
    up = Trickling(every=0.2)
    policy = {"boundary": {"upstream_timeout": 1, "upstream_total_timeout": 1.5}}
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
            rig.client() as http,
        ):
            started = trio.current_time()
            with pytest.raises(httpx.RemoteProtocolError):  # cut, not ended cleanly
                async with http.stream("POST", CHAT, json=chat(stream=True)) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_bytes():
                        pass
            took = trio.current_time() - started
    assert 1.5 <= took < 1.5 + 2.0
    assert up.sent >= 3  # it was trickling, not stalled: the read timeout never fired
    (error,) = rig.events("model.error")
    assert (error["reason"], error["status"], error["total_timeout_s"]) == ("timeout", 200, 1.5)
    assert "upstream_total_timeout (1.5 s)" in error["detail"]
    assert "deadline_ms" not in error
    assert error["cost_nusd"] > 0  # output may have been billed: charged its reservation


async def test_a_callers_deadline_sooner_than_the_total_timeout_wins(upstream_server, boundary_rig):
    up = Trickling(every=0.1)
    policy = {"boundary": {"upstream_total_timeout": 5}}
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
            rig.client() as http,
        ):
            with pytest.raises(httpx.RemoteProtocolError):
                async with http.stream(
                    "POST", CHAT, json=chat(stream=True), headers={"x-docket-deadline-ms": "400"}
                ) as r:
                    async for _ in r.aiter_bytes():
                        pass
    (error,) = rig.events("model.error")
    assert (error["reason"], error["deadline_ms"]) == ("timeout", 400)
    assert "total_timeout_s" not in error


class ProbeHangs:
    """Fails the first call; hangs the second (the probe) until its caller leaves;
    answers every later call."""

    def __init__(self) -> None:
        self.calls = 0
        self.probe_left = trio.Event()

    async def __call__(self, request, respond) -> None:
        await request.read_body()
        self.calls += 1
        if self.calls == 1:
            await respond.simple(503, JSON, SAD)
        elif self.calls == 2:
            with trio.move_on_after(30):
                await respond.wait_disconnected()
                self.probe_left.set()
        else:
            await respond.simple(200, JSON, openai_reply())


async def test_a_probe_whose_caller_leaves_frees_the_probe_slot(upstream_server, boundary_rig):
    """A cancelled call abandons its ticket: the breaker does not wedge half-open
    waiting for a probe that will never report; the next call probes."""
    up = ProbeHangs()
    policy = {"resilience": {"breaker_threshold": 1, "breaker_cooldown_seconds": 0.1}}
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
            rig.client() as http,
        ):
            assert error_type(await http.post(CHAT, json=chat())) == "server_error"
            while True:
                try:
                    r = await http.post(CHAT, json=chat(), timeout=0.5)
                except httpx.ReadTimeout:
                    break  # the probe went, and its caller gave up on it
                assert error_type(r) == "docket_breaker_open"
                await trio.sleep(0.01)
            await up.probe_left.wait()
            while not rig.events("model.error")[1:]:  # the probe's closing event
                await trio.sleep(0.01)
            # The line is in the file once written, a little before it is durable and
            # the boundary (after the fdatasync) hands the probe's ticket back.
            breaker = rig.boundary.guards.breakers["openai"]
            while breaker.status(trio.current_time()).probe_in_flight:
                await trio.sleep(0.01)
            after = await http.post(CHAT, json=chat())
    assert after.status_code == 200  # probed again and closed, not refused as half-open
    reasons = [e["reason"] for e in rig.events("model.error")]
    assert reasons == ["upstream_status", "client_abort"]
    assert [(e["from"], e["to"]) for e in rig.events("breaker.state")] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


async def test_slow_answers_open_the_breaker_on_the_slow_call_rate(upstream_server, boundary_rig):
    """Every answer is a 200, but each takes longer than breaker_slow_call_ms: once the
    window holds min_calls of them the breaker opens with reason slow_call_rate, and
    the next call is refused without reaching the upstream."""
    up = Slow(0.08)
    policy = {
        "resilience": {
            "breaker_slow_call_ms": 40,
            "breaker_slow_call_rate": 1.0,
            "breaker_min_calls": 2,
            "breaker_cooldown_seconds": 30,
            "breaker_max_cooldown_seconds": 30,
        }
    }
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
            rig.client() as http,
        ):
            for _ in range(2):
                assert (await http.post(CHAT, json=chat())).status_code == 200
            refused = await http.post(CHAT, json=chat())
    assert error_type(refused) == "docket_breaker_open" and up.arrivals == 2
    (opened,) = rig.events("breaker.state")
    assert (opened["to"], opened["reason"]) == ("open", "slow_call_rate")
    assert (opened["window_calls"], opened["window_slow"], opened["window_failures"]) == (2, 2, 0)


class Gated:
    """An upstream that holds every call until `release` is set, counting arrivals."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.arrivals = 0

    async def __call__(self, request, respond) -> None:
        await request.read_body()
        self.arrivals += 1
        await self.release.wait()
        await respond.simple(200, JSON, openai_reply())


async def test_a_full_bulkhead_sheds_the_retry_and_health_never_queues(
    upstream_server, boundary_rig
):
    """One slot, a queue of one. A client's retry (x-stainless-retry-count: 1) waits in
    the queue; a first attempt arriving at the full queue takes its place, and the retry
    is answered 503 load-shed (reason retry_displaced); a second retry is shed at once.
    Meanwhile /docket/healthz and /docket/readyz answer without waiting for a slot."""
    up = Gated()
    policy = {"resilience": {"max_concurrent_upstream": 1, "max_queue": 1}}
    retry = {"x-stainless-retry-count": "1"}
    answers: dict[str, httpx.Response] = {}
    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(up, "openai") as server,
            boundary_rig({"openai": server}, policy) as rig,
            rig.client() as http,
        ):
            core = rig.boundary.guards.bulkheads["openai"].core

            async def post(name: str, headers: dict) -> None:
                answers[name] = await http.post(CHAT, json=chat(), headers=headers)

            async def until(condition) -> None:
                while not condition():
                    await trio.sleep(0.005)  # polling a condition, bounded by fail_after

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "holder", {})
                await until(lambda: up.arrivals == 1)
                nursery.start_soon(post, "retry", retry)
                await until(lambda: core.status().queued == 1)
                health = await http.get("/docket/healthz")
                ready = await http.get("/docket/readyz")
                assert core.status().queued == 1 and not up.release.is_set()
                nursery.start_soon(post, "first", {})
                await until(lambda: "retry" in answers)
                await post("second retry", retry)
                up.release.set()
    assert health.status_code == 200 and ready.status_code == 200
    assert answers["holder"].status_code == answers["first"].status_code == 200
    assert error_type(answers["retry"]) == error_type(answers["second retry"]) == "docket_load_shed"
    assert up.arrivals == 2
    sheds = [(e["reason"], e["rule"]) for e in rig.events("load.shed")]
    assert sheds == [
        ("retry_displaced", "resilience.max_queue"),
        ("queue_full", "resilience.max_queue"),
    ]
    assert rig.events("load.shed")[0]["waited_s"] >= 0
    forwarded = [e.get("client_attempt") for e in rig.events("model.request")]
    assert forwarded == [None, None]  # only the first attempts reached the upstream
