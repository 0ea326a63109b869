"""Provider adapters: request facts, preparation, auth swap, usage, error shapes, stream facts.

Response fixtures follow the shapes in the providers' API references; each is
also validated against the provider SDK's own model so a drift shows here.
"""

from __future__ import annotations

import json

import httpx2
import pytest
from helpers import LazyModule
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.boundary.providers import (
    DOCKET_ERRORS,
    BadRequest,
    ProviderError,
    RequestFacts,
    Usage,
    by_kind,
    changed_paths,
    error_body,
    error_from_body,
    forwarded,
    prepare,
    refusal,
    request_facts,
    stream_tracker,
    swap_auth,
    token_matches,
    usage_from_body,
)

anthropic = LazyModule("anthropic")
openai = LazyModule("openai")
OPENAI, ANTHROPIC = by_kind("openai"), by_kind("anthropic")  # Docket's adapters, not the SDKs

CHAT_COMPLETION = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hello.",
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 1117,
        "completion_tokens": 46,
        "total_tokens": 1163,
        "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    },
    "service_tier": "default",
    "system_fingerprint": "fp_fc9f1d7035",
}

RESPONSE = {
    "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
    "object": "response",
    "created_at": 1741476542,
    "status": "completed",
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "max_output_tokens": None,
    "model": "gpt-4.1-2025-04-14",
    "output": [
        {
            "type": "message",
            "id": "msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "A unicorn.", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "usage": {
        "input_tokens": 36,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 87,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 123,
    },
    "user": None,
    "metadata": {},
}

EMBEDDINGS = {
    "object": "list",
    "data": [{"object": "embedding", "embedding": [0.0023064255, -0.009327292], "index": 0}],
    "model": "text-embedding-3-small",
    "usage": {"prompt_tokens": 8, "total_tokens": 8},
}

MESSAGE = {
    "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "Hi! My name is Claude."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 2095,
        "output_tokens": 503,
        "cache_creation_input_tokens": 2051,
        "cache_read_input_tokens": 100,
    },
}


def test_fixtures_are_what_the_sdks_accept():
    assert (
        openai.types.chat.ChatCompletion.model_validate(CHAT_COMPLETION).usage.prompt_tokens == 1117
    )
    assert openai.types.responses.Response.model_validate(RESPONSE).usage.output_tokens == 87
    assert openai.types.CreateEmbeddingResponse.model_validate(EMBEDDINGS).usage.prompt_tokens == 8
    assert anthropic.types.Message.model_validate(MESSAGE).usage.cache_read_input_tokens == 100


# --- request facts --------------------------------------------------------------

JSON_HEADERS = [(b"content-type", b"application/json")]


def facts(kind, path, payload, headers=JSON_HEADERS, **kw):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return request_facts(by_kind(kind), path, headers, body, **kw)


def test_chat_facts_prefer_max_completion_tokens():
    f = facts(
        "openai",
        "/v1/chat/completions",
        {
            "model": "gpt-4o",
            "messages": [],
            "stream": True,
            "max_tokens": 50,
            "max_completion_tokens": 70,
        },
    )
    assert (f.endpoint, f.model, f.stream, f.max_output_tokens) == (
        "chat.completions",
        "gpt-4o",
        True,
        70,
    )
    f = facts(
        "openai", "/v1/chat/completions", {"model": "gpt-4o", "messages": [], "max_tokens": 50}
    )
    assert (f.stream, f.max_output_tokens) == (False, 50)


def test_responses_embeddings_and_anthropic_facts():
    f = facts(
        "openai", "/v1/responses", {"model": "gpt-4.1", "input": "hi", "max_output_tokens": 300}
    )
    assert (f.endpoint, f.max_output_tokens, f.stream) == ("responses", 300, False)
    f = facts("openai", "/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"})
    assert (f.endpoint, f.max_output_tokens, f.stream) == ("embeddings", None, False)
    f = facts(
        "anthropic",
        "/v1/messages",
        {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": True, "messages": []},
    )
    assert (f.kind, f.endpoint, f.model, f.stream, f.max_output_tokens) == (
        "anthropic",
        "messages",
        "claude-sonnet-4-5",
        True,
        1024,
    )
    f = facts(
        "anthropic", "/v1/messages/count_tokens", {"model": "claude-sonnet-4-5", "messages": []}
    )
    assert (f.endpoint, f.max_output_tokens) == ("messages.count_tokens", None)


def test_every_choice_asked_for_counts_in_the_output_bound():
    f = facts(
        "openai", "/v1/chat/completions", {"model": "m", "n": 3, "max_completion_tokens": 100}
    )
    assert (f.choices, f.max_output_tokens, f.output_tokens_bound) == (3, 100, 300)
    f = facts("openai", "/v1/completions", {"model": "m", "n": 2, "best_of": 5, "max_tokens": 10})
    assert f.output_tokens_bound == 50
    f = facts("anthropic", "/v1/messages", {"model": "m", "max_tokens": 10, "n": 4})
    assert f.output_tokens_bound == 10  # not an Anthropic parameter
    assert facts("openai", "/v1/responses", {"model": "m"}).output_tokens_bound is None
    with pytest.raises(BadRequest, match='"n" must be a positive integer'):
        facts("openai", "/v1/chat/completions", {"model": "m", "n": 0})


def test_query_string_and_trailing_slash_are_ignored_and_unknown_paths_are_other():
    f = facts("openai", "/v1/chat/completions/?api-version=2024", {"model": "m", "messages": []})
    assert f.endpoint == "chat.completions"
    assert facts("openai", "/v1/models", b"") == RequestFacts("openai", "other", None, False, None)
    assert facts("openai", "/v1/chat/completions", b"", method="GET").endpoint == "other"


@pytest.mark.parametrize(
    ("kind", "path", "body", "words"),
    [
        ("openai", "/v1/chat/completions", b"", "is empty"),
        ("openai", "/v1/chat/completions", b"{not json", "not valid JSON"),
        ("openai", "/v1/chat/completions", b"\xff\xfe{}", "is not UTF-8"),
        ("openai", "/v1/responses", b"[1, 2]", "not an array"),
        ("openai", "/v1/embeddings", b'"text"', "not a string"),
        ("openai", "/v1/chat/completions", b'{"messages": []}', 'has no "model"'),
        ("openai", "/v1/responses", b'{"model": ""}', 'empty "model"'),
        ("anthropic", "/v1/messages", b'{"model": 4}', 'a number as its "model"'),
        ("openai", "/v1/chat/completions", b'{"model": "m", "stream": "yes"}', '"stream" must be'),
        (
            "openai",
            "/v1/chat/completions",
            b'{"model": "m", "max_tokens": "12"}',
            '"max_tokens" must be',
        ),
        ("openai", "/v1/responses", b'{"model": "m", "max_output_tokens": 0}', "positive integer"),
        (
            "anthropic",
            "/v1/messages",
            b'{"model": "m", "max_tokens": true}',
            '"max_tokens" must be',
        ),
        ("anthropic", "/v1/messages", b"[" * 100_000, "levels deep"),
        # Python's json extensions, not JSON: refused by both readers (jiter and the
        # standard library's fallback), so no upstream sees what the caps did not read.
        ("openai", "/v1/chat/completions", b'{"model": "m", "temperature": NaN}', "not valid JSON"),
        ("anthropic", "/v1/messages", b'{"model": "m", "top_p": Infinity}', "not valid JSON"),
        ("openai", "/v1/responses", b'{"model": "m", "x": [-Infinity]}', "not valid JSON"),
    ],
)
def test_bad_bodies_are_bad_requests_with_one_clear_line(kind, path, body, words):
    with pytest.raises(BadRequest) as caught:
        request_facts(by_kind(kind), path, JSON_HEADERS, body)
    assert words in caught.value.message
    assert "\n" not in caught.value.message


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        name: _json
        for name in (
            "model",
            "stream",
            "max_tokens",
            "max_completion_tokens",
            "max_output_tokens",
            "n",
            "best_of",
        )
    },
)


@settings(deadline=None)
@given(
    st.sampled_from(
        [
            ("openai", "/v1/chat/completions"),
            ("openai", "/v1/completions"),
            ("openai", "/v1/responses"),
            ("openai", "/v1/embeddings"),
            ("anthropic", "/v1/messages"),
            ("anthropic", "/v1/messages/count_tokens"),
        ]
    ),
    st.one_of(
        st.binary(max_size=40),
        _json.map(lambda v: json.dumps(v).encode()),
        _fields.map(lambda v: json.dumps(v).encode()),
    ),
)
def test_any_body_gives_facts_or_a_bad_request_and_nothing_else(route, body):
    kind, path = route
    try:
        f = request_facts(by_kind(kind), path, JSON_HEADERS, body)
    except BadRequest as exc:
        assert exc.message and "\n" not in exc.message
        return
    assert isinstance(f.model, str) and f.model
    assert f.max_output_tokens is None or f.max_output_tokens >= 1
    new_body, strip = prepare(by_kind(kind), f, body)
    assert strip == (new_body is not body)
    assert json.loads(new_body) is not None


def test_bad_request_names_the_param_and_compressed_bodies_are_refused():
    with pytest.raises(BadRequest) as caught:
        request_facts(OPENAI, "/v1/chat/completions", [], b'{"model": "m", "max_tokens": -1}')
    assert caught.value.param == "max_tokens"
    with pytest.raises(BadRequest, match="content-encoding 'gzip'"):
        request_facts(ANTHROPIC, "/v1/messages", [(b"Content-Encoding", b"gzip")], b"\x1f\x8b")


def test_unknown_kind_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown provider kind"):
        by_kind("gemini")


# --- preparation ------------------------------------------------------------------


def test_streamed_chat_without_usage_asks_for_it_and_strips_it():
    payload = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "héllo"}],
        "stream": True,
    }
    body = json.dumps(payload).encode()
    f = request_facts(OPENAI, "/v1/chat/completions", JSON_HEADERS, body)
    new_body, strip = prepare(OPENAI, f, body)
    assert strip
    assert json.loads(new_body) == {**payload, "stream_options": {"include_usage": True}}


def test_existing_stream_options_are_kept_and_an_explicit_false_is_overridden():
    payload = {
        "model": "m",
        "prompt": "x",
        "stream": True,
        "stream_options": {"include_usage": False, "include_obfuscation": False},
    }
    body = json.dumps(payload).encode()
    new_body, strip = prepare(OPENAI, request_facts(OPENAI, "/v1/completions", [], body), body)
    assert strip
    assert json.loads(new_body)["stream_options"] == {
        "include_usage": True,
        "include_obfuscation": False,
    }


@pytest.mark.parametrize(
    ("kind", "path", "payload"),
    [
        (
            "openai",
            "/v1/chat/completions",
            {"model": "m", "stream": True, "stream_options": {"include_usage": True}},
        ),
        ("openai", "/v1/chat/completions", {"model": "m", "stream": False}),
        ("openai", "/v1/responses", {"model": "m", "stream": True}),
        ("anthropic", "/v1/messages", {"model": "m", "max_tokens": 5, "stream": True}),
    ],
)
def test_bodies_that_need_nothing_are_not_reencoded(kind, path, payload):
    body = json.dumps(payload, indent=2).encode()
    new_body, strip = prepare(by_kind(kind), request_facts(by_kind(kind), path, [], body), body)
    assert new_body is body
    assert not strip


# --- auth swap --------------------------------------------------------------------

RUN_TOKEN = "dkt-run-4f1c2a9b7e"
REAL_KEY = "sk-real-provider-key-0123456789"


@pytest.mark.parametrize(
    "credential",
    [
        (b"Authorization", b"Bearer " + RUN_TOKEN.encode()),
        (b"authorization", b"bearer   " + RUN_TOKEN.encode()),
        (b"x-api-key", RUN_TOKEN.encode()),
        (b"api-key", RUN_TOKEN.encode()),
    ],
)
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_token_is_found_in_each_form_and_never_forwarded(kind, credential):
    headers = [(b"host", b"127.0.0.1:8900"), credential, (b"content-type", b"application/json")]
    token, out = swap_auth(
        by_kind(kind), headers, api_key=REAL_KEY, upstream_host="api.example.com", content_length=42
    )
    assert token == RUN_TOKEN
    assert token_matches(token, RUN_TOKEN)
    assert not any(RUN_TOKEN.encode() in v for _, v in out)
    assert (b"host", b"api.example.com") in out
    assert [v for n, v in out if n == b"host"] == [b"api.example.com"]
    if kind == "openai":
        assert (b"authorization", b"Bearer " + REAL_KEY.encode()) in out
        assert not any(n == b"x-api-key" for n, _ in out)
    else:
        assert (b"x-api-key", REAL_KEY.encode()) in out
        assert not any(n == b"authorization" for n, _ in out)


def test_hop_by_hop_headers_are_removed_and_the_rest_kept():
    headers = [
        ("Host", "127.0.0.1:8900"),
        ("Connection", "keep-alive, X-Trace-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Authorization", "Basic abc"),
        ("Proxy-Connection", "keep-alive"),
        ("TE", "trailers"),
        ("Trailer", "x-sum"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "h2c"),
        ("X-Trace-Hop", "1"),
        ("X-Docket-Deadline", "2s"),
        ("Content-Length", "999"),
        ("Accept-Encoding", "gzip, br"),
        ("x-api-key", RUN_TOKEN),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "prompt-caching-2024-07-31"),
        ("User-Agent", "Anthropic/Python 2.14.0"),
    ]
    token, out = swap_auth(
        ANTHROPIC, headers, api_key=REAL_KEY, upstream_host="api.anthropic.com", content_length=12
    )
    assert token == RUN_TOKEN
    names = [n for n, _ in out]
    for gone in (
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"x-trace-hop",
        b"x-docket-deadline",
    ):
        assert gone not in names
    assert dict(out) == {
        b"host": b"api.anthropic.com",
        b"anthropic-version": b"2023-06-01",
        b"anthropic-beta": b"prompt-caching-2024-07-31",
        b"user-agent": b"Anthropic/Python 2.14.0",
        b"x-api-key": REAL_KEY.encode(),
        b"accept-encoding": b"identity",
        b"content-length": b"12",
    }
    assert len(out) == len(dict(out))


def test_no_token_or_a_non_bearer_scheme_presents_nothing():
    token, out = swap_auth(
        OPENAI,
        [(b"authorization", b"Basic dXNlcjpwYXNz")],
        api_key=REAL_KEY,
        upstream_host="h",
        content_length=None,
    )
    assert token is None
    assert not token_matches(token, RUN_TOKEN)
    assert not any(n == b"content-length" for n, _ in out)
    assert not token_matches("dkt-run-wrong", RUN_TOKEN)


def test_a_key_with_a_line_break_is_refused():
    with pytest.raises(ValueError, match="control character"):
        swap_auth(OPENAI, [], api_key="sk-x\r\nX-Evil: 1", upstream_host="h", content_length=0)


# --- usage --------------------------------------------------------------------------


def enc(obj) -> bytes:
    return json.dumps(obj).encode()


def test_usage_of_each_endpoint():
    assert usage_from_body(OPENAI, "chat.completions", enc(CHAT_COMPLETION)) == Usage(
        1117, 46, 1024, True, 0
    )
    assert usage_from_body(OPENAI, "responses", enc(RESPONSE)) == Usage(36, 87, 0, True, 0)
    assert usage_from_body(OPENAI, "embeddings", enc(EMBEDDINGS)) == Usage(8, 0, 0, True, 0)
    usage = usage_from_body(ANTHROPIC, "messages", enc(MESSAGE))
    assert usage == Usage(2095, 503, 100, False, 2051)
    assert usage.total_input_tokens == 2095 + 100 + 2051
    assert (
        usage_from_body(OPENAI, "chat.completions", enc(CHAT_COMPLETION)).total_input_tokens == 1117
    )


def test_missing_usage_is_none_not_zero():
    no_usage = {k: v for k, v in CHAT_COMPLETION.items() if k != "usage"}
    assert usage_from_body(OPENAI, "chat.completions", enc(no_usage)) is None
    assert (
        usage_from_body(OPENAI, "chat.completions", enc({**CHAT_COMPLETION, "usage": None})) is None
    )
    assert usage_from_body(ANTHROPIC, "messages", b"<html>502 Bad Gateway</html>") is None
    assert usage_from_body(ANTHROPIC, "messages.count_tokens", b'{"input_tokens": 14}') is None
    odd = {**MESSAGE, "usage": {"input_tokens": "12", "output_tokens": -1}}
    assert usage_from_body(ANTHROPIC, "messages", enc(odd)) == Usage(None, None, 0, False, 0)
    assert Usage(None, 3).total_input_tokens is None


def test_usage_converts_to_the_disjoint_counts_pricing_charges():
    from docket import pricing

    openai_usage = usage_from_body(OPENAI, "chat.completions", enc(CHAT_COMPLETION))
    assert openai_usage.priced() == pricing.Usage(1117 - 1024, 46, 1024)
    anthropic_usage = usage_from_body(ANTHROPIC, "messages", enc(MESSAGE))
    assert anthropic_usage.cache_write_1h_tokens is None
    assert anthropic_usage.priced() == pricing.Usage(2095, 503, 100, 0, 2051)  # unsplit: all at 1h
    split = {
        **MESSAGE["usage"],
        "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 51},
    }
    split_usage = usage_from_body(ANTHROPIC, "messages", enc({**MESSAGE, "usage": split}))
    assert split_usage.cache_write_1h_tokens == 51
    assert split_usage.as_fields()["cache_write_1h_tokens"] == 51
    assert split_usage.priced() == pricing.Usage(2095, 503, 100, 2000, 51)
    with pytest.raises(ValueError, match="incomplete"):
        Usage(None, 5).priced()
    with pytest.raises(ValueError, match="exceeds prompt_tokens"):
        Usage(10, 5, cached_tokens=11).priced()


# --- error shapes -----------------------------------------------------------------


def _respond_with(refused, calls):
    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(request)
        return httpx2.Response(
            refused.status,
            headers=[(n.decode(), v.decode()) for n, v in refused.headers],
            content=refused.body,
        )

    return httpx2.Client(transport=httpx2.MockTransport(handler))


@pytest.mark.parametrize("error_type", sorted(DOCKET_ERRORS))
def test_openai_sdk_reads_every_refusal(error_type):
    extra = {"code": "max_events"} if error_type == "docket_ledger_full" else {"cap": "max_usd"}
    refused = refusal(OPENAI, error_type, f"refused: {error_type}", extra=extra, retry_after_s=0.2)
    calls = []
    client = openai.OpenAI(
        api_key=RUN_TOKEN,
        base_url="http://127.0.0.1:9/v1",
        http_client=_respond_with(refused, calls),
        max_retries=0,
    )
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    err = caught.value
    assert err.status_code == DOCKET_ERRORS[error_type].status
    assert err.type == error_type
    assert f"refused: {error_type}" in err.message
    assert err.param is None
    if error_type == "docket_ledger_full":
        assert err.code == "max_events"
    else:
        assert err.body["cap"] == "max_usd"
    assert err.response.headers["retry-after"] == "1"


@pytest.mark.parametrize("error_type", sorted(DOCKET_ERRORS))
def test_anthropic_sdk_reads_every_refusal(error_type):
    refused = refusal(ANTHROPIC, error_type, f"refused: {error_type}", extra={"cap": "max_usd"})
    calls = []
    client = anthropic.Anthropic(
        api_key=RUN_TOKEN,
        base_url="http://127.0.0.1:9",
        http_client=_respond_with(refused, calls),
        max_retries=0,
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(
            model="claude-docket-test", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    err = caught.value
    assert err.status_code == DOCKET_ERRORS[error_type].status
    assert err.type == error_type
    assert err.api_message == f"refused: {error_type}"
    assert err.body["error"]["cap"] == "max_usd"


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_sdk_does_not_retry_a_refusal_no_retry_can_lift(kind):
    refused = refusal(
        by_kind(kind), "docket_ledger_full", "ledger is full", extra={"code": "max_ledger_bytes"}
    )
    calls = []
    http = _respond_with(refused, calls)
    if kind == "openai":
        client = openai.OpenAI(
            api_key="t", base_url="http://127.0.0.1:9/v1", http_client=http, max_retries=3
        )
        call = lambda: client.embeddings.create(model="m", input="x")  # noqa: E731
        error = openai.APIStatusError
    else:
        client = anthropic.Anthropic(
            api_key="t", base_url="http://127.0.0.1:9", http_client=http, max_retries=3
        )
        call = lambda: client.messages.count_tokens(model="m", messages=[])  # noqa: E731
        error = anthropic.APIStatusError
    with pytest.raises(error):
        call()
    assert len(calls) == 1
    assert (b"x-should-retry", b"false") in refused.headers


def test_error_body_shapes_and_argument_checks():
    assert json.loads(error_body(OPENAI, 429, "docket_rate_limited", "slow down")) == {
        "error": {
            "message": "slow down",
            "type": "docket_rate_limited",
            "param": None,
            "code": None,
        }
    }
    assert json.loads(
        error_body(ANTHROPIC, 400, "docket_bad_request", "bad", {"param": "model"})
    ) == {
        "type": "error",
        "error": {"type": "docket_bad_request", "message": "bad", "param": "model"},
    }
    with pytest.raises(ValueError, match="4xx or 5xx"):
        error_body(OPENAI, 200, "docket_bad_request", "x")
    with pytest.raises(ValueError, match="unknown docket error type"):
        error_body(OPENAI, 400, "docket_made_up", "x")
    with pytest.raises(ValueError, match="extra may not set type"):
        error_body(ANTHROPIC, 400, "docket_bad_request", "x", {"type": "other"})


def test_upstream_error_bodies_are_read():
    assert error_from_body(
        OPENAI,
        b'{"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}',
    ) == ProviderError("requests", "Rate limit reached", "rate_limit_exceeded")
    assert error_from_body(
        ANTHROPIC,
        b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
    ) == ProviderError("overloaded_error", "Overloaded")
    assert error_from_body(OPENAI, b"upstream connect error") is None


# --- stream facts ---------------------------------------------------------------------


def _sse(name: str | None, obj) -> bytes:
    head = f"event: {name}\n" if name else ""
    return (head + "data: " + json.dumps(obj) + "\n\n").encode()


CHAT_FACTS = RequestFacts("openai", "chat.completions", "gpt-4o-mini", True, None)


def _chat_stream() -> tuple[bytes, bytes]:
    base = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
    }
    chunks = [
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            ],
            "usage": None,
        },
        {
            **base,
            "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
            "usage": None,
        },
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None},
    ]
    usage = {
        **base,
        "choices": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }
    usage_event = _sse(None, usage)
    stream = b"".join(_sse(None, c) for c in chunks) + usage_event + b"data: [DONE]\n\n"
    return stream, usage_event


def _sdk_chunks(stream: bytes):
    def handler(request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    client = openai.OpenAI(
        api_key="t",
        base_url="http://127.0.0.1:9/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
    return list(client.chat.completions.create(model="gpt-4o-mini", messages=[], stream=True))


def test_the_openai_sdk_sees_the_stripped_stream_as_one_without_usage():
    stream, usage_event = _chat_stream()
    tracker = stream_tracker(OPENAI, CHAT_FACTS, strip_usage_chunk=True)
    forwarded = tracker.feed(stream) + tracker.flush()
    assert forwarded == stream.replace(usage_event, b"")
    assert tracker.usage == Usage(9, 2)
    seen = _sdk_chunks(forwarded)
    assert "".join(c.choices[0].delta.content or "" for c in seen) == "Hi"
    assert all(c.usage is None and c.choices for c in seen)
    # The unstripped stream, as a client that asked for usage gets it.
    assert _sdk_chunks(stream)[-1].usage.prompt_tokens == 9


def test_openai_stream_error_chunk_and_cut_stream():
    stream, _ = _chat_stream()
    cut = stream[: stream.index(b"data: [DONE]")] + b"data: [DO"
    tracker = stream_tracker(OPENAI, CHAT_FACTS)
    tracker.feed(cut)
    assert not tracker.finished and tracker.pending == len(b"data: [DO")

    tracker = stream_tracker(OPENAI, CHAT_FACTS)
    tracker.feed(
        _sse(
            None,
            {
                "error": {
                    "message": "The server had an error",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
        )
    )
    assert tracker.error == ProviderError("server_error", "The server had an error")
    assert tracker.usage is None


def test_a_usage_chunk_that_is_not_json_is_a_problem_not_a_crash():
    tracker = stream_tracker(OPENAI, CHAT_FACTS, strip_usage_chunk=True)
    bad = b'data: {"choices":[],"usage":{"prompt_tokens":\n\n'
    assert tracker.feed(bad) == bad  # not recognised as the usage chunk, so not removed
    assert "not valid JSON" in tracker.problem
    assert tracker.usage is None


RESPONSES_FACTS = RequestFacts("openai", "responses", "gpt-4.1", True, None)


def test_responses_stream_usage_comes_from_the_terminal_event():
    created = {
        "type": "response.created",
        "sequence_number": 0,
        "response": {**RESPONSE, "status": "in_progress", "usage": None},
    }
    delta = {
        "type": "response.output_text.delta",
        "sequence_number": 1,
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": '"usage":{"input_tokens":1}',
        "logprobs": [],
    }
    done = {"type": "response.completed", "sequence_number": 2, "response": RESPONSE}
    stream = (
        _sse("response.created", created)
        + _sse("response.output_text.delta", delta)
        + _sse("response.completed", done)
    )
    tracker = stream_tracker(OPENAI, RESPONSES_FACTS)
    assert tracker.feed(stream) is not None
    assert tracker.finished
    assert tracker.usage == Usage(36, 87)
    assert tracker.events == 3
    with pytest.raises(ValueError, match="no usage chunk"):
        stream_tracker(OPENAI, RESPONSES_FACTS, strip_usage_chunk=True)


def test_responses_stream_failure_and_error_events():
    failed = {
        "type": "response.failed",
        "sequence_number": 3,
        "response": {
            **RESPONSE,
            "status": "failed",
            "error": {"code": "server_error", "message": "boom"},
            "usage": None,
        },
    }
    tracker = stream_tracker(OPENAI, RESPONSES_FACTS)
    tracker.feed(_sse("response.failed", failed))
    assert tracker.finished
    assert tracker.error == ProviderError("server_error", "boom", "server_error")
    assert tracker.usage is None

    tracker = stream_tracker(OPENAI, RESPONSES_FACTS)
    tracker.feed(
        _sse(
            "error",
            {
                "type": "error",
                "code": "ERR_X",
                "message": "bad",
                "param": None,
                "sequence_number": 1,
            },
        )
    )
    assert tracker.error == ProviderError("ERR_X", "bad", "ERR_X")
    assert not tracker.finished


def test_anthropic_stream_error_event():
    tracker = stream_tracker(
        ANTHROPIC, RequestFacts("anthropic", "messages", "claude-sonnet-4-5", True, 100)
    )
    tracker.feed(
        _sse(
            "error",
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        )
    )
    assert tracker.error == ProviderError("overloaded_error", "Overloaded")
    assert not tracker.finished
    with pytest.raises(ValueError, match="no usage chunk"):
        stream_tracker(
            ANTHROPIC, RequestFacts("anthropic", "messages", "m", True, 1), strip_usage_chunk=True
        )


def test_a_count_beyond_two_to_the_53_is_not_a_count():
    from docket.boundary.providers.base import count

    assert count(2**53 - 1) == 2**53 - 1
    assert count(2**53) is None and count(10**5000) is None and count(-1) is None


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_the_standard_librarys_fallback_refuses_nan_and_infinity_too(literal):
    # jiter reads most bodies; a body it refuses is read again by the standard
    # library's decoder, which by default accepts these literals: it must refuse them.
    from docket.boundary.providers.base import _REQUEST_DECODER

    with pytest.raises(ValueError, match="not a JSON number"):
        _REQUEST_DECODER.decode('{"a": ' + literal + "}")


# --- what is forwarded, and what changed ----------------------------


def test_forwarded_names_what_prepare_changed_and_is_its_body():
    body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
    f = request_facts(OPENAI, "/v1/chat/completions", JSON_HEADERS, body)
    sent = forwarded(OPENAI, f, body)
    assert (sent.body, sent.strip_usage) == prepare(OPENAI, f, body)
    assert sent.changes == ("stream_options.include_usage",)
    # include_usage 1 is not true: made true, and named (1 == True in Python, not here).
    body = json.dumps(
        {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": 1}}
    ).encode()
    f = request_facts(OPENAI, "/v1/chat/completions", JSON_HEADERS, body)
    assert forwarded(OPENAI, f, body).changes == ("stream_options.include_usage",)


@pytest.mark.parametrize(
    ("kind", "path", "payload"),
    [
        ("openai", "/v1/chat/completions", {"model": "m", "messages": [], "stream": False}),
        (
            "openai",
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
        (
            "anthropic",
            "/v1/messages",
            {"model": "m", "messages": [], "max_tokens": 5, "stream": True},
        ),
    ],
)
def test_forwarded_bytes_that_are_the_agents_carry_no_changes(kind, path, payload):
    body = json.dumps(payload).encode()
    sent = forwarded(by_kind(kind), request_facts(by_kind(kind), path, JSON_HEADERS, body), body)
    assert sent.body is body and sent.changes == ()


@given(_json)
def test_a_value_differs_from_itself_nowhere_and_one_changed_leaf_is_named(value):
    assert changed_paths(value, value) == []
    assert changed_paths({"a": {"b": value}}, {"a": {"b": [value]}}) == ["a.b"]
    added = changed_paths({"a": 1}, {"a": 1, "n": {"m": value}})  # an object added: its leaves
    assert added and all(p == "n.m" or p.startswith("n.m.") for p in added), added
