"""Family `secrets`: plant secrets in every place a request can carry one, then
search every byte under the run folder for them.

A real `docket run` with `record_bodies = true` is sent, on raw sockets, requests
that each carry one secret of their own: credential headers, cookies, userinfo,
query parameters, JSON bodies (any depth, leading whitespace, over 1 MiB, not
UTF-8, chunked across a boundary), CONNECT and absolute-form proxy targets, and
malformed ones; and answers from an upstream that echoes what it got
(chaos/attack/echo.py: not UTF-8, leading whitespace, over 1 MiB, the provider
key in an error). The run token (a secret the boundary knows) is planted in
bodies and paths too, and the provider key, which only the supervisor holds, is
searched for as well. After the run ends, every file under the run folder, and
what the run printed, is searched for each secret raw, base64 (any alignment,
standard and URL-safe), percent-encoded, JSON-escaped and hex (`find_secret`).
An upstream that echoes the provider key \\u002d-escaped, base64, hex, in a stream
cut mid-form, or split across two stream events: no answer may hand the agent the
key in any of those forms, nor in the text its stream's deltas join into.
Good: a plant found nowhere. Two more checks count as probes: no answer hands the agent
the provider key (an upstream may echo it), and no file under the run folder is
readable by group or other. The figure that must be 0: bytes of secrets found. A
canary (a model name, which the record keeps by design) must be found, so a clean
search is not a blind one.
"""

from __future__ import annotations

import base64
import json
import secrets as random_secrets
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, quote_plus

from chaos.attack import Figures
from chaos.attack.echo import echo_upstream
from chaos.attack.http import ROUTE, RequestProbe, exchange, request
from chaos.attack.rig import PROVIDER_KEY, live_run

RECORD_BODIES = "[ledger]\nrecord_bodies = true\n"
# Routes to the echo upstream: echo_STATUS_HOW, its base URL ending /STATUS/HOW.
ECHO_KINDS = {"latin1": "not UTF-8", "space": "with leading whitespace", "big": "over 1 MiB",
              "key": "holding the Authorization it got",
              "keylatin1": "not UTF-8, holding the Authorization it got"}  # fmt: skip
ECHO_ROUTES = [
    f"echo_{status}_{how}" for status in (200, 500) for how in ("latin1", "space", "big")
]
ECHO_ROUTES += ["echo_401_key", "echo_500_keylatin1"]
# The key echoed encoded, and cut across stream events.
KEY_FORM_ROUTES = [f"echo_401_{how}" for how in ("keyu", "keyb64", "keyb64url", "keyhex", "keyHEX")]
KEY_STREAM_ROUTES = ["echo_200_keysse", "echo_200_keysplit"]
ECHO_ROUTES += KEY_FORM_ROUTES + KEY_STREAM_ROUTES


def encodings(secret: bytes) -> dict[str, list[bytes]]:
    """The forms a recorder could store `secret` in, each a byte string to look for."""
    forms: dict[str, list[bytes]] = {
        "raw": [secret], "base64": [], "percent": [], "json": [], "hex": [],
    }  # fmt: skip
    forms["hex"] += [secret.hex().encode(), secret.hex().upper().encode()]
    for pad in range(3):  # a base64 run is aligned to 3-byte groups: try each start
        encoded = base64.b64encode(b"\0" * pad + secret)
        start, end = -(-pad // 3) * 4, (pad + len(secret)) // 3 * 4
        if end - start >= 8:
            part = encoded[start:end]
            forms["base64"] += [part, part.translate(bytes.maketrans(b"+/", b"-_"))]
    text = secret.decode("latin-1")
    forms["percent"] += [quote(text, safe="").encode(), quote_plus(text, safe="").encode(),
                         "".join(f"%{b:02X}" for b in secret).encode(),
                         "".join(f"%{b:02x}" for b in secret).encode()]  # fmt: skip
    forms["json"] += [json.dumps(text)[1:-1].encode(),
                      "".join(f"\\u{b:04x}" for b in secret).encode(),
                      "".join(f"\\u{b:04X}" for b in secret).encode(),
                      text.replace("-", "\\u002d").encode()]  # fmt: skip
    return {form: sorted(set(found), key=len, reverse=True) for form, found in forms.items()}


def find_secret(data: bytes, secret: bytes) -> list[tuple[str, int, int]]:
    """(form, offset, length) of each place `secret` occurs in `data`, in any encoding
    (a place counted once, by its first form: a token's percent form is often its raw one)."""
    hits = []
    seen: set[int] = set()
    for form, needles in encodings(secret).items():
        for needle in needles:
            at = data.find(needle)
            while at != -1:
                if at not in seen:
                    seen.add(at)
                    hits.append((form, at, len(needle)))
                at = data.find(needle, at + 1)
    return hits


@dataclass
class Plant:
    where: str  # what the request carried and how
    secret: str
    data: bytes  # the bytes sent
    streamed: bool = False  # the answer is an event stream: read to its end


def fresh(n: int) -> str:
    return f"sk-atk{n:02d}-{random_secrets.token_hex(12)}"


def plants(token: str, port: int) -> list[Plant]:
    out: list[Plant] = []
    basic = base64.b64encode(f"docket:{token}".encode()).decode()
    chat = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
    }

    def add(where: str, make) -> None:
        s = fresh(len(out))
        out.append(Plant(where, s, make(s)))

    def body(obj: dict) -> bytes:
        return json.dumps(obj).encode()

    def model(extra_headers=(), target=ROUTE, payload=None, **kw) -> bytes:
        return request(token, payload if payload is not None else body(chat), target=target,
                       headers=[h.encode() for h in extra_headers], **kw)  # fmt: skip

    add("header x-api-key", lambda s: model([f"X-Api-Key: {s}"]))
    add("header api-key", lambda s: model([f"Api-Key: {s}"]))
    add("header cookie", lambda s: model([f"Cookie: theme=dark; session={s}"]))
    add("header x-session-token", lambda s: model([f"X-Session-Token: {s}"]))
    add(
        "header proxy-authorization",
        lambda s: model(
            ["Proxy-Authorization: Basic " + base64.b64encode(f"u:{s}".encode()).decode()]
        ),
    )
    add(
        "header AUTHORIZATION, odd case and spaces",
        lambda s: request("", body(chat), headers=[f"AUTHORIZATION:   Bearer {s}  ".encode()]),
    )
    add("second authorization header", lambda s: model([f"Authorization: Bearer {s}"]))
    add("query api_key", lambda s: model(target=ROUTE + f"?api_key={s}".encode()))
    add("query key and sig", lambda s: model(target=ROUTE + f"?key={s}&sig={s}".encode()))
    add("query, percent-encoded name", lambda s: model(target=ROUTE + f"?api%5Fkey={s}".encode()))
    add(
        "query, percent-encoded value",
        lambda s: model(target=ROUTE + f"?token={quote(s, safe='').replace('-', '%2D')}".encode()),
    )
    add(
        "userinfo, absolute form to the boundary",
        lambda s: model(target=f"http://u:{s}@127.0.0.1:{port}".encode() + ROUTE),
    )
    add(
        "userinfo, absolute form elsewhere",
        lambda s: (
            f"GET http://u:{s}@example.com/x HTTP/1.1\r\nHost: example.com\r\n"
            f"Proxy-Authorization: Basic {basic}\r\n\r\n"
        ).encode(),
    )
    add(
        "userinfo, malformed absolute form",
        lambda s: (
            f"GET http://u:{s}@[::1/x HTTP/1.1\r\nHost: x\r\n"
            f"Proxy-Authorization: Basic {basic}\r\n\r\n"
        ).encode(),
    )
    add(
        "userinfo, CONNECT",
        lambda s: (
            f"CONNECT u:{s}@example.com:443 HTTP/1.1\r\nHost: x\r\n"
            f"Proxy-Authorization: Basic {basic}\r\n\r\n"
        ).encode(),
    )
    add(
        "userinfo, malformed CONNECT",
        lambda s: (
            f"CONNECT u:{s}@[::1:443 HTTP/1.1\r\nHost: x\r\n"
            f"Proxy-Authorization: Basic {basic}\r\n\r\n"
        ).encode(),
    )
    add(
        "userinfo, CONNECT without the token",
        lambda s: (f"CONNECT u:{s}@example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n").encode(),
    )
    add(
        "query, absolute form elsewhere",
        lambda s: (
            f"GET http://example.com/x?access_token={s} HTTP/1.1\r\nHost: example.com\r\n"
            f"Proxy-Authorization: Basic {basic}\r\n\r\n"
        ).encode(),
    )
    add("body api_key", lambda s: model(payload=body({**chat, "api_key": s})))
    add(
        "body password 40 deep",
        lambda s: model(payload=body({**chat, "metadata": _nest({"password": s}, 40)})),
    )
    add(
        "body with leading whitespace",
        lambda s: model(payload=b"  \n\t" + body({**chat, "api_key": s})),
    )
    add(
        "body over 1 MiB",
        lambda s: model(payload=body({"api_key": s, **chat, "pad": "a" * (1 << 20)})),
    )
    add(
        "body not UTF-8",
        lambda s: model(payload=body({**chat, "api_key": s}).replace(b'"hi"', b'"h\xe9\xff"')),
    )
    add(
        "body secret in a \\u-escaped key",
        lambda s: model(
            payload=body({**chat, "x": 1}).replace(b'"x": 1', f'"api\\u005fkey": "{s}"'.encode())
        ),
    )
    add(
        "body, chunked, split mid-secret",
        lambda s: model(
            payload=_chunked(body({**chat, "api_key": s}), split_in=s),
            length=False,
            extra_headers=["Transfer-Encoding: chunked"],
        ),
    )
    add("body, stream true", lambda s: model(payload=body({**chat, "stream": True, "token": s})))
    add(
        "body, JSON array with a secret",
        lambda s: model(payload=b'[{"api_key": "' + s.encode() + b'"}]'),
    )
    add(
        "body, form-encoded",
        lambda s: model(
            payload=f"api_key={s}".encode(), ctype=b"application/x-www-form-urlencoded"
        ),
    )
    add(
        "malformed request line with a query secret",
        lambda s: (f"GET /openai/v1/models?api_key={s} HTTP/9.9\r\nHost: x\r\n\r\n").encode(),
    )
    # Answers: an upstream (chaos/attack/echo.py) that sends the request body back; the
    # route's base URL path says how (ECHO_ROUTES), the boundary forwards to it as is.
    for route in ECHO_ROUTES:
        status, how = route.split("_")[1:]
        if not how.startswith("key"):
            add(f"answer {status} {ECHO_KINDS[how]}, echoing api_key", lambda s, r=route: model(
                target=f"/{r}/v1/chat/completions".encode(),
                payload=body({**chat, "api_key": s})))  # fmt: skip
    # The run token itself (the boundary knows it) in places other than the auth header.
    tok = lambda where, make: out.append(Plant(where, token, make()))  # noqa: E731
    tok(
        "run token in a message",
        lambda: model(
            payload=body(
                {**chat, "messages": [{"role": "user", "content": f"my token is {token}"}]}
            )
        ),
    )
    tok("run token in a non-UTF-8 body", lambda: model(payload=b"\xff\xfe" + token.encode()))
    tok("run token in the path", lambda: model(target=b"/openai/v1/models/" + token.encode()))
    tok("run token as a route name", lambda: model(target=b"/" + token.encode() + b"/v1/x"))
    tok("run token in a query", lambda: model(target=ROUTE + b"?q=" + token.encode()))
    # The provider key: only the supervisor holds it; an upstream may echo it back.
    key = lambda where, make: out.append(Plant(where, PROVIDER_KEY, make()))  # noqa: E731
    key(
        "provider key echoed in an error body",
        lambda: model(target=b"/echo_401_key/v1/chat/completions"),
    )
    key(
        "provider key echoed in a non-UTF-8 error body",
        lambda: model(target=b"/echo_500_keylatin1/v1/chat/completions"),
    )
    for route in KEY_FORM_ROUTES:
        how = route.split("_")[2]
        key(f"provider key echoed as {how}", lambda r=route: model(
            target=f"/{r}/v1/chat/completions".encode()))  # fmt: skip
    for route in KEY_STREAM_ROUTES:
        how = route.split("_")[2]
        out.append(Plant(f"provider key in a stream, {how}", PROVIDER_KEY, model(
            target=f"/{route}/v1/chat/completions".encode(),
            payload=body({**chat, "stream": True})), streamed=True))  # fmt: skip
    return out


def stream_exchange(port: int, data: bytes, timeout: float = 15.0) -> bytes:
    """Send a request whose answer is a chunked event stream; the answer's head and its
    body, de-chunked, once the last chunk came (or the connection closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        got = b""
        deadline = time.monotonic() + timeout
        while not got.endswith(b"0\r\n\r\n") and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    body = b""
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        body, rest = body + rest[:n], rest[n + 2 :]
    return head + b"\r\n\r\n" + body


def joined_deltas(answer: bytes) -> bytes:
    """What an agent reads out of an event stream: every delta's text, joined."""
    texts = []
    for line in answer.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            event = json.loads(line[len(b"data: ") :])
        except ValueError:
            continue
        for choice in event.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if isinstance(content, str):
                texts.append(content)
    return "".join(texts).encode()


def _nest(inner: dict, depth: int) -> dict:
    for n in range(depth):
        inner = {f"l{n}": inner}
    return inner


def _chunked(data: bytes, split_in: str) -> bytes:
    cut = data.index(split_in.encode()) + len(split_in) // 2
    parts = [data[:cut], data[cut:]]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def echo_routes(url: str) -> dict[str, str]:
    return {route: f"{url}/{route.split('_')[1]}/{route.split('_')[2]}" for route in ECHO_ROUTES}


def loose_files(run_dir: Path) -> list[str]:
    """Files under the run folder that a group or other user may read."""
    return sorted(
        str(p.relative_to(run_dir))
        for p in run_dir.rglob("*")
        if p.is_file() and p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    )


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("secrets")
    windows: list[tuple[int, int, int]] = []  # (start, end, plant): ledger bytes written meanwhile
    relayed: list[str] = []  # plants whose answer handed the agent the provider key
    with (
        echo_upstream() as echo,
        live_run(folder / "secrets", policy_extra=RECORD_BODIES, more=echo_routes(echo)) as live,
    ):
        port = live.port
        ledger = live.run_dir / "ledger.jsonl"
        planted = plants(live.token, port)
        # The canary: a value the record keeps by design (the model asked for), which the
        # search must find in the ledger, so a clean search is not a blind one.
        canary = fresh(99)
        exchange(port, RequestProbe("canary", request(live.token, json.dumps(
            {"model": canary, "messages": [], "max_tokens": 1}).encode())))  # fmt: skip
        for n, plant in enumerate(planted):
            start = ledger.stat().st_size
            if plant.streamed:
                answer = stream_exchange(port, plant.data)
            else:
                _, answer = exchange(port, RequestProbe(plant.where, plant.data))
            # Each event is synced before its answer: what the ledger grew by is this plant's.
            windows.append((start, ledger.stat().st_size, n))
            key_bytes = PROVIDER_KEY.encode()
            joined = joined_deltas(answer)
            # The key's second half alone is a leak too (its first is the public prefix).
            if any(find_secret(text, part) for text in (answer, joined)
                   for part in (key_bytes, key_bytes[len(key_bytes) // 2 :])):  # fmt: skip
                relayed.append(plant.where)
    files = {str(p.relative_to(live.run_dir)): p.read_bytes()
             for p in sorted(live.run_dir.rglob("*")) if p.is_file()}  # fmt: skip
    if not find_secret(files.get("ledger.jsonl", b""), canary.encode()):
        raise RuntimeError(
            "the canary (a model name the ledger records) was not found: the search is blind"
        )
    files["(docket run's stderr)"] = live.result["stderr"].encode()
    files["(docket run's stdout)"] = live.result["stdout"].encode()
    owner = {
        p.secret: n for n, p in enumerate(planted) if p.secret not in (live.token, PROVIDER_KEY)
    }
    # The key's second half alone counts too: an upstream can split it across events.
    shared = {live.token: "the run token", PROVIDER_KEY: "the provider key",
              PROVIDER_KEY[len(PROVIDER_KEY) // 2 :]: "the provider key's second half"}  # fmt: skip
    blame: dict[object, list[str]] = {}
    found_bytes = 0
    for secret in [*owner, *shared]:
        for name, data in files.items():
            for form, at, length in find_secret(data, secret.encode()):
                found_bytes += length
                who = owner.get(secret)
                if name == "ledger.jsonl":
                    inside = [n for start, end, n in windows if start <= at < end]
                    who = inside[0] if inside and (secret in shared or who is None) else who
                key = who if who is not None else shared[secret]
                blame.setdefault(key, []).append(f"{shared.get(secret, 'its secret')} in "
                                                 f"{name} as {form} at byte {at}")  # fmt: skip
    for n, plant in enumerate(planted):
        where = blame.get(n)
        preview = plant.data[:140].replace(plant.secret.encode(), b"<SECRET>")
        figures.add(not where, f"secrets {plant.where!r}: sent {preview!r} to the boundary "
                               f"(record_bodies on); found {'; '.join(where or [])[:300]}")  # fmt: skip
    for what in shared.values():  # found outside every plant's window: a leak of its own
        where = blame.get(what)
        figures.add(not where, f"secrets {what}: found {'; '.join(where or [])[:300]}")
    # Not on disk but in the agent's hands: an upstream that echoes the key must not hand it over.
    figures.add(
        not relayed, f"secrets provider key relayed to the agent in the answer to: {relayed}"
    )
    loose = loose_files(live.run_dir)  # 0600 whatever the umask: others must not read the record
    figures.add(not loose, f"secrets run folder files readable by group or other: {loose}")
    figures.extra = {
        "bytes_of_secrets_found": found_bytes,
        "files_searched": len(files),
        "bytes_searched": sum(map(len, files.values())),
        "files_readable_by_group_or_other": loose,
        "provider_key_relayed_to_agent": len(relayed),
        "run_exit": live.result.get("exit"),
    }
    return figures
