"""The client's attempt marker and ids: what is recorded, and what never is."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from docket.boundary.providers.client_marks import MAX_ID_CHARS, client_marks
from docket.guards.redact import Redactor

RUN_TOKEN = "dkt-run-token-0123456789abcdef"
redactor = Redactor([RUN_TOKEN, "sk-upstream-secret-key-000111"])


def test_sdk_headers_are_read():
    marks = client_marks(
        [
            (b"X-Stainless-Retry-Count", b"2"),
            (b"Idempotency-Key", b"stainless-python-retry-7f1c"),
            (b"x-client-request-id", b"req_abc"),
            (b"content-type", b"application/json"),
        ],
        redactor.scrub,
    )
    assert marks.attempt == 2
    assert marks.ids == {
        "client_request_id": "req_abc",
        "idempotency_key": "stainless-python-retry-7f1c",
    }
    assert marks.rejected == ()
    assert marks.as_fields() == {
        "client_attempt": 2,
        "client_ids": {
            "client_request_id": "req_abc",
            "idempotency_key": "stainless-python-retry-7f1c",
        },
    }


def test_no_headers_no_fields():
    assert client_marks([(b"accept", b"*/*")]).as_fields() == {}


def test_str_headers_too():
    assert client_marks([("x-stainless-retry-count", "0")]).attempt == 0


def test_bad_values_are_named_not_recorded():
    for value in (b"-1", b"1000", b"01", b"1.0", b"", b"0x1", b"\xff", b"1 2", b"\x00"):
        marks = client_marks([(b"x-stainless-retry-count", value)])
        assert marks.attempt is None, value
        assert marks.as_fields() == {"client_marks_rejected": ["x-stainless-retry-count"]}


def test_a_repeated_header_is_ambiguous():
    marks = client_marks([(b"x-stainless-retry-count", b"0"), (b"x-stainless-retry-count", b"1")])
    assert marks.attempt is None and marks.rejected == ("x-stainless-retry-count",)


def test_ids_out_of_grammar():
    for value in (b"a b", b"x" * (MAX_ID_CHARS + 1), b"caf\xc3\xa9", b"tab\there", b"\x7f"):
        marks = client_marks([(b"idempotency-key", value)])
        assert marks.ids == {} and marks.rejected == ("idempotency-key",), value
    assert client_marks([(b"idempotency-key", b"x" * MAX_ID_CHARS)]).ids


def test_a_secret_never_reaches_the_fields():
    # The run token (known: scrubbed anywhere in the value, in any case) and
    # credential-looking values (unknown keys: refused by their prefix).
    for value in (
        RUN_TOKEN,
        f"req-{RUN_TOKEN}-1",
        RUN_TOKEN.upper(),
        "sk-proj-abcdefghijklmnop",
        "sk-ant-api03-xyz",
        "Bearer:abc",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_0123456789abcdef",
    ):
        marks = client_marks([(b"x-request-id", value.encode())], redactor.scrub)
        assert marks.ids == {}, value
        assert marks.as_fields() == {"client_marks_rejected": ["x-request-id"]}


# --- properties

_printable_id = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E),
    min_size=1,
    max_size=MAX_ID_CHARS,
)


@settings(deadline=None)
@given(st.integers(min_value=0, max_value=999))
def test_every_small_attempt_round_trips(n):
    assert client_marks([(b"x-stainless-retry-count", str(n).encode())]).attempt == n


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    b"x-stainless-retry-count",
                    b"idempotency-key",
                    b"x-client-request-id",
                    b"x-request-id",
                    b"other",
                ]
            ),
            st.binary(max_size=300),
        ),
        max_size=8,
    )
)
def test_whatever_the_headers_the_fields_are_bounded_and_clean(headers):
    fields = client_marks(headers, redactor.scrub).as_fields()
    attempt = fields.get("client_attempt")
    assert attempt is None or (type(attempt) is int and 0 <= attempt <= 999)
    for key, value in fields.get("client_ids", {}).items():
        assert key in {"idempotency_key", "client_request_id", "request_id"}
        assert 1 <= len(value) <= MAX_ID_CHARS
        assert all(0x21 <= ord(c) <= 0x7E for c in value)
        assert redactor.scrub(value) == value
    # every header it was given is either recorded or named, never dropped silently
    named = {n.decode() for n, _ in headers if n != b"other"}
    recorded = set(fields.get("client_marks_rejected", []))
    if "client_attempt" in fields:
        recorded.add("x-stainless-retry-count")
    back = {
        "idempotency_key": "idempotency-key",
        "client_request_id": "x-client-request-id",
        "request_id": "x-request-id",
    }
    recorded |= {back[k] for k in fields.get("client_ids", {})}
    assert recorded == named


@settings(deadline=None)
@given(_printable_id)
def test_printable_ids_are_kept_unless_credential_like(value):
    marks = client_marks([(b"x-client-request-id", value.encode())], redactor.scrub)
    lowered = value.lower()
    credential_like = (
        lowered.startswith(("sk-", "rk-", "bearer", "basic"))
        or value.startswith(("AKIA", "ASIA", "AIza"))
        or (len(value) > 3 and value[:2] == "gh" and value[2] in "pousr" and value[3] == "_")
        or (value[:3] == "xox" and len(value) > 4 and value[3] in "abprs" and value[4] == "-")
    )
    if credential_like:
        assert marks.ids == {}
    else:
        assert marks.ids == {"client_request_id": value}
