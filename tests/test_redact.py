"""Redaction: a secret planted in each place a request can carry one never reaches the output."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.guards.redact import MARKER, is_secret_header, redact_headers, sanitize_url

SECRET = "sk-proj-PLANTED0123456789abcdef"


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "authorization",
        "x-api-key",
        "X-API-KEY",
        "api-key",
        "Cookie",
        "set-cookie",
        "Proxy-Authorization",
        "x-goog-api-key",
        "x-amz-security-token",
        "X-Docket-Token",
    ],
)
@pytest.mark.parametrize("as_bytes", [False, True])
def test_each_credential_header_is_redacted(name, as_bytes):
    value = f"Bearer {SECRET}" if "auth" in name.lower() else SECRET
    pair = (name.encode(), value.encode()) if as_bytes else (name, value)
    [(out_name, out_value)] = redact_headers([pair])
    assert out_name == pair[0]
    assert type(out_value) is type(pair[1])
    text = out_value.decode() if as_bytes else out_value
    assert SECRET not in text
    assert MARKER in text


def test_the_scheme_is_kept_and_other_headers_are_untouched():
    headers = [
        ("Authorization", f"Bearer {SECRET}"),
        ("Content-Type", "application/json"),
        ("anthropic-version", "2023-06-01"),
        ("User-Agent", "OpenAI/Python 3.57.0"),
        ("Cookie", f"session={SECRET}; theme=dark"),
    ]
    out = redact_headers(headers)
    assert out[0] == ("Authorization", f"Bearer {MARKER}")
    assert out[1:4] == headers[1:4]
    assert out[4] == ("Cookie", MARKER)
    assert SECRET not in json.dumps(out)


def test_a_scheme_that_is_not_a_word_is_not_kept():
    [(_, value)] = redact_headers([("Authorization", f"{SECRET} trailing")])
    assert value == MARKER


def test_header_names_that_are_not_secret():
    for name in ("content-type", "accept", "anthropic-beta", "openai-organization", "x-request-id"):
        assert not is_secret_header(name)


@pytest.mark.parametrize(
    "url",
    [
        f"https://user:{SECRET}@api.example.com/v1/models",
        f"https://{SECRET}@api.example.com/v1/models",
        f"http://127.0.0.1:8900/openai/v1/chat/completions?key={SECRET}",
        f"https://api.example.com/x?model=gpt&api_key={SECRET}&n=2",
        f"https://api.example.com/x?apiKey={SECRET}",
        f"https://api.example.com/x?API-KEY={SECRET}",
        f"https://api.example.com/x?access_token={SECRET}",
        f"https://api.example.com/x?TOKEN={SECRET}",
        f"https://api.example.com/x?client_secret={SECRET}",
        f"https://api.example.com/x?password={SECRET}",
        f"https://bucket.s3.amazonaws.com/o?X-Amz-Expires=60&X-Amz-Signature={SECRET}",
        f"https://storage.googleapis.com/o?X-Goog-Signature={SECRET}",
        f"https://blob.core.windows.net/c/b?sv=2024&sig={SECRET}",
        f"https://api.example.com/x?auth={SECRET}",
        f"https://api.example.com/cb#access_token={SECRET}&state=1",
        f"/v1/chat/completions?api_key={SECRET}",
        f"user:{SECRET}@api.example.com:443",
    ],
)
def test_planted_secret_is_absent_from_the_sanitized_url(url):
    clean = sanitize_url(url)
    assert SECRET not in clean
    if "@" in url:  # userinfo goes whole; the rest stays
        scheme, sep, rest = url.rpartition("://")
        assert clean == scheme + sep + rest.partition("@")[2]
    else:  # only the secret value is replaced
        assert clean == url.replace(SECRET, MARKER)


def test_the_rest_of_the_url_is_kept_as_it_was():
    url = f"https://u:{SECRET}@api.example.com:8443/v1/x%20y?model=gpt%2D4&key={SECRET}&empty=&flag#frag"
    assert (
        sanitize_url(url)
        == f"https://api.example.com:8443/v1/x%20y?model=gpt%2D4&key={MARKER}&empty=&flag#frag"
    )
    assert (
        sanitize_url("https://api.openai.com/v1/chat/completions")
        == "https://api.openai.com/v1/chat/completions"
    )
    assert sanitize_url("api.openai.com:443") == "api.openai.com:443"


def test_an_unparseable_url_is_not_copied():
    assert sanitize_url(f"http://[::1{SECRET}/x") == "[unparseable url]"


_secret_names = st.sampled_from(
    [
        "key",
        "api_key",
        "apikey",
        "token",
        "access_token",
        "secret",
        "password",
        "sig",
        "signature",
        "auth",
    ]
)
_plain = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~", min_size=1, max_size=10)


@settings(deadline=None)
@given(
    st.lists(_plain, max_size=4),
    _secret_names,
    st.sampled_from([str.lower, str.upper, str.title]),
    st.integers(0, 4),
)
def test_a_secret_param_anywhere_in_any_case_is_redacted(plain, secret_name, case, at):
    params = [f"p{i}={v}" for i, v in enumerate(plain)]
    params.insert(min(at, len(params)), f"{case(secret_name)}={SECRET}")
    clean = sanitize_url("https://api.example.com/p?" + "&".join(params))
    assert SECRET not in clean
    for p in params:
        if SECRET not in p:
            assert p in clean


@settings(deadline=None)
@given(st.text(max_size=60))
def test_any_text_sanitizes_to_text_without_raising(url):
    assert isinstance(sanitize_url(url), str)


def test_argv_secrets_are_redacted_and_flags_kept():
    from docket.guards.redact import redact_argv

    argv = [
        "python",
        "agent.py",
        "--api-key",
        "sk-planted-1",
        "--token=tok-planted-2",
        "--url",
        "https://user:pw-planted-3@example.com/x?key=planted-4",
        "--model",
        "gpt-4o",
    ]
    out = redact_argv(argv)
    joined = " ".join(out)
    for planted in ("sk-planted-1", "tok-planted-2", "pw-planted-3", "planted-4"):
        assert planted not in joined
    assert out[:3] == ["python", "agent.py", "--api-key"]
    assert out[4].startswith("--token=") and out[-2:] == ["--model", "gpt-4o"]
