"""Credential-named JSON members under any spelling (docket/guards/credential_names.py):
what a recorded body (record_bodies) hides by the member's name."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from docket.boundary.bodies import redact_json
from docket.guards.credential_names import ANY_CREDENTIAL_WORD, is_credential_member, words
from docket.guards.redact import MARKER, Redactor

# Each a credential, as words; every spelling of them must be caught.
CREDENTIALS = [
    ["access", "token"], ["refresh", "token"], ["id", "token"], ["auth", "token"],
    ["session", "token"], ["bearer", "token"], ["api", "token"], ["github", "token"],
    ["token"], ["secret"], ["client", "secret"], ["secret", "key"],
    ["aws", "secret", "access", "key"], ["password"], ["db", "password"], ["passphrase"],
    ["pwd"], ["credential"], ["credentials"], ["api", "key"], ["x", "api", "key"],
    ["private", "key"], ["access", "key"], ["session", "key"], ["signing", "key"],
    ["auth"], ["authorization"], ["cookie"], ["session", "cookie"], ["bearer"], ["jwt"],
]  # fmt: skip
# Each not one, however spelled: counts, cache and idempotency keys, a thinking block's
# signature, a tokenizer's tokens, a page's cursor, a chat's session.
NOT_CREDENTIALS = [
    ["max", "tokens"], ["prompt", "tokens"], ["completion", "tokens"], ["total", "tokens"],
    ["prompt", "cache", "key"], ["idempotency", "key"], ["signature"], ["eos", "token"],
    ["pad", "token"], ["next", "token"], ["page", "token"], ["session", "id"], ["model"],
    ["messages"], ["content"], ["stop"], ["key"], ["cache", "control"], ["tokenizer"],
]  # fmt: skip


def spelled(split: list[str], style: str) -> str:
    if style == "snake":
        return "_".join(split)
    if style == "kebab":
        return "-".join(split)
    if style == "upper":
        return "_".join(split).upper()
    if style == "camel":
        return split[0] + "".join(w.title() for w in split[1:])
    if style == "pascal":
        return "".join(w.title() for w in split)
    if style == "spaced":
        return " ".join(split)
    if style == "dotted":
        return ".".join(split)
    return "".join(split)  # joined: "accesstoken"


STYLES = st.sampled_from(
    ["snake", "kebab", "upper", "camel", "pascal", "spaced", "dotted", "joined"]
)


@given(st.sampled_from(CREDENTIALS), STYLES)
def test_a_credential_name_is_caught_in_every_spelling(split, style):
    name = spelled(split, style)
    assert is_credential_member(name), name
    assert ANY_CREDENTIAL_WORD.search(json.dumps({name: 1}).lower()), name  # the quick path


@given(st.sampled_from(NOT_CREDENTIALS), STYLES)
def test_a_name_that_is_not_a_credential_is_not_caught_in_any_spelling(split, style):
    name = spelled(split, style)
    assert not is_credential_member(name), name


@given(st.sampled_from(CREDENTIALS), STYLES, st.text(min_size=1, max_size=20))
def test_a_recorded_body_hides_the_value_under_any_spelling(split, style, value):
    name = spelled(split, style)
    text = json.dumps({"model": "m", name: value, "messages": []})
    redacted, changed = redact_json(text, Redactor([]))
    assert changed and json.loads(redacted)[name] == MARKER, redacted


def test_words_split_camel_case_acronyms_and_separators():
    assert words("refreshToken") == words("REFRESH_TOKEN") == ["refresh", "token"]
    assert words("XMLHttpAPIKey") == ["xml", "http", "api", "key"]
    assert words("x-api-key") == words("X.Api Key") == ["x", "api", "key"]
    assert words("") == words("--") == []
    assert not is_credential_member("") and not is_credential_member("__")
