"""Is a Host header's value a valid one? Sans-IO, for the server's every request.

RFC 9112 3.2: a server MUST answer 400 to a request whose Host field value is
invalid. The value is RFC 9110 7.2's `uri-host [ ":" port ]`, uri-host being
RFC 3986 3.2.2's `host`: an IP-literal in brackets (IPv6 or IPvFuture), an IPv4
address, or a reg-name (unreserved characters, sub-delims, %XX escapes; an IPv4
address is one of those too). A reg-name may be empty: a client whose target has
no authority sends an empty Host. h11 already refuses a missing or repeated Host.

Every request pays for it, so the common case (a name or an IPv4 address, a
port) is one small regular expression, plain_host, about 0.2 us; the whole
grammar (0.4 us) and an IPv6 literal's own check run only when that fails.
"""

from __future__ import annotations

import ipaddress
import re

_REG_NAME = rb"(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*"
_IP_LITERAL = rb"\[(?:[0-9A-Fa-f:.]+|[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+)\]"
_HOST = re.compile(rb"(?:(%s)|%s)(?::[0-9]*)?" % (_IP_LITERAL, _REG_NAME))
# A subset of the valid values, the usual one: match it first (server.py inlines it).
plain_host = re.compile(rb"[A-Za-z0-9.\-]*(?::[0-9]*)?").fullmatch


def valid_host(value: bytes) -> bool:
    """Whether `value` is a Host header's valid value (RFC 9110 7.2, RFC 3986 3.2.2)."""
    if plain_host(value) is not None:
        return True
    match = _HOST.fullmatch(value)
    if match is None:
        return False
    literal = match.group(1)
    if literal is None or literal[1:2] in (b"v", b"V"):
        return True
    # The character class lets through things like [:::] or [1.2.3.4]: an IPv6
    # address is checked by its own grammar (rare enough to pay for it).
    try:
        ipaddress.IPv6Address(literal[1:-1].decode("ascii"))
    except ValueError:
        return False
    return True
