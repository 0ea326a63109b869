"""Recorded bodies: the event fields that record a request's or an answer's bytes.

With the policy's `record_bodies`, model.request carries the request body and
the closing event the response body, each cut to RECORDED_BODY_BYTES and with
the credentials taken out (`recorded_body`). Pure: app.py records the request
body, forward.ModelCall the response body (it reads RECORDED_BODY_BYTES from
here, so the cap is one value). Split from forward.py, which still re-exports
recorded_body.
"""

from __future__ import annotations

import base64
import json
import re

from docket.guards.redact import MARKER

# With record_bodies, each body is recorded up to this many bytes (and flagged if cut):
# one event must stay far below the ledger's line limit and its byte ceiling.
RECORDED_BODY_BYTES = 1 << 20

# JSON keys whose values are credentials (compared lower-case, "-" read as "_").
# Narrower than the header rule on purpose: "max_tokens" and "prompt_tokens" are counts.
_SECRET_KEY = re.compile(
    r"(?:^|_)(?:api_?key|apikey|secret|password|passwd|authorization|cookie|credentials?"
    r"|private_key)$|^(?:access|refresh|id|auth|bearer|session|api)_token$|^token$"
)


def _redact_json(value: object) -> tuple[object, bool]:
    """The value with every credential-named member's value replaced by the marker."""
    if isinstance(value, dict):
        changed = False
        out = {}
        for key, member in value.items():
            if _SECRET_KEY.search(key.lower().replace("-", "_")) and member not in (None, ""):
                out[key], changed = MARKER, True
            else:
                out[key], inner = _redact_json(member)
                changed = changed or inner
        return out, changed
    if isinstance(value, list):
        pairs = [_redact_json(v) for v in value]
        return [v for v, _ in pairs], any(c for _, c in pairs)
    return value, False


def recorded_body(prefix: str, data: bytes, secrets, *, cut: bool = False) -> dict:
    """The event fields recording one body: `<prefix>_body` as text when it is UTF-8
    (JSON or SSE), else `<prefix>_body_base64`, with `<prefix>_body_truncated` when
    cut to RECORDED_BODY_BYTES and `<prefix>_body_redacted` when a secret was taken out.

    Redaction: in a whole JSON body, the values of credential-named members; in any
    body, every occurrence of a secret the boundary knows (the run token, the
    provider keys). The request's size and hash (in model.request) stay those of
    the bytes as sent.
    """
    if len(data) > RECORDED_BODY_BYTES:
        data, cut = data[:RECORDED_BODY_BYTES], True
    fields: dict = {}
    redacted = False
    text = _utf8(data, cut)
    if text is None:
        for secret in secrets:
            raw = secret.encode("utf-8")
            if raw in data:
                data, redacted = data.replace(raw, MARKER.encode()), True
        fields[f"{prefix}_body_base64"] = base64.b64encode(data).decode("ascii")
    else:
        if not cut and text[:1] in ("{", "["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None  # recorded as the text it is
            if parsed is not None:
                parsed, changed = _redact_json(parsed)
                if changed:
                    text = json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))
                    redacted = True
        for secret in secrets:
            if secret in text:
                text, redacted = text.replace(secret, MARKER), True
        fields[f"{prefix}_body"] = text
    if cut:
        fields[f"{prefix}_body_truncated"] = True
    if redacted:
        fields[f"{prefix}_body_redacted"] = True
    return fields


def _utf8(data: bytes, cut: bool) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A cut can split the last character; anything else is not text.
        if cut and exc.start >= len(data) - 3:
            return data[: exc.start].decode("utf-8", "strict")
        return None
