"""An upstream that answers with what it was sent: for planting secrets in answers.

`echo_upstream()` serves on 127.0.0.1 in a thread of this process. Every request
is answered with the status the path asks for (/500/... or /200/...) and a body
built from the request: the request body after a prefix the path names
(`raw`, `latin1` for a body that is not UTF-8, `space` for leading whitespace,
`big` for the body with 1.1 MiB of padding and the Authorization it received
inside the JSON, `key` for an error whose message holds that Authorization,
`keylatin1` for that Authorization in a body that is not UTF-8; `keyu`, `keyb64`,
`keyb64url`, `keyhex`, `keyHEX` for the key alone in an error, \u002d-escaped,
base64 (standard, URL-safe one byte along), hex lower or upper case; `keysse` for an
event stream with each of those forms in a delta, every event cut in two writes
mid-form; `keysplit` for the key split across two SSE deltas):
an upstream that echoes the provider key is one request away. Stopped on leaving the block.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAD = 1_100_000  # bytes: past the recorded-body limit (1 MiB)
# The forms an agent recovered the key from, by path word.
KEY_FORMS = {
    "keyu": lambda key: key.replace(b"-", b"\\u002d"),
    "keyb64": base64.b64encode,
    "keyb64url": lambda key: base64.urlsafe_b64encode(b"\xfb" + key),
    "keyhex": lambda key: key.hex().encode(),
    "keyHEX": lambda key: key.hex().upper().encode(),
}


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        parts = self.path.strip("/").split("/")
        status = int(parts[0]) if parts and parts[0].isdigit() else 200
        how = parts[1] if len(parts) > 1 else "raw"
        key = (self.headers.get("authorization") or "").encode("latin-1")
        if how == "big" and body.endswith(b"}"):
            answer = body[:-1] + b', "pad": "' + b"a" * PAD + b'", "echo": "' + key + b'"}'
        elif how == "key":
            answer = b'{"error": {"message": "bad key ' + key + b'", "type": "invalid"}}'
        elif how == "keylatin1":
            answer = b"\xff\xfe bad key " + key
        elif how in KEY_FORMS:
            form = KEY_FORMS[how](key.removeprefix(b"Bearer "))
            answer = b'{"error": {"message": "bad key ' + form + b'", "type": "invalid"}}'
        elif how in ("keysse", "keysplit"):
            self._stream(key.removeprefix(b"Bearer "), split=how == "keysplit")
            return
        else:
            prefix = {"latin1": b"\xff\xfe", "space": b" \n\t", "raw": b""}.get(how, b"")
            answer = prefix + body
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def _stream(self, key: bytes, *, split: bool) -> None:
        """An OpenAI event stream (to the connection's close) quoting the key: each form
        in a delta of its own, each event written in two pieces cut inside the form (so
        the boundary reads it in two); or, `split`, the key's halves in two deltas."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()

        def event(text: bytes) -> bytes:
            return b'data: {"choices": [{"index": 0, "delta": {"content": "' + text + b'"}}]}\n\n'

        if split:
            half = len(key) // 2
            pieces = [event(key[:half]), event(key[half:])]
        else:
            pieces = []
            for make in KEY_FORMS.values():
                whole, form = event(b"key " + make(key)), make(key)
                cut = whole.index(form) + len(form) // 2
                pieces += [whole[:cut], whole[cut:]]
        for piece in [*pieces, b"data: [DONE]\n\n"]:
            self.wfile.write(piece)
            self.wfile.flush()
            time.sleep(0.01)  # the pacing of a stream: each piece its own read at the boundary
        self.close_connection = True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        return  # quiet: the probes read the run's record, not this server's log


@contextmanager
def echo_upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="echo-upstream", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
