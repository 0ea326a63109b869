"""Request headers on their way upstream: the client's token out, the real key in.

The agent holds a per-run token, never a provider key. The boundary checks the
token the client presented and sends the provider its own key in the provider's
own header. Names and values may be bytes (as h11 gives them) or str.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

Headers = list[tuple[bytes, bytes]]

# RFC 9110 section 7.6.1: meaningful for one connection only, never forwarded.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
# Every header a client may carry a credential in; none of them ever goes upstream.
# A cookie is scoped to the host it was set for (the boundary), never the provider's.
CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key", b"api-key", b"cookie"})
# Also never sent as the client sent them: set anew by the boundary.
_NEVER_FORWARDED = (
    HOP_BY_HOP | CREDENTIAL_HEADERS | {b"host", b"content-length", b"accept-encoding"}
)


def _name(name: bytes | str) -> bytes:
    # `type() is`, not isinstance: once per header on the hot path, and measurably
    # faster. The checker narrows only the `is bytes` branch (a bytes subclass could
    # reach the other); h11 and the tests give exactly bytes or str.
    return (name if type(name) is bytes else name.encode("latin-1")).lower()  # type: ignore[union-attr]


def _value(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


def header_value(headers: Iterable[tuple[bytes, bytes]], wanted: bytes) -> bytes | None:
    """The first value of the header named `wanted` (lowercase), or None."""
    for name, value in headers:
        if _name(name) == wanted:
            return _value(value)
    return None


def presented_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The credential the client sent: Authorization: Bearer, else x-api-key, else api-key."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        key = _name(name)
        if key in CREDENTIAL_HEADERS and key not in found:
            found[key] = _value(value).strip()
    auth = found.get(b"authorization")
    if auth is not None:
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and token.strip():
            return token.strip().decode("latin-1")
    for key in (b"x-api-key", b"api-key"):
        api_key = found.get(key)
        if api_key:
            return api_key.decode("latin-1")
    return None


def token_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison of the client's token with the run's."""
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode("utf-8"), expected.encode("utf-8"))


def outgoing_headers(
    headers: Iterable[tuple[bytes, bytes]],
    *,
    credential: tuple[bytes, bytes],
    upstream_host: str,
    content_length: int | None,
) -> Headers:
    """The client's headers as they go upstream.

    Dropped: hop-by-hop headers and any the Connection header names, Proxy-*,
    every client credential, the client's Host and Content-Length (set anew),
    and x-docket-* (meant for the boundary). Accept-Encoding becomes identity,
    because the boundary must read usage out of the response body.
    """
    pairs = [(_name(name), value) for name, value in headers]
    named_by_connection: set[bytes] = set()
    for key, value in pairs:
        if key == b"connection":
            named_by_connection.update(
                t.strip().lower() for t in _value(value).split(b",") if t.strip()
            )
    out: Headers = [(b"host", upstream_host.encode("ascii"))]
    for key, value in pairs:
        if (
            key in _NEVER_FORWARDED
            or key in named_by_connection
            or key.startswith((b"proxy-", b"x-docket-"))
        ):
            continue
        out.append((key, _value(value)))
    cred_name, cred_value = credential
    if any(c in cred_value for c in b"\r\n\0"):
        raise ValueError("the provider key contains a control character")
    out.append((cred_name, cred_value))
    out.append((b"accept-encoding", b"identity"))
    if content_length is not None:
        out.append((b"content-length", str(content_length).encode("ascii")))
    return out
