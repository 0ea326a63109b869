"""The cache key covers what shapes the answer: per provider, the
request headers the provider reads to choose or shape its answer (docs/cache.md), and
for a store shared between runs, which provider key bought the answer (a keyed digest
of it in the store's identity, never the key). Over real sockets (the boundary rig and
a chaos stub), read back from the ledger on disk and the store file."""

from __future__ import annotations

import json

import pytest
import trio
from conftest import KEY_ENV, REAL_KEY
from hypothesis import given
from hypothesis import strategies as st

from docket.cache.decide import SHAPING_HEADERS, shaping_headers
from docket.cache.shared import StoreProblem, credential_digest
from docket.cache.store import Entry, Key
from docket.policy import load_policy
from docket.run.supervisor import shared_cache

DEADLINE = 20
ON = {"cache": {"enabled": True}}
PATHS = {"openai": "/openai/v1/chat/completions", "anthropic": "/anthropic/v1/messages"}


def body(kind: str) -> bytes:
    doc = {"model": "m-1", "temperature": 0, "max_tokens": 5}
    doc["messages"] = [{"role": "user", "content": "the same question"}]
    return json.dumps(doc).encode()


CASES = [
    ("anthropic", "anthropic-version", "2023-06-01", "2023-01-01"),
    ("anthropic", "anthropic-beta", "", "output-128k-2025-02-19"),
    ("openai", "OpenAI-Organization", "", "org-other"),
    ("openai", "OpenAI-Project", "proj_a", "proj_b"),
    ("openai", "OpenAI-Beta", "", "assistants=v2"),
    ("openai", "X-Tenant-Id", "tenant-a", "tenant-b"),
]


@pytest.mark.parametrize(("kind", "name", "first", "second"), CASES)
async def test_a_header_that_shapes_the_answer_is_part_of_the_key(
    stub_server, boundary_rig, kind, name, first, second
):
    """The same body under another value of the header is forwarded (a miss), not served
    the first answer; the same value again is a hit. Failed before: served."""

    def headers(value: str) -> dict:
        return {name: value} if value else {}

    with trio.fail_after(DEADLINE):
        async with (
            stub_server(kind, reply_tokens=5) as up,
            boundary_rig({kind: up}, policy=ON) as rig,
            rig.client() as http,
        ):
            for value in (first, second, second):
                answer = await http.post(PATHS[kind], content=body(kind), headers=headers(value))
                assert answer.status_code == 200, answer.text
            calls = len(up.log)
    assert calls == 2  # the first value, the second value; the repeat was served
    (hit,) = rig.events("cache.hit")
    stored = [e for e in rig.events("model.response") if e.get("cache_stored")]
    assert len(stored) == 2 and hit["replays_seq"] == stored[1]["seq"]


def test_headers_that_do_not_shape_the_answer_are_not_part_of_the_key():
    a = shaping_headers("openai", [(b"user-agent", b"a"), (b"x-stainless-retry-count", b"0")])
    b = shaping_headers("openai", [(b"user-agent", b"b"), (b"idempotency-key", b"k")])
    assert a == b == ""
    assert shaping_headers("openai", [(b"OpenAI-Project", b"p ")]) == shaping_headers(
        "openai", [(b"openai-project", b"p")]
    )  # names are case-insensitive; surrounding blanks are not the value


@given(
    kind=st.sampled_from(sorted(SHAPING_HEADERS)),
    values=st.lists(st.binary(min_size=1, max_size=8), min_size=2, max_size=2, unique=True),
)
def test_two_values_of_a_shaping_header_never_share_a_key(kind, values):
    name = sorted(SHAPING_HEADERS[kind])[0]
    a, b = (shaping_headers(kind, [(name, v)]) for v in values)
    if values[0].strip() != values[1].strip():
        assert a != b and len(a) == 64


def write_policy(path, url: str = "http://127.0.0.1:9/v1") -> None:
    path.write_text(
        f'[providers.openai]\nkind = "openai"\nbase_url = "{url}"\nkey_env = "{KEY_ENV}"\n'
        '[cache]\nenabled = true\nscope = "team"\ndir = "store"\n'
    )


def test_a_shared_store_answers_only_runs_holding_the_key_that_bought_it(tmp_path, monkeypatch):
    """Stored with key A, read by a policy whose provider key is B: refused, one line
    naming the keys among what differs. The file never holds the key, nor its plain
    digest. Failed before: key B's run was served key A's answers."""
    policy = tmp_path / "docket.toml"
    write_policy(policy)
    monkeypatch.setenv(KEY_ENV, REAL_KEY)
    store = shared_cache(load_policy(policy))
    assert store is not None
    entry = Entry(
        Key("openai", "/v1/chat/completions", "ab" * 32),
        200,
        ((b"content-type", b"application/json"),),
        b'{"choices": []}',
        False,
        3,
        1e9,
        10,
        "m-1",
        "20261201T000000Z-00000000",
    )
    assert store.put(entry, 1e9 + 1)
    assert store.check() == 1  # the same key: read back
    text = store.path.read_text()
    assert REAL_KEY not in text and credential_digest(REAL_KEY) not in text
    monkeypatch.setenv(KEY_ENV, "sk-another-account-key-0000000000")
    other = shared_cache(load_policy(policy))
    assert other is not None
    with pytest.raises(StoreProblem, match="provider keys"):
        other.check()
