"""The egress allow-list: may the agent open a connection to host:port?

    rule = EgressRule.from_lists(allow, {name: base_url})  # docket.boundary.wiring
    decision = rule.check("api.example.com", 443)   # Allowed(host, port, rule) | Denied(...)

Pure: no sockets, no DNS, no clock. The forward proxy asks before it connects
and connects to `Allowed.host`, the canonical form that was checked, never to
the text the client sent.

What is allowed: each entry of `[egress] allow` ("host" allows every port,
"host:port" that port only), plus each configured provider's host and port
(the boundary's own upstreams, allowed by construction; with `allow` empty,
they are all that is allowed).

How a host is compared, one canonical form on both sides:
- Names are exact and case-insensitive. A non-ASCII name is IDNA-encoded the
  way trio encodes it for the resolver (IDNA 2008 with UTS 46 mapping), so
  "BÜCHER.de" is "xn--bcher-kva.de". One trailing dot is dropped
  ("example.com." is the same host); an empty label is not a host.
- No wildcards, no suffix matching: "example.com" does not allow
  "api.example.com", and "*.example.com" is not an entry. A wildcard hands
  every name under a domain to whoever can create one there (a shared cloud
  domain, a user-content host); list each host the agent needs.
- An IP literal matches only the same address listed as a literal, compared in
  ipaddress's canonical form ("[::1]" and "0:0::1" are one address). A name
  never matches an address or the reverse: the rule does not resolve names.
- A name that the resolver would read as an IPv4 address in another spelling
  ("127.1", "2130706433", "0x7f.0.0.1"; any name whose last label is a number)
  is refused: it is an address pretending not to be one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import idna

MAX_SHOWN = 255  # the longest host text a Denied repeats (what a client sent may be anything)

_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_NUMERIC = re.compile(r"([0-9]+|0x[0-9a-f]*)\Z")

# Denied.rule values: which part of the rule refused.
RULE_ALLOW = "egress.allow"  # a well-formed host and port that nothing lists
RULE_HOST = "egress.host"  # not a host name or an address we will connect to
RULE_PORT = "egress.port"  # not a TCP port


@dataclass(frozen=True)
class Allowed:
    host: str  # canonical: what to connect to
    port: int
    rule: str  # the entry that allowed it: "egress.allow[2]" or "provider.openai"


@dataclass(frozen=True)
class Denied:
    host: str  # canonical when it could be made so, else the client's text (cut short)
    port: int
    rule: str  # RULE_ALLOW, RULE_HOST or RULE_PORT
    reason: str


@dataclass(frozen=True)
class Entry:
    host: str  # canonical
    port: int | None  # None: every port
    rule: str

    def shown(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def _ip_literal(text: str) -> str | None:
    """The compressed form of an IP address, or None when `text` is a name instead."""
    try:
        return ipaddress.ip_address(text).compressed
    except ValueError:
        return None  # not an address: the caller reads it as a host name


def canonical_host(text: str) -> str:
    """The one form a host is compared and connected in; ValueError saying why
    `text` is not a host. Brackets around an IPv6 literal are optional."""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        try:
            return ipaddress.IPv6Address(text).compressed
        except ValueError:
            raise ValueError("not an IPv6 address inside brackets") from None
    address = _ip_literal(text)
    if address is not None:
        return address
    if text.isascii():
        name = text.lower()
    else:
        try:
            name = idna.encode(text, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise ValueError(f"not a valid international host name ({exc})") from None
    if name.endswith("."):
        name = name[:-1]
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError("not a valid host name")
    if _NUMERIC.match(labels[-1]):
        raise ValueError("a number in another spelling, not an IPv4 address or a name")
    return name


def parse_entry(text: str, rule: str) -> Entry:
    """One `[egress] allow` entry: "host", "host:port", "[v6]" or "[v6]:port";
    ValueError naming what is wrong."""
    host, port = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"{rule}: {text!r}: unclosed [")
        host, rest = text[: end + 1], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{rule}: {text!r}: expected :port after ]")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if "*" in host:
        raise ValueError(f"{rule}: {text!r}: wildcards are not supported; list each host")
    try:
        canonical = canonical_host(host)
    except ValueError as exc:
        raise ValueError(f"{rule}: {text!r}: {exc}") from None
    if port is None:
        return Entry(canonical, None, rule)
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{rule}: {text!r}: the port must be 1-65535")
    return Entry(canonical, int(port), rule)


def provider_entry(name: str, base_url: str) -> Entry:
    """A provider's base URL as an entry for its host and (default or given) port."""
    parts = urlsplit(base_url)
    rule = f"provider.{name}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{rule}: not an http(s) URL: {base_url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return Entry(canonical_host(parts.hostname), port, rule)
    except ValueError as exc:
        raise ValueError(f"{rule}: {base_url!r}: {exc}") from None


class EgressRule:
    """The allow-list, indexed by canonical host."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.entries = tuple(entries)
        self._by_host: dict[str, list[Entry]] = {}
        for entry in self.entries:
            self._by_host.setdefault(entry.host, []).append(entry)

    @classmethod
    def from_lists(cls, allow: Iterable[str], providers: Mapping[str, str]) -> EgressRule:
        entries = [parse_entry(text, f"egress.allow[{i}]") for i, text in enumerate(allow)]
        entries += [provider_entry(name, url) for name, url in providers.items()]
        return cls(entries)

    def check(self, host: str, port: int) -> Allowed | Denied:
        """Whether a connection to host:port is allowed; never raises."""
        if type(port) is not int or not 1 <= port <= 65535:
            return Denied(host[:MAX_SHOWN], 0, RULE_PORT, f"{port!r} is not a TCP port")
        try:
            canonical = canonical_host(host)
        except ValueError as exc:
            return Denied(host[:MAX_SHOWN], port, RULE_HOST, f"{host[:80]!r}: {exc}")
        for entry in self._by_host.get(canonical, ()):
            if entry.port is None or entry.port == port:
                return Allowed(canonical, port, entry.rule)
        return Denied(canonical, port, RULE_ALLOW, self._why_not(canonical, port))

    def _why_not(self, host: str, port: int) -> str:
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        listed = [entry.shown() for entry in self._by_host.get(host, ())]
        if listed:
            return f"{shown}: only {', '.join(listed)} is allowed for this host"
        return f"{shown} is not in [egress] allow or the configured providers"
