"""Property-tested end to end: secrets planted in every place an agent
(or an upstream) can put one, against the real supervisor, its boundary on
127.0.0.1 and a real agent process sending raw bytes; then every byte of every
file under the run folder is searched for each secret, as written and in each
form a reader could undo (letter case, percent-encoding, JSON \\u escapes,
base64 at any alignment).

Two secrets per example: the provider key (KEY: the boundary knows it, so it is
scrubbed wherever it turns up, whatever encodes it) and an unknown one (UNKNOWN:
only its place says it is a secret: userinfo, a credential-named query parameter
or JSON member, a header, a body that is not text, a target that does not parse).
The run token is searched for too. The upstream echoes the key it was sent, in
every shape an answer takes (JSON at depth, escaped, an error with a retry-after,
a stream cut into chunks of any size, bytes that are not text).
"""

from __future__ import annotations

import base64
import json
import os
import string
import sys
import tempfile
import textwrap
from pathlib import Path
from urllib.parse import quote

import trio
from helpers import io_examples, serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docket.boundary import bodies
from docket.http.server import serve
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

DEADLINE = 60
RECORDED_CAP = 700  # bodies.RECORDED_BODY_BYTES for these runs: most bodies are cut

AGENT = textwrap.dedent(
    """
    import base64, json, os, socket, sys
    plan, token_file, status_file = sys.argv[1:4]
    token = os.environ["OPENAI_API_KEY"]
    host_port = os.environ["OPENAI_BASE_URL"].split("//")[1].split("/")[0]
    host, port = host_port.rsplit(":", 1)
    open(token_file, "w").write(token)
    statuses = []
    for entry in json.load(open(plan)):
        raw = base64.b64decode(entry).replace(b"{{TOKEN}}", token.encode())
        raw = raw.replace(b"{{HOST}}", host_port.encode())
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(raw)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if raw.startswith(b"CONNECT") and b"\\r\\n\\r\\n" in data:
                break  # a tunnel's answer is its head
        s.close()
        statuses.append(data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "none")
    open(status_file, "w").write(" ".join(statuses))
    """
)

_ALPHABET = string.ascii_letters + string.digits + "-_"
secrets_st = st.text(_ALPHABET, min_size=24, max_size=48)


def forms(secret: str) -> dict[str, bytes]:
    raw = secret.encode()
    found = {
        "plain": raw,
        "percent": "".join(f"%{b:02x}" for b in raw).encode(),
        "json \\u": "".join(f"\\u{ord(c):04x}" for c in secret).encode(),
    }
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw)
        core = encoded[-(-offset * 4 // 3) : ((offset + len(raw)) // 3) * 4]
        found[f"base64@{offset}"] = core
        found[f"base64url@{offset}"] = core.replace(b"+", b"-").replace(b"/", b"_")
    return found


def found_in(data: bytes, secret: str) -> list[str]:
    lower = data.lower()
    return [
        form
        for form, needle in forms(secret).items()
        if needle in data or (not form.startswith("base64") and needle.lower() in lower)
    ]


# ---------------------------------------------------------------- what an agent sends


def encode(secret: str, how: str) -> str:
    """The secret as it goes into a JSON string's text (already escaped as JSON)."""
    if how == "escaped":
        return "".join(f"\\u{ord(c):04x}" for c in secret)
    if how == "one-escaped":
        return f"\\u{ord(secret[0]):04x}" + secret[1:]
    if how == "percent":
        return "".join(f"%{b:02X}" for b in secret.encode())
    if how == "base64":
        return base64.b64encode(b"Basic user:" + secret.encode()).decode()
    if how == "upper":
        return secret.upper()
    return secret


def nest(value: str, depth: int, key: str) -> str:
    """A JSON text holding `value` (already JSON text) `depth` levels down."""
    text = value
    for i in range(depth):
        text = f'{{"{key}{i}": [{text}]}}' if i % 2 else f'{{"{key}{i}": {text}}}'
    return text


@st.composite
def model_call(draw, key: str, unknown: str) -> bytes:
    how = draw(st.sampled_from(["plain", "escaped", "one-escaped", "percent", "base64", "upper"]))
    depth = draw(st.integers(0, 70))  # past RECORDED_BODY_DEPTH sometimes
    padding = "x" * draw(st.integers(0, 2 * RECORDED_CAP))  # the cut lands anywhere, in the key too
    credential = draw(
        st.sampled_from(
            [
                "password",
                "api_key",
                "x-api-key",
                "access_token",
                "secretKey",
                "aws_secret_access_key",
            ]
        )
    )
    planted = nest(f'"{padding} {encode(key, how)} {padding}"', depth, "k")
    hidden = nest(f'{{"{credential}": "{unknown}"}}', draw(st.integers(0, 20)), "m")
    stream = draw(st.booleans())
    lead = draw(st.sampled_from(["", " ", "\n\t "]))  # whitespace before the JSON
    body = (
        f'{lead}{{"model": "gpt-4o-mini", "max_tokens": 5, '
        f'"stream": {json.dumps(stream)}, "messages": [{{"role": "user", "content": "hi"}}], '
        f'"metadata": {{"p": {planted}, "h": {hidden}}}}}'
    ).encode()
    if draw(st.booleans()):  # duplicate credential members: the first one hidden too
        body = body.replace(
            b'"model"', f'"{credential}": "{unknown}", "{credential}": "", "model"'.encode(), 1
        )
    mode = draw(st.sampled_from(["json", "escaped", "deep", "error", "sse", "binary"]))
    query = draw(
        st.sampled_from(
            [
                f"?api_key={unknown}",
                f"?a=1;api_key={unknown}",
                f"?{key}=1",
                f"?q={quote(key)}&token={unknown}",
                f"?{quote(key, safe='').upper()}",
                "",
            ]
        )
    )
    target = draw(
        st.sampled_from(
            [
                f"/openai/v1/chat/completions{query}",
                f"http://user:{unknown}@{{{{HOST}}}}/openai/v1/chat/completions{query}",
            ]
        )
    )
    headers = [
        ("Host", "{{HOST}}"),
        ("Authorization", "Bearer {{TOKEN}}"),
        ("Content-Type", "application/json"),
        ("X-Echo-Mode", f"{mode}:{draw(st.integers(1, 64))}"),
        ("Cookie", f"session={unknown}"),
        ("Cookie", f"other={key}"),
        (f"X-{key}", unknown),
        ("Proxy-Authorization", f"Basic {unknown}"),
    ]
    if draw(st.booleans()):
        headers.append(("X-Docket-Deadline-Ms", f"{key}{unknown}"))  # refused, by name
    return request_bytes("POST", target, headers, body)


def other_request(key: str, unknown: str) -> st.SearchStrategy[bytes]:
    """Refusals and the forward proxy: each its own path to an event."""
    json_body = b'{"model": "gpt-4o-mini", "messages": []}'
    plain = [("Host", "x"), ("Authorization", "Bearer {{TOKEN}}")]
    cases = [
        request_bytes(
            "POST", "/openai/v1/chat/completions", [("Authorization", f"Bearer {key}")], json_body
        ),
        request_bytes("POST", f"/openai/v1/{key}", plain, json_body),
        request_bytes(
            "POST",
            "/openai/v1/chat/completions",
            plain,
            json_body.replace(b"gpt-4o-mini", f"gpt-4o-mini-{key}".encode()),
        ),
        request_bytes("POST", f"/{key}/v1/chat/completions", plain, json_body),
        request_bytes(
            "POST", "/openai/v1/chat/completions", plain, b'{"password": "' + unknown.encode()
        ),
        request_bytes(
            "POST",
            "/openai/v1/chat/completions",
            plain,
            b"\xff\xfe" + unknown.encode() + key.encode(),
        ),
        request_bytes("GET", f"http://user:{unknown}@example.com:bad/", [("Host", "x")], b""),
        request_bytes("GET", f"http://user:{key}@example.com:99999/", [("Host", "x")], b""),
        request_bytes("GET", f"http://{key}.example.com/?token={unknown}", [("Host", "x")], b""),
        request_bytes("GET", f"http://example.com/{key}?api_key={unknown}", [("Host", "x")], b""),
        request_bytes("CONNECT", f"user:{unknown}@example.com:443", [("Host", "x")], None),
        request_bytes("CONNECT", f"{unknown}@example.com:443", [("Host", "x")], None),
        request_bytes("CONNECT", f"{key}.example.com:443", [("Host", "x")], None),
        request_bytes("CONNECT", f"[{key}]:443", [("Host", "x")], None),
        request_bytes("CONNECT", f"example.com:{key}", [("Host", "x")], None),
        request_bytes(
            "CONNECT",
            f"{key}.example.com:443",
            [
                ("Host", "x"),
                ("Proxy-Authorization", "Basic " + base64.b64encode(b"docket:{{TOKEN}}").decode()),
            ],
            None,
        ),
    ]
    return st.sampled_from(cases)


def request_bytes(method: str, target: str, headers: list, body: bytes | None) -> bytes:
    head = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers), "Connection: close"]
    if body is not None:
        head.append(f"Content-Length: {len(body)}")
    return "\r\n".join(head).encode() + b"\r\n\r\n" + (body or b"")


# ---------------------------------------------------------------- the upstream


async def echo_key(request, respond) -> None:
    """Answers with the key it was sent, in the shape X-Echo-Mode names."""
    await request.read_body()
    key = (request.header(b"authorization") or b"").removeprefix(b"Bearer ").decode()
    mode, _, size = (request.header(b"x-echo-mode") or b"json:8").decode().partition(":")
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    json_type = [(b"content-type", b"application/json")]
    if mode == "json":
        body = {
            "id": key,
            "choices": [{"message": {"content": f"your key: {key}"}}],
            "usage": usage,
        }
        await respond.simple(200, json_type, json.dumps({key: 1, **body}).encode())
    elif mode == "escaped":
        escaped = "".join(f"\\u{ord(c):04x}" for c in key)
        await respond.simple(200, json_type, b'{"choices":[],"x":"' + escaped.encode() + b'"}')
    elif mode == "deep":
        text = json.dumps(key)
        for _ in range(int(size) * 3):
            text = f'{{"d":{text}}}'
        await respond.simple(
            200, json_type, f'{{"usage":{json.dumps(usage)},"deep":{text}}}'.encode()
        )
    elif mode == "error":
        error = {"error": {"message": f"bad key {key}", "type": f"{'x' * 40}{key}", "code": key}}
        headers = [*json_type, (b"retry-after", f"{'1' * 50}{key}".encode())]
        await respond.simple(400, headers, json.dumps(error).encode())
    elif mode == "binary":
        await respond.simple(
            200, [(b"content-type", b"application/octet-stream")], b"\xff" + key.encode()
        )
    else:  # sse, cut into chunks of `size` bytes
        chunks = [
            {"choices": [{"delta": {"content": f"key {key}"}}]},
            {"choices": [], "usage": usage},
        ]
        stream = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
        stream += b"data: [DONE]\n\n"
        await respond.start(200, [(b"content-type", b"text/event-stream")])
        step = int(size)
        for i in range(0, len(stream), step):
            await respond.send(stream[i : i + step])
        await respond.end()


# ---------------------------------------------------------------- the property


@st.composite
def plans(draw):
    key = "sk-" + draw(secrets_st)
    unknown = "u-" + draw(secrets_st)
    calls = draw(st.lists(model_call(key, unknown), min_size=2, max_size=5))
    others = draw(st.lists(other_request(key, unknown), min_size=2, max_size=6))
    return key, unknown, draw(st.permutations(calls + others))


@settings(
    max_examples=io_examples(),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(plan=plans())
def test_no_planted_secret_reaches_any_byte_under_the_run_folder(plan):
    key, unknown, requests = plan
    old_cap, old_key = bodies.RECORDED_BODY_BYTES, os.environ.get("STUB_KEY")
    bodies.RECORDED_BODY_BYTES = RECORDED_CAP
    os.environ["STUB_KEY"] = key
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder, outcome, statuses, token = trio.run(_one_run, Path(tmp), requests)
            on_disk = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    finally:
        bodies.RECORDED_BODY_BYTES = old_cap
        if old_key is None:
            os.environ.pop("STUB_KEY", None)
        else:
            os.environ["STUB_KEY"] = old_key
    assert outcome.exit_status == 0, outcome.reason
    # Every request got an answer: the boundary kept serving.
    assert len(statuses) == len(requests) and "none" not in statuses, statuses
    assert {"ledger.jsonl", "receipt.json"} <= {p.name for p in on_disk}
    for path, data in on_disk.items():
        for name, secret in (("key", key), ("unknown", unknown), ("token", token)):
            hits = found_in(data, secret)
            assert not hits, f"{path.name} holds the {name} ({', '.join(hits)})"


async def _one_run(tmp: Path, requests: list[bytes]):
    with trio.fail_after(DEADLINE):
        async with serving(lambda task_status: serve(echo_key, task_status=task_status)) as (up, _):
            policy = tmp / "docket.toml"
            policy.write_text(
                f'[providers.openai]\nkind = "openai"\nbase_url = "{up.url}/v1"\n'
                'key_env = "STUB_KEY"\n[ledger]\nrecord_bodies = true\n'
            )
            plan = tmp / "plan.json"
            plan.write_text(json.dumps([base64.b64encode(r).decode() for r in requests]))
            token_file, status_file = tmp / "token", tmp / "statuses"
            folder = tmp / "run"
            options = RunOptions(
                # The key on the agent's command line too (session.start and process.spawn).
                command=[sys.executable, "-c", AGENT, str(plan), str(token_file), str(status_file)]
                + [os.environ["STUB_KEY"]],
                policy_path=str(policy),
                ledger_dir=str(folder),
            )
            outcome = await Supervisor(options).run()
    statuses = status_file.read_text().split() if status_file.exists() else []
    token = token_file.read_text() if token_file.exists() else "(no token: the agent did not run)"
    return folder, outcome, statuses, token
