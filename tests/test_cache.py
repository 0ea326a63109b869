"""The response cache (docket/cache/, docket/boundary/cache.py, docs/cache.md).

Pure: the store's bounds and exact-key hits under hypothesis; the decisions, one
test per reason an answer is not stored. Through a real boundary on 127.0.0.1
over a chaos stub: hits replace forwarding (cache.hit, nothing upstream, zero
spend), a stream is replayed as a stream the openai SDK reads, every refusal to
store is named in the closing event on disk, and a run without [cache] writes
exactly the fields it wrote before.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio
from conftest import TOKEN
from helpers import LazyModule
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.stub.server import Behaviour, steady
from docket.cache import decide
from docket.cache.config import CachePolicy
from docket.cache.decide import Answer, Keep, Refuse, request_refusal, storable
from docket.cache.store import ENTRY_OVERHEAD, Entry, Key, Store
from docket.policy import PolicyError, policy_from_dict

openai = LazyModule("openai")

DEADLINE = 20
CHAT = "/openai/v1/chat/completions"
ON = {"cache": {"enabled": True}}


def entry(key: Key, size: int = 0, *, at: float = 0.0, seq: int = 1) -> Entry:
    return Entry(key, 200, (), b"x" * size, False, seq, at, 10)


def key(i: int, provider: str = "openai", path: str = "/v1/chat/completions") -> Key:
    return Key(provider, path, f"{i:064x}")


# ---------------------------------------------------------------- the store, pure

ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "get"]),
        st.integers(0, 6),  # which digest (few: the same digest under another key is common)
        st.sampled_from(["openai", "other"]),  # which provider
        st.sampled_from(["/v1/chat/completions", "/v1/responses"]),  # which path
        st.integers(0, 3000),  # body size
        st.floats(0, 5, allow_nan=False),  # clock step
    ),
    max_size=120,
)


@settings(deadline=None)
@given(ops, st.integers(1, 8), st.integers(300, 8000), st.integers(1, 4))
def test_store_bounds_hold_and_hits_are_exact_and_fresh(script, entries, max_bytes, max_hits):
    store = Store(max_entries=entries, max_bytes=max_bytes, ttl=3.0, max_hits=max_hits)
    now = 0.0
    served: dict[Key, int] = {}
    put_at: dict[Key, tuple[int, float]] = {}  # what was last stored under each key, when
    for op, i, provider, path, size, step in script:
        now += step
        k = key(i, provider, path)
        if op == "put":
            e = entry(k, size, at=now, seq=i)
            stored = store.put(e, now)
            assert stored == (e.size <= max_bytes)
            if stored:
                served[k] = 0
                put_at[k] = (len(e.body), now)
        else:
            hit = store.lookup(k, now)
            if hit is not None:
                assert hit.entry.key == k  # exact key: provider, path and digest
                assert (len(hit.entry.body), hit.entry.stored_at) == put_at[k]  # its own answer
                assert 0 <= hit.age_s < 3.0  # never an expired entry
                served[k] = served.get(k, 0) + 1
                assert served[k] <= max_hits
        assert len(store) <= entries
        assert store.bytes <= max_bytes
        assert store.bytes == sum(e.size for e in store._entries.values())


def test_a_hit_needs_the_same_provider_path_and_digest():
    store = Store(max_entries=10, max_bytes=10_000, ttl=60, max_hits=10)
    store.put(entry(key(1)), 0.0)
    assert store.lookup(key(1, provider="other"), 1.0) is None
    assert store.lookup(key(1, path="/v1/responses"), 1.0) is None
    assert store.lookup(key(2), 1.0) is None
    assert store.lookup(key(1), 1.0) is not None


def test_expired_and_clock_stepped_back_are_never_served():
    store = Store(max_entries=10, max_bytes=10_000, ttl=5, max_hits=10)
    store.put(entry(key(1), at=10.0), 10.0)
    assert store.lookup(key(1), 9.0) is None  # a reading before the store: age unknown
    store.put(entry(key(1), at=10.0), 10.0)
    assert store.lookup(key(1), 14.9) is not None
    assert store.lookup(key(1), 15.0) is None
    assert len(store) == 0 and store.bytes == 0


def test_max_hits_is_a_brake_per_entry():
    store = Store(max_entries=10, max_bytes=10_000, ttl=60, max_hits=3)
    store.put(entry(key(1)), 0.0)
    hits = [store.lookup(key(1), 1.0) for _ in range(4)]
    assert [h.hits if h else None for h in hits] == [1, 2, 3, None]


def test_an_entry_larger_than_max_bytes_is_not_stored_and_evicts_nothing():
    store = Store(max_entries=10, max_bytes=1000, ttl=60, max_hits=3)
    store.put(entry(key(1), 100), 0.0)
    assert not store.put(entry(key(2), 1000 - ENTRY_OVERHEAD + 1), 0.0)
    assert store.lookup(key(1), 0.0) is not None


# ---------------------------------------------------------------- decisions, one per reason

POLICY = CachePolicy(enabled=True)
GOOD = Answer(status=200, complete=True, usage_missing=False, faulted=False, size=500)


def greedy(**extra) -> dict:
    return {"model": "m", "temperature": 0, "messages": [], **extra}


def why(endpoint="chat.completions", model="m", choices=1, payload=None, policy=POLICY):
    return request_refusal(
        endpoint, model, choices, greedy() if payload is None else payload, policy
    )


def test_a_greedy_plain_request_is_servable():
    assert why() is None
    assert storable(why(), GOOD, 1000) == Keep()


def test_refused_endpoint():
    assert why(endpoint="other") == "endpoint"
    assert why(endpoint="embeddings", payload={"model": "m"}) is None  # no sampling


def test_refused_model_not_listed():
    assert why(policy=CachePolicy(enabled=True, models=("n",))) == "model_not_listed"


def test_refused_temperature_absent_or_above_zero():
    assert why(payload={"model": "m"}) == "temperature"  # the default is 1
    assert why(payload=greedy(temperature=0.2)) == "temperature"
    assert why(payload=greedy(temperature=True)) == "temperature"  # not a number


def test_refused_n():
    assert why(choices=2) == "n"


def test_refused_tools():
    assert why(payload=greedy(tools=[{"type": "function"}])) == "tools"
    assert why(payload=greedy(tools=[])) is None


def test_serve_anyway_per_model():
    allowed = CachePolicy(enabled=True, serve_anyway={"m": ("temperature", "n", "tools")})
    risky = {"model": "m", "n": 2, "tools": [{}]}
    assert why(choices=2, payload=risky, policy=allowed) is None
    assert why(model="other", choices=2, payload=risky, policy=allowed) == "temperature"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"status": 500}, "not_2xx"),
        ({"status": None}, "not_2xx"),
        ({"complete": False}, "incomplete"),
        ({"usage_missing": True}, "usage_missing"),
        ({"faulted": True}, "fault_injected"),
        ({"size": 1001}, "too_large"),
    ],
)
def test_refused_answer(change, reason):
    assert storable(None, _with(GOOD, **change), 1000) == Refuse(reason)


def _with(answer: Answer, **change) -> Answer:
    fields = {n: getattr(answer, n) for n in answer.__slots__}
    return Answer(**{**fields, **change})


@given(
    st.one_of(st.none(), st.sampled_from(decide.REQUEST_REASONS)),
    st.one_of(st.none(), st.integers(100, 599)),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2000),
)
def test_stored_only_when_every_condition_holds(reason, status, complete, missing, faulted, size):
    answer = Answer(status, complete, missing, faulted, size)
    decision = storable(reason, answer, 1000)
    # Only a 200 is stored (an entry's status is the one thing a replay must
    # not vary; 201/204 and friends are forwarded every time)
    whole = status == 200 and complete
    good = reason is None and whole and not missing and not faulted and size <= 1000
    assert (decision == Keep()) == good
    if not good:
        assert isinstance(decision, Refuse) and decision.reason in decide.REASONS


def test_every_reason_is_tested_here():
    # store_unreadable (a shared store spoiled mid-run) is tested in test_cache_shared.py
    here = Path(__file__).parent
    source = "".join(
        (here / name).read_text(encoding="utf-8")
        for name in ("test_cache.py", "test_cache_shared.py")
    )
    assert all(f'"{reason}"' in source for reason in decide.REASONS)


def test_policy_table():
    p = policy_from_dict({"cache": {"enabled": True, "ttl": "2m", "max_bytes": "1MiB"}})
    assert (p.cache.ttl, p.cache.max_bytes, p.cache.scope) == (120.0, 1 << 20, "run")
    assert p.digest() != policy_from_dict({}).digest()
    assert policy_from_dict({"cache": {"enabled": False}}).digest() == policy_from_dict({}).digest()
    for bad, says in [
        ({"scope": "shared.db"}, 'cache.scope: must be "run" or a store\'s name'),
        ({"models": []}, "cache.models"),
        ({"serve_anyway": {"m": ["temperatur"]}}, "cache.serve_anyway.m"),
        ({"max_hits": 0}, "cache.max_hits"),
        ({"ttl": -1}, "cache.ttl"),
        ({"enable": True}, "did you mean enabled"),
    ]:
        with pytest.raises(PolicyError, match=says.replace("(", r"\(")):
            policy_from_dict({"cache": bad})


# ---------------------------------------------------------------- through a real boundary


def chat(content: str = "loop", **extra) -> bytes:
    body = {"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 5}
    body["messages"] = [{"role": "user", "content": content}]
    return json.dumps({**body, **extra}).encode()


async def post(rig, body: bytes):
    async with rig.client() as http:
        return await http.post(CHAT, content=body)


async def test_an_identical_call_is_answered_from_the_cache(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=5) as up,
            boundary_rig({"openai": up}, policy=ON) as rig,
        ):
            first = await post(rig, chat())
            second = await post(rig, chat())
            third = await post(rig, chat("another question"))
            assert third.status_code == 200
            forwarded = len(up.log)
    assert first.status_code == second.status_code == 200
    assert second.content == first.content
    assert second.headers["x-docket-cache"] == "hit"
    assert forwarded == 2  # the repeat never left
    events = rig.events()
    kinds = [e["type"] for e in events]
    assert kinds == [
        "model.request",
        "model.response",
        "cache.hit",
        "model.request",
        "model.response",
    ]
    response, hit = events[1], events[2]
    assert events[0]["cache"] == "miss" and response["cache_stored"] is True
    assert hit["replays_seq"] == response["seq"]
    assert hit["request_sha256"] == events[0]["request_sha256"]
    assert hit["saved_nusd"] == response["cost_nusd"] > 0
    assert hit["hits"] == 1 and hit["age_ms"] >= 0


async def test_a_hit_spends_nothing(stub_server, boundary_rig):
    """Three calls under a cap on model calls of two: the repeat is free, so the third
    distinct call still fits."""
    policy = {**ON, "caps": {"max_model_calls": 2}}
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=5) as up,
            boundary_rig({"openai": up}, policy=policy) as rig,
        ):
            statuses = [(await post(rig, chat(c))).status_code for c in ("a", "a", "a", "b")]
            over = await post(rig, chat("c"))
    assert statuses == [200, 200, 200, 200]
    assert over.status_code in (403, 429)
    assert len(rig.events("cache.hit")) == 2


async def test_a_stream_is_replayed_as_a_stream_the_sdk_reads(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=4) as up,
            boundary_rig({"openai": up}, policy=ON) as rig,
        ):
            client = openai.AsyncOpenAI(
                base_url=f"{rig.url}/openai/v1", api_key=TOKEN, max_retries=0
            )
            texts = []
            try:
                for _ in range(2):
                    stream = await client.chat.completions.create(
                        model="gpt-4o-mini",
                        messages=[{"role": "user", "content": "again"}],
                        temperature=0,
                        stream=True,
                        max_tokens=4,
                    )
                    chunks = [c async for c in stream]
                    texts.append(
                        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                    )
            finally:
                await client.close()
            forwarded = len(up.log)
    assert texts[0] and texts[1] == texts[0]
    assert forwarded == 1
    (hit,) = rig.events("cache.hit")
    assert hit["stream"] is True


@pytest.mark.parametrize(
    ("behaviour", "body", "reason"),
    [
        (Behaviour(), chat(temperature=0.7), "temperature"),
        (Behaviour(), chat(n=2), "n"),
        (Behaviour(), chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (Behaviour(error="status", status=500), chat(), "not_2xx"),
        (Behaviour(omit_usage=True), chat(), "usage_missing"),
        (Behaviour(cut_after_events=2), chat(stream=True), "incomplete"),
    ],
)
async def test_each_refusal_to_store_is_on_disk(stub_server, boundary_rig, behaviour, body, reason):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=5, choose=steady(behaviour)) as up,
            boundary_rig({"openai": up}, policy=ON) as rig,
        ):
            cuts = 0
            for _ in range(2):
                try:
                    await post(rig, body)
                except httpx.TransportError:  # a cut stream: the client sees the cut
                    cuts += 1
            forwarded = len(up.log)
    assert cuts == (2 if reason == "incomplete" else 0)  # no other call may break
    closes = [e for e in rig.events() if e["type"] in ("model.response", "model.error")]
    assert [e["cache_refused"] for e in closes] == [reason, reason]
    assert forwarded == 2 and rig.events("cache.hit") == []


async def test_an_answer_during_a_fault_is_not_stored(stub_server, boundary_rig):
    where: dict = {}

    def choose(arrival):
        where["rig"].boundary.note_fault()  # as the harness does, before the fault acts
        return Behaviour()

    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=5, choose=choose) as up,
            boundary_rig({"openai": up}, policy=ON) as rig,
        ):
            where["rig"] = rig
            await post(rig, chat())
            await post(rig, chat())
    assert [e["cache_refused"] for e in rig.events("model.response")] == ["fault_injected"] * 2


async def test_an_answer_over_max_bytes_is_not_stored(stub_server, boundary_rig):
    policy = {"cache": {"enabled": True, "max_bytes": 1024}}
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=400) as up,
            boundary_rig({"openai": up}, policy=policy) as rig,
        ):
            await post(rig, chat(max_tokens=400))
    assert [e["cache_refused"] for e in rig.events("model.response")] == ["too_large"]


async def test_without_cache_the_events_are_as_before(stub_server, boundary_rig):
    """The same calls with [cache] absent and with it disabled: the same event types and
    the same fields, none of them the cache's."""
    shapes = []
    for policy in (None, {"cache": {"enabled": False}}):
        with trio.fail_after(DEADLINE):
            async with (
                stub_server("openai", reply_tokens=5) as up,
                boundary_rig({"openai": up}, policy=policy) as rig,
            ):
                for body in (chat(), chat(), chat(stream=True)):
                    await post(rig, body)
        shapes.append([(e["type"], sorted(e)) for e in rig.events()])
    assert shapes[0] == shapes[1]
    assert [t for t, _ in shapes[0]] == ["model.request", "model.response"] * 3
    cache_fields = {"cache", "cache_stored", "cache_refused"}
    assert not any(cache_fields & set(fields) for _, fields in shapes[0])


async def test_a_hit_is_admitted_like_any_call_and_needs_the_same_path(stub_server, boundary_rig):
    """The cache is asked only after admission: a wrong token is refused, not served; the
    same bytes on another path (a query added) are a miss."""
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=5) as up,
            boundary_rig({"openai": up}, policy=ON) as rig,
        ):
            assert (await post(rig, chat())).status_code == 200
            async with rig.client(token="not-the-run-token") as http:
                stranger = await http.post(CHAT, content=chat())
            async with rig.client() as http:
                other_path = await http.post(CHAT + "?x=1", content=chat())
            forwarded = len(up.log)
    assert stranger.status_code == 401 and "x-docket-cache" not in stranger.headers
    assert other_path.status_code == 200 and "x-docket-cache" not in other_path.headers
    assert forwarded == 2
    assert rig.events("cache.hit") == []
    assert [e["rule"] for e in rig.events("policy.denied")] == ["auth"]


async def test_max_hits_then_forwarded_again(stub_server, boundary_rig):
    policy = {"cache": {"enabled": True, "max_hits": 2}}
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", reply_tokens=5) as up,
            boundary_rig({"openai": up}, policy=policy) as rig,
        ):
            for _ in range(5):
                assert (await post(rig, chat())).status_code == 200
            forwarded = len(up.log)
    # stored, hit, hit (the brake drops it), forwarded and stored again, hit
    assert [e["type"] for e in rig.events()] == [
        "model.request",
        "model.response",
        "cache.hit",
        "cache.hit",
        "model.request",
        "model.response",
        "cache.hit",
    ]
    assert forwarded == 2


async def test_metrics_count_hits_stored_and_reasons_only_with_the_cache(stub_server, boundary_rig):
    for policy in (ON, None):
        with trio.fail_after(DEADLINE):
            async with (
                stub_server("openai", reply_tokens=5) as up,
                boundary_rig({"openai": up}, policy=policy) as rig,
            ):
                for body in (chat(), chat(), chat(temperature=1)):
                    await post(rig, body)
                async with rig.client() as http:
                    text = (await http.get("/docket/metrics")).text
        if policy is None:
            assert "docket_cache" not in text
            continue
        saved = rig.events("cache.hit")[0]["saved_nusd"]
        assert 'docket_cache_calls_total{outcome="hit",provider="openai"} 1.0' in text
        assert 'docket_cache_calls_total{outcome="stored",provider="openai"} 1.0' in text
        assert 'docket_cache_calls_total{outcome="temperature",provider="openai"} 1.0' in text
        assert f"docket_cache_saved_usd_total {saved / 1e9}" in text
        assert "docket_cache_entries 1.0" in text
