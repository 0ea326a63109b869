"""No secret reaches a byte on disk, on any path.

Each finding is reproduced against a real boundary on 127.0.0.1 (or a real
supervised run) and checked in the bytes on disk: a malformed forward-proxy
target with userinfo, JSON bodies with leading whitespace, bodies over the
recording cap, bodies that are not UTF-8, secrets hidden behind JSON escapes,
percent-encoding or base64, answers nested past the recording depth, and the
mode the ledger, its lock, the receipt and the run folder are created with
under umask 0.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import sys
from urllib.parse import quote

import pytest
import trio
from conftest import REAL_KEY, TOKEN
from helpers import read_events
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.boundary import bodies
from docket.guards.credential_names import is_credential_member
from docket.guards.redact import Redactor
from docket.guards.scrub import SCRUB_MARKER
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

DEADLINE = 20
CHAT = "/openai/v1/chat/completions"
UNKNOWN = "s3cret-userinfo-pass-88c1e2"  # a secret the boundary does not know: only its place says


def forms(secret: str) -> dict[str, bytes]:
    """The secret as it could be found on disk: as is, and in each encoding a reader
    could undo (base64 at each alignment, percent-encoded, JSON-escaped)."""
    raw = secret.encode()
    found = {
        "plain": raw,
        "lower": secret.lower().encode(),
        "percent": quote(secret, safe="").encode(),
    }
    found["json \\u"] = "".join(f"\\u{ord(c):04x}" for c in secret).encode()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw)
        core = encoded[-(-offset * 4 // 3) : ((offset + len(raw)) // 3) * 4]
        found[f"base64@{offset}"] = core
    return found


def assert_absent(data: bytes, secrets: dict[str, str], where: str) -> None:
    hits = [
        f"{name} ({form})"
        for name, secret in secrets.items()
        for form, needle in forms(secret).items()
        if needle in data or needle.lower() in data.lower() and form in ("plain", "percent")
    ]
    assert not hits, f"{where} holds secrets: {hits}"


async def raw_exchange(url: str, request: bytes) -> bytes:
    """Send `request` as is on a fresh connection to the boundary; the whole answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        await stream.send_all(request)
        data = b""
        while b"\r\n\r\n" not in data or not _complete(data):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
        return data
    finally:
        await stream.aclose()


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


# ---------------------------------------------------------------- the forward proxy


MALFORMED_TARGETS = [
    # Absolute form whose port does not parse: the whole target used to be the host.
    b"GET http://user:" + UNKNOWN.encode() + b"@example.com:bad/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://user:" + REAL_KEY.encode() + b"@example.com:99999/ HTTP/1.1\r\nHost: x\r\n\r\n",
    # CONNECT with userinfo: an authority-form target has none.
    b"CONNECT user:" + UNKNOWN.encode() + b"@example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT " + UNKNOWN.encode() + b"@example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT user:" + UNKNOWN.encode() + b"@example.com HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT " + quote(TOKEN).encode() + b".example.com:x HTTP/1.1\r\nHost: x\r\n\r\n",
]


@pytest.mark.parametrize("request_bytes", MALFORMED_TARGETS, ids=range(len(MALFORMED_TARGETS)))
async def test_a_malformed_proxy_target_is_recorded_as_hash_and_length_only(
    request_bytes, stub_server, boundary_rig
):
    """Before the token check, a refused target is recorded; never its text."""
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as oa, boundary_rig({"openai": oa}) as rig:
            answer = await raw_exchange(rig.url, request_bytes)
    assert answer.split(b" ", 2)[1] in (b"400", b"407"), answer[:200]
    raw = rig.raw()
    assert_absent(raw, {"unknown": UNKNOWN, "key": REAL_KEY, "token": TOKEN}, "the ledger")
    (event,) = rig.events("net.denied")
    if event["rule"] == "proxy.target":
        target = request_bytes.split(b" ")[1]
        assert event["host"] == "(unparseable)" and event["port"] == 0
        assert event["target_sha256"] == hashlib.sha256(target).hexdigest()
        assert event["target_bytes"] == len(target)


# ---------------------------------------------------------------- recorded bodies


def _post(http, body: bytes, **headers):
    return http.post(CHAT, content=body, headers={"content-type": "application/json", **headers})


async def test_a_json_body_with_leading_whitespace_is_redacted(stub_server, boundary_rig):
    body = (
        b"\n  "
        + json.dumps(
            {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": "hi"}],
                "metadata": {"password": UNKNOWN},
            }
        ).encode()
    )
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            boundary_rig({"openai": oa}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            assert (await _post(http, body)).status_code == 200
    assert_absent(rig.raw(), {"unknown": UNKNOWN}, "the ledger")
    (request,) = rig.events("model.request")
    assert json.loads(request["request_body"])["metadata"] == {"password": "[redacted]"}
    assert request["request_body"].startswith("\n  {")  # the rest byte for byte


async def test_a_body_over_the_cap_is_cut_and_still_redacted(stub_server, boundary_rig):
    """Bodies over RECORDED_BODY_BYTES used to be recorded cut and unredacted."""
    filler = "x" * (bodies.RECORDED_BODY_BYTES // 4)
    payload = {
        "model": "gpt-4o-mini",
        "metadata": {"api_key": UNKNOWN},
        "messages": [{"role": "user", "content": f"{filler} {REAL_KEY} {filler}"}] * 6,
    }
    body = json.dumps(payload).encode()
    assert len(body) > bodies.RECORDED_BODY_BYTES
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            boundary_rig({"openai": oa}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            assert (await _post(http, body)).status_code == 200
    assert_absent(rig.raw(), {"unknown": UNKNOWN, "key": REAL_KEY}, "the ledger")
    (request,) = rig.events("model.request")
    assert request["request_body_truncated"] is True and request["request_body_redacted"] is True
    assert request["request_body"].startswith('{"model": "gpt-4o-mini", "metadata": {"api_key": "[')
    assert len(request["request_body"]) > bodies.RECORDED_BODY_BYTES // 2


async def test_a_body_that_is_not_utf8_is_hash_and_length_only(upstream_server, boundary_rig):
    """Not text: it used to be stored as base64, a secret in it one decode away."""
    answer = b"\xff\xfe binary " + UNKNOWN.encode() + b" " + REAL_KEY.encode()

    async def binary(request, respond):
        await request.read_body()
        await respond.simple(200, [(b"content-type", b"application/octet-stream")], answer)

    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(binary, "openai") as up,
            boundary_rig({"openai": up}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            body = json.dumps({"model": "gpt-4o-mini", "messages": []}).encode()
            # the agent's copy is relayed whole, but for the provider key (guards/scrub.py)
            relayed = answer.replace(REAL_KEY.encode(), SCRUB_MARKER)
            assert (await _post(http, body)).content == relayed
    assert_absent(rig.raw(), {"unknown": UNKNOWN, "key": REAL_KEY}, "the ledger")
    (closing,) = rig.events("model.response") + rig.events("model.error")
    assert closing["response_body_not_recorded"] == "not_utf8"
    assert closing["response_body_sha256"] == hashlib.sha256(answer).hexdigest()
    assert closing["response_body_bytes"] == len(answer)


async def test_an_answer_nested_past_the_bound_is_not_recorded_too_deep(
    upstream_server, boundary_rig
):
    deep = b'{"a":' * 600 + b"1" + b"}" * 600
    usage = b'{"id":"x","usage":{"prompt_tokens":1,"completion_tokens":1},"deep":'

    async def nested(request, respond):
        await request.read_body()
        await respond.simple(200, [(b"content-type", b"application/json")], usage + deep + b"}")

    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(nested, "openai") as up,
            boundary_rig({"openai": up}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            body = json.dumps({"model": "gpt-4o-mini", "messages": []}).encode()
            r = await _post(http, body)
    assert r.status_code == 200
    (closing,) = rig.events("model.response") + rig.events("model.error")
    assert closing["response_body_not_recorded"] == "too_deep"
    assert "response_body" not in closing


@pytest.mark.parametrize(
    "content",
    [
        # The known key split over JSON escapes: no byte of it is plain in the body.
        "".join(f"\\u{ord(c):04x}" for c in REAL_KEY),
        "\\u0073" + REAL_KEY[1:],
        "".join(f"%{b:02X}" for b in REAL_KEY.encode()),
        base64.b64encode(b"user:" + REAL_KEY.encode()).decode(),
        REAL_KEY.upper(),
    ],
    ids=["all-escaped", "one-escaped", "percent", "base64", "upper"],
)
async def test_a_known_secret_in_any_encoding_is_redacted(content, stub_server, boundary_rig):
    head = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"'
    body = head + content.encode() + b'"}]}'
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            boundary_rig({"openai": oa}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            assert (await _post(http, body)).status_code == 200
    assert_absent(rig.raw(), {"key": REAL_KEY}, "the ledger")
    (request,) = rig.events("model.request")
    assert request["request_body_redacted"] is True


async def test_a_secret_in_sse_chunks_split_anywhere_is_redacted(upstream_server, boundary_rig):
    """The upstream echoes the key inside a stream, one byte per chunk."""
    events = [
        {"choices": [{"delta": {"content": f"key {REAL_KEY}"}}]},
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
    ]
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    stream += b"data: [DONE]\n\n"

    async def sse(request, respond):
        await request.read_body()
        await respond.start(200, [(b"content-type", b"text/event-stream")])
        for i in range(len(stream)):
            await respond.send(stream[i : i + 1])
        await respond.end()

    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(sse, "openai") as up,
            boundary_rig({"openai": up}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            body = json.dumps({"model": "gpt-4o-mini", "messages": [], "stream": True}).encode()
            r = await _post(http, body)
    assert r.status_code == 200
    assert_absent(rig.raw(), {"key": REAL_KEY}, "the ledger")
    (closing,) = rig.events("model.response")
    assert closing["response_body_redacted"] is True
    assert closing["response_body"].endswith("data: [DONE]\n\n")


# ---------------------------------------------------------------- pure parts


def test_recording_is_not_recursive_at_any_depth():
    redactor = Redactor([REAL_KEY])
    for depth in (bodies.RECORDED_BODY_DEPTH + 1, 500, 100_000):
        data = b"[" * depth + b"]" * depth
        fields = bodies.recorded_body("response", data, redactor)
        assert fields["response_body_not_recorded"] == "too_deep"
        # The token loop too (the quick path above decided it by counting brackets).
        with pytest.raises(bodies.NotRecorded, match="too_deep"):
            bodies._redact_tokens(data.decode(), redactor)
    at_bound = b"[" * bodies.RECORDED_BODY_DEPTH + b"]" * bodies.RECORDED_BODY_DEPTH
    assert bodies.recorded_body("response", at_bound, redactor) == {
        "response_body": at_bound.decode()
    }


def test_duplicate_credential_members_are_all_redacted():
    """json.loads keeps the last member; the first one's value used to stay in the text."""
    data = b'{"api_key":"' + UNKNOWN.encode() + b'","api_key":""}'
    fields = bodies.recorded_body("response", data, Redactor([]))
    assert UNKNOWN not in fields["response_body"]


def test_redactor_walks_event_fields_without_recursion():
    redactor = Redactor([REAL_KEY])
    nested: dict = {"v": REAL_KEY}
    for _ in range(5000):
        nested = {"n": [nested]}
    out = redactor.fields({"deep": nested, REAL_KEY: 1})
    assert "[redacted]" in out and REAL_KEY not in out
    node = out["deep"]
    while "n" in node:
        node = node["n"][0]
    assert node == {"v": "[redacted]"}


# ---------------------------------------------------------------- file modes


async def test_run_files_are_created_owner_only_whatever_the_umask(stub_server, tmp_path):
    """Ledger, its lock, the receipt and the run folder: 0600 (0700), under umask 0."""
    old = os.umask(0)
    try:
        with trio.fail_after(DEADLINE):
            async with stub_server("openai") as oa:
                policy = tmp_path / "docket.toml"
                policy.write_text(
                    f'[providers.openai]\nkind = "openai"\nbase_url = "{oa.url}"\n'
                    'key_env = "STUB_KEY"\n'
                )
                folder = tmp_path / "run"
                options = RunOptions(
                    command=[sys.executable, "-c", "pass"],
                    policy_path=str(policy),
                    ledger_dir=str(folder),
                )
                outcome = await Supervisor(options).run()
    finally:
        os.umask(old)
    assert outcome.exit_status == 0, outcome.reason
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert modes and set(modes) >= {"ledger.jsonl", "receipt.json"}
    assert {name: mode for name, mode in modes.items() if mode & 0o077} == {}
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0


# ---------------------------------------------------------------- property-tested, pure

_SECRET_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_/+=%."
_ENCODINGS = ["plain", "upper", "percent", "some-percent", "escaped", "base64", "base64url"]


def _encoded(secret: str, how: str, pick: list[bool]) -> str:
    if how == "upper":
        return secret.upper()
    if how == "percent":
        return "".join(f"%{b:02x}" for b in secret.encode())
    if how == "some-percent":  # any mixture, as an attacker picks
        return "".join(f"%{ord(c):02X}" if p else c for c, p in zip(secret, pick, strict=False))
    if how == "escaped":
        return "".join(f"\\u{ord(c):04x}" if p else c for c, p in zip(secret, pick, strict=False))
    if how == "base64":
        return base64.b64encode(secret.encode()).decode()
    if how == "base64url":
        return base64.urlsafe_b64encode(b"x:" + secret.encode()).decode()
    return secret


@settings(deadline=None)
@given(
    secret=st.text(_SECRET_CHARS, min_size=8, max_size=60),
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    how=st.sampled_from(_ENCODINGS),
    pick=st.lists(st.booleans(), min_size=60, max_size=60),
    cut=st.integers(0, 100),
)
def test_the_redactor_leaves_no_form_of_a_secret(secret, before, after, how, pick, cut):
    text = before + _encoded(secret, how, pick) + after
    redactor = Redactor([secret])
    scrubbed, hit = redactor.text(text)
    assert hit
    for form, needle in forms(secret).items():
        assert needle.decode() not in scrubbed, form
    # A cut before the scrub (a field shortened to N characters) keeps no usable part.
    if how == "plain":
        partial = (before + secret)[: len(before) + max(cut, 12)]
        head = secret[: max(cut, 12)]
        assert head not in redactor.scrub(partial)


@settings(deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_the_redactor_leaves_text_without_a_secret_as_it_is(text):
    secret = "sk-" + "Q7" * 12  # no run of it is in a text drawn without "Q7Q7"
    if "q7q7" in text.lower():
        return
    assert Redactor([secret]).text(text) == (text, False)


_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
# Keys that do not name a credential (those are redacted by name, not by content).
_plain_keys = st.text(max_size=8).filter(lambda k: not is_credential_member(k))
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_plain_keys, inner, max_size=4),
    max_leaves=30,
)


@settings(deadline=None)
@given(
    value=_json, indent=st.sampled_from([None, 1]), ascii_=st.booleans(), cut=st.integers(1, 400)
)
def test_json_bodies_are_the_bytes_as_sent_unless_a_secret_is_in_them(value, indent, ascii_, cut):
    """Any JSON text without a secret comes back byte for byte, whole or cut (a cut
    drops at most the token it splits); a secret planted in it never comes back."""
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_)
    redactor = Redactor(["sk-" + "Q7" * 12])
    if "q7q7" not in text.lower() and "\\u" not in text:
        assert bodies.redact_json(text, redactor) == (text, False)
        prefix, _ = bodies.redact_json(text[:cut], redactor, cut=True)
        assert text[:cut].startswith(prefix)
    planted = json.dumps({"a": [value, {"b": "x sk-" + "Q7" * 12}]}, ensure_ascii=ascii_)
    out, hit = bodies.redact_json(planted, redactor)
    assert hit and "Q7Q7" not in out and json.loads(out)["a"][1] == {"b": "x [redacted]"}


def test_a_chaos_run_folder_is_created_owner_only_whatever_the_umask(tmp_path):
    from chaos.run.here import prepare_folder

    old = os.umask(0)
    try:
        prepare_folder(tmp_path / "chaos-run")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "chaos-run").stat().st_mode) == 0o700


@pytest.mark.parametrize(
    "name",
    ["secret_key", "aws_secret_access_key", "secretKey", "privateKey", "passphrase", "x-api-key",
     "accessKeyId", "client_secret", "Authorization", "refresh_token", "token"],
)  # fmt: skip
def test_credential_named_members_are_redacted(name):
    data = json.dumps({"a": [{name: UNKNOWN, "max_tokens": 5, "prompt_cache_key": "k1"}]}).encode()
    text = bodies.recorded_body("request", data, Redactor([]))["request_body"]
    assert json.loads(text)["a"][0] == {
        name: "[redacted]",
        "max_tokens": 5,
        "prompt_cache_key": "k1",
    }


def test_a_secret_parameter_after_a_semicolon_is_redacted():
    from docket.guards.redact import sanitize_url

    url = f"/v1/chat?a=1;api_key={UNKNOWN}&b=2"
    assert sanitize_url(url) == "/v1/chat?a=1;api_key=[redacted]&b=2"


@settings(deadline=None)
@given(
    data=st.binary(max_size=300)
    | st.text(alphabet='{}[]:,"\\u0123456789abcdeftrnl-+. \n\tdata:[DONE]', max_size=300).map(
        str.encode
    ),
    cut=st.booleans(),
)
def test_recording_any_bytes_never_raises_and_keeps_only_checked_text(data, cut):
    """Whatever the bytes: fields, never an exception (an exception here would be a
    call without its closing event); text only if it parsed, else hash and length."""
    fields = bodies.recorded_body("response", data, Redactor([UNKNOWN]), cut=cut)
    if "response_body" in fields:
        assert fields["response_body"].encode() in data or fields.get("response_body_redacted")
    else:
        assert fields["response_body_bytes"] == len(data)
        assert fields["response_body_not_recorded"] in (
            "not_utf8",
            "not_json",
            "malformed",
            "too_deep",
        )


@settings(deadline=None)
@given(value=_json, key=st.sampled_from(["a", "passphrase", "api_key", "tokens", "x"]))
def test_the_quick_path_decides_as_the_token_loop_does(value, key):
    """redact_json's C-speed path (nothing to take) never disagrees with the loop."""
    text = json.dumps({key: value, "n": [value]})
    redactor = Redactor(["sk-" + "Q7" * 12])

    def outcome(fn):
        try:
            return fn(text, redactor)
        except bodies.NotRecorded as why:
            return why.reason

    assert outcome(bodies.redact_json) == outcome(bodies._redact_tokens)


async def test_the_key_on_the_command_line_stays_out_of_ledger_and_receipt(
    stub_server, tmp_path, monkeypatch
):
    """The supervisor's own events (process.spawn's argv) pass the redactor; and when
    session.start cannot be written (EIO), what the receipt keeps of it passed it too."""
    import errno

    from docket.ledger.faults import FailOrdinals

    monkeypatch.setenv("STUB_KEY", REAL_KEY)
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as oa:
            policy = tmp_path / "docket.toml"
            policy.write_text(
                f'[providers.openai]\nkind = "openai"\nbase_url = "{oa.url}"\n'
                'key_env = "STUB_KEY"\n'
            )
            folder = tmp_path / "run"
            options = RunOptions(
                command=[sys.executable, "-c", "pass", REAL_KEY],  # the key on the command line
                policy_path=str(policy),
                ledger_dir=str(folder),
            )
            faults = FailOrdinals(errno.EIO, start=0, stop=1)
            outcome = await Supervisor(options, faults=faults).run()
    assert outcome.receipt.exists()
    (spawn,) = [e for e in read_events(folder / "ledger.jsonl") if e["type"] == "process.spawn"]
    assert spawn["argv"][-1] == "[redacted]"
    for path in folder.iterdir():
        assert_absent(path.read_bytes(), {"key": REAL_KEY}, path.name)
