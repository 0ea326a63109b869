"""The policy: docket.toml read into frozen dataclasses, every key checked.

Every key Docket will ever read is declared here with its default, so an
unknown key is always a mistake (named, with the nearest known key) and a bad
value is always refused with its key path and the reason, never a traceback.
The resolved policy has a stable digest that the receipt carries, so a reader
can tell which rules a run was held to.

Durations are seconds: a number, or a string with a unit ("500ms", "30s",
"5m", "1h"). Sizes are bytes: an integer, or a string with a unit ("16MiB",
"1GB"). TOML has no null, so a key whose default is "none" is simply left out.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from decimal import Decimal
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from docket.cache.config import CachePolicy, cache_policy
from docket.errors import InputError
from docket.inputs import parse_duration, read_text

MiB = 1024 * 1024
NANO = 10**9  # nano-USD per USD: every money figure is an integer count of these

ON_BREACH = ("deny", "kill")
ON_UNPRICED = ("deny", "allow")
BUDGET_MODES = ("usd", "quota")
PROVIDER_KINDS = ("openai", "anthropic")

# kind -> (official base URL, environment variable holding the real key)
PROVIDER_DEFAULTS = {
    "openai": ("https://api.openai.com", "OPENAI_API_KEY"),
    "anthropic": ("https://api.anthropic.com", "ANTHROPIC_API_KEY"),
}


class PolicyError(InputError):
    """A policy file that cannot be used: malformed, an unknown key or a bad value."""


# ---------------------------------------------------------------- the policy


@dataclass(frozen=True)
class LedgerPolicy:
    max_ledger_bytes: int = 256 * MiB
    max_events: int | None = None
    fail_fast_evidence: bool = False
    min_free_bytes: int = 16 * MiB
    record_bodies: bool = False
    # Where the receipt goes when the run's folder cannot take it (a full or
    # read-only volume); it is also printed on stderr as one JSON line.
    fallback_dir: str | None = None


@dataclass(frozen=True)
class CapsPolicy:
    max_usd: Decimal | None = None
    max_tokens: int | None = None
    max_model_calls: int | None = None
    max_wall_seconds: float | None = None
    warn_at: float = 0.8
    on_breach: str = "deny"
    on_unpriced: str = "deny"
    budget_mode: str = "usd"
    default_max_output_tokens: int = 32768

    @property
    def max_nusd(self) -> int | None:
        """max_usd in nano-USD (exact: the value has at most 9 decimals)."""
        return None if self.max_usd is None else int(self.max_usd * NANO)

    def limits_dict(self) -> dict:
        """The caps as JSON-ready data for session.start and the receipt (USD as a string)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class ProviderPolicy:
    name: str
    kind: str
    base_url: str
    key_env: str


@dataclass(frozen=True)
class BoundaryPolicy:
    host: str = "127.0.0.1"
    port: int = 0
    upstream_timeout: float = 300.0
    connect_timeout: float = 10.0


@dataclass(frozen=True)
class ResiliencePolicy:
    breaker_threshold: int = 5
    breaker_cooldown_seconds: float = 30.0
    breaker_max_cooldown_seconds: float = 300.0
    breaker_failure_rate: float = 0.5
    breaker_min_calls: int = 20
    max_calls_per_second: float | None = None
    max_calls_per_minute: int | None = None
    max_concurrent_upstream: int | None = None
    max_queue: int | None = None


@dataclass(frozen=True)
class EgressPolicy:
    # Empty means: only the configured providers' hosts.
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class SecretsPolicy:
    # More environment variable names the agent never sees, beside every provider's
    # key_env and the well-known provider key names (docket.guards.keys.WELL_KNOWN_KEY_ENV).
    drop_env: tuple[str, ...] = ()


def default_providers() -> Mapping[str, ProviderPolicy]:
    return MappingProxyType(
        {
            kind: ProviderPolicy(name=kind, kind=kind, base_url=url, key_env=env)
            for kind, (url, env) in PROVIDER_DEFAULTS.items()
        }
    )


@dataclass(frozen=True)
class Policy:
    ledger: LedgerPolicy = field(default_factory=LedgerPolicy)
    caps: CapsPolicy = field(default_factory=CapsPolicy)
    # A read-only mapping (name -> provider), so not hashable: left out of the hash.
    providers: Mapping[str, ProviderPolicy] = field(default_factory=default_providers, hash=False)
    boundary: BoundaryPolicy = field(default_factory=BoundaryPolicy)
    resilience: ResiliencePolicy = field(default_factory=ResiliencePolicy)
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    secrets: SecretsPolicy = field(default_factory=SecretsPolicy)
    cache: CachePolicy = field(default_factory=CachePolicy)  # docket/cache/config.py
    # Where it came from; not part of the digest (the same rules from two files are the same policy).
    source: str = field(default="defaults", compare=False)

    def provider(self, name: str) -> ProviderPolicy | None:
        return self.providers.get(name)

    def ledger_limits(self):
        """The [ledger] ceilings as the writer takes them (docket.ledger.writer.LedgerLimits).

        record_bodies is not the writer's to enforce (nor is min_free_bytes at
        start; the writer records evidence.low_disk when the volume drops below
        it); read them from self.ledger.
        """
        from docket.ledger.writer import LedgerLimits

        return LedgerLimits(
            max_ledger_bytes=self.ledger.max_ledger_bytes,
            max_events=self.ledger.max_events,
            fail_fast_evidence=self.ledger.fail_fast_evidence,
            min_free_bytes=self.ledger.min_free_bytes,
        )

    def to_dict(self) -> dict:
        """The resolved policy as JSON-ready data (decimals as strings)."""

        def section(obj) -> dict:
            return {f.name: _jsonable(getattr(obj, f.name)) for f in fields(obj)}

        out = {
            "ledger": section(self.ledger),
            "caps": section(self.caps),
            "providers": {name: section(p) for name, p in self.providers.items()},
            "boundary": section(self.boundary),
            "resilience": section(self.resilience),
            "egress": section(self.egress),
            "secrets": section(self.secrets),
        }
        if self.cache.enabled:  # only then: a policy without it keeps its digest
            out["cache"] = self.cache.to_dict()
        return out

    def digest(self) -> str:
        """`sha256:<hex>` of a canonical JSON of the resolved policy (the receipt's policy_digest)."""
        canonical = json.dumps(
            {"format": "docket-policy-1", "policy": self.to_dict()},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
        return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


# ---------------------------------------------------------------- loading


def load_policy(path: str | os.PathLike | None) -> Policy:
    """The policy in a docket.toml, or the defaults when path is None."""
    if path is None:
        return Policy()
    text = read_text(path, "policy")
    source = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message ends with "(at line N, column M)": the line is named.
        raise PolicyError(f"policy {source}: malformed TOML: {exc}") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables by recursion: thousands of
        # levels exhaust the stack before any key is read. No policy nests more than 3.
        raise PolicyError(f"policy {source}: malformed TOML: nested too deeply") from None
    return policy_from_dict(data, source=source)


def policy_from_dict(data: dict, source: str = "<dict>") -> Policy:
    """Check and resolve parsed TOML (or any dict of the same shape) into a Policy."""
    c = _Checker(source)
    c.table(
        data,
        "",
        # explain: read by docket.reading.thresholds (what explain names, not what a run does)
        (
            "ledger",
            "caps",
            "providers",
            "boundary",
            "resilience",
            "egress",
            "secrets",
            "explain",
            "cache",
        ),
    )
    ledger = _ledger(c, c.section(data, "ledger"))
    caps = _caps(c, c.section(data, "caps"))
    providers = _providers(c, data.get("providers"))
    boundary = _boundary(c, c.section(data, "boundary"))
    resilience = _resilience(c, c.section(data, "resilience"))
    egress = _egress(c, c.section(data, "egress"))
    secrets = _secrets(c, c.section(data, "secrets"))
    cache = cache_policy(
        c.section(data, "cache"),
        c.fail,
        seconds=lambda v: c.duration({"ttl": v}, "cache.ttl", None),
        size=lambda v: c.size({"max_bytes": v}, "cache.max_bytes", 0, 1024),
    )
    return Policy(
        ledger=ledger,
        caps=caps,
        providers=providers,
        boundary=boundary,
        resilience=resilience,
        egress=egress,
        secrets=secrets,
        cache=cache,
        source=source,
    )


def _keys(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _ledger(c: _Checker, t: dict) -> LedgerPolicy:
    c.table(t, "ledger", _keys(LedgerPolicy))
    d = LedgerPolicy()
    return LedgerPolicy(
        max_ledger_bytes=c.size(t, "ledger.max_ledger_bytes", d.max_ledger_bytes, minimum=4096),
        max_events=c.integer(t, "ledger.max_events", None, minimum=1),
        fail_fast_evidence=c.boolean(t, "ledger.fail_fast_evidence", d.fail_fast_evidence),
        min_free_bytes=c.size(t, "ledger.min_free_bytes", d.min_free_bytes, minimum=0),
        record_bodies=c.boolean(t, "ledger.record_bodies", d.record_bodies),
        fallback_dir=c.string(t, "ledger.fallback_dir", None),
    )


def _caps(c: _Checker, t: dict) -> CapsPolicy:
    c.table(t, "caps", _keys(CapsPolicy))
    d = CapsPolicy()
    caps = CapsPolicy(
        max_usd=c.usd(t, "caps.max_usd"),
        max_tokens=c.integer(t, "caps.max_tokens", None, minimum=1),
        max_model_calls=c.integer(t, "caps.max_model_calls", None, minimum=1),
        max_wall_seconds=c.duration(t, "caps.max_wall_seconds", None),
        warn_at=c.fraction(t, "caps.warn_at", d.warn_at),
        on_breach=c.choice(t, "caps.on_breach", d.on_breach, ON_BREACH),
        on_unpriced=c.choice(t, "caps.on_unpriced", d.on_unpriced, ON_UNPRICED),
        budget_mode=c.choice(t, "caps.budget_mode", d.budget_mode, BUDGET_MODES),
        default_max_output_tokens=c.integer(
            t, "caps.default_max_output_tokens", d.default_max_output_tokens, minimum=1
        ),
    )
    if caps.budget_mode == "quota" and caps.max_usd is not None:
        # A subscription has no per-token bill: a USD cap there would be a promise
        # about money that is never spent. Refuse it rather than silently ignore it.
        c.fail(
            "caps.max_usd",
            'does not apply when budget_mode = "quota" (no per-token bill); '
            'remove it, or set budget_mode = "usd"',
        )
    return caps


_PROVIDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _providers(c: _Checker, t: Any) -> Mapping[str, ProviderPolicy]:
    if t is None:
        return default_providers()
    if not isinstance(t, dict):
        c.fail("providers", f"must be a table of [providers.NAME] tables, got {_show(t)}")
    if not t:
        c.fail("providers", "names no provider; remove the [providers] table to use the defaults")
    out = {}
    for name, entry in t.items():
        path = f"providers.{name}"
        if not _PROVIDER_NAME.match(name):
            c.fail(path, "a provider name is letters, digits, '-' and '_' (at most 64)")
        if not isinstance(entry, dict):
            c.fail(path, f"must be a table ([{path}]), got {_show(entry)}")
        c.table(entry, path, ("kind", "base_url", "key_env"))
        default_kind = name if name in PROVIDER_KINDS else None
        kind = c.choice(entry, f"{path}.kind", default_kind, PROVIDER_KINDS)
        if kind is None:
            c.fail(f"{path}.kind", f"is required (one of {_alternatives(PROVIDER_KINDS)})")
        url_default, env_default = PROVIDER_DEFAULTS[kind]
        out[name] = ProviderPolicy(
            name=name,
            kind=kind,
            base_url=c.url(entry, f"{path}.base_url", url_default),
            key_env=c.string(entry, f"{path}.key_env", env_default, pattern=_ENV_NAME),
        )
    return MappingProxyType(out)


def _boundary(c: _Checker, t: dict) -> BoundaryPolicy:
    c.table(t, "boundary", _keys(BoundaryPolicy))
    d = BoundaryPolicy()
    host = c.string(t, "boundary.host", d.host)
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            c.fail("boundary.host", f'must be an IP address or "localhost", got {_show(host)}')
    return BoundaryPolicy(
        host=host,
        port=c.integer(t, "boundary.port", d.port, minimum=0, maximum=65535),
        upstream_timeout=c.duration(t, "boundary.upstream_timeout", d.upstream_timeout),
        connect_timeout=c.duration(t, "boundary.connect_timeout", d.connect_timeout),
    )


def _resilience(c: _Checker, t: dict) -> ResiliencePolicy:
    c.table(t, "resilience", _keys(ResiliencePolicy))
    d = ResiliencePolicy()
    r = ResiliencePolicy(
        breaker_threshold=c.integer(t, "resilience.breaker_threshold", d.breaker_threshold, 1),
        breaker_cooldown_seconds=c.duration(
            t, "resilience.breaker_cooldown_seconds", d.breaker_cooldown_seconds
        ),
        breaker_max_cooldown_seconds=c.duration(
            t, "resilience.breaker_max_cooldown_seconds", d.breaker_max_cooldown_seconds
        ),
        breaker_failure_rate=c.fraction(
            t, "resilience.breaker_failure_rate", d.breaker_failure_rate
        ),
        breaker_min_calls=c.integer(t, "resilience.breaker_min_calls", d.breaker_min_calls, 1),
        max_calls_per_second=c.positive(t, "resilience.max_calls_per_second", None),
        max_calls_per_minute=c.integer(t, "resilience.max_calls_per_minute", None, minimum=1),
        max_concurrent_upstream=c.integer(t, "resilience.max_concurrent_upstream", None, minimum=1),
        max_queue=c.integer(t, "resilience.max_queue", None, minimum=0),
    )
    if r.breaker_max_cooldown_seconds < r.breaker_cooldown_seconds:
        c.fail(
            "resilience.breaker_max_cooldown_seconds",
            f"must be at least breaker_cooldown_seconds ({r.breaker_cooldown_seconds:g}), "
            f"got {r.breaker_max_cooldown_seconds:g}",
        )
    return r


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*\Z")


def _egress(c: _Checker, t: dict) -> EgressPolicy:
    c.table(t, "egress", _keys(EgressPolicy))
    allow = t.get("allow", [])
    if not isinstance(allow, list):
        c.fail("egress.allow", f'must be a list of "host" or "host:port", got {_show(allow)}')
    out = []
    for i, entry in enumerate(allow):
        path = f"egress.allow[{i}]"
        if not isinstance(entry, str):
            c.fail(path, f'must be "host" or "host:port", got {_show(entry)}')
        if not _valid_egress(entry):
            c.fail(path, f'must be "host" or "host:port" (port 1-65535), got {_show(entry)}')
        out.append(entry.lower())
    return EgressPolicy(allow=tuple(out))


def _secrets(c: _Checker, t: dict) -> SecretsPolicy:
    c.table(t, "secrets", _keys(SecretsPolicy))
    names = t.get("drop_env", [])
    if not isinstance(names, list):
        c.fail(
            "secrets.drop_env", f"must be a list of environment variable names, got {_show(names)}"
        )
    for i, name in enumerate(names):
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            c.fail(
                f"secrets.drop_env[{i}]", f"must be an environment variable name, got {_show(name)}"
            )
    return SecretsPolicy(drop_env=tuple(names))


def _valid_egress(entry: str) -> bool:
    """The egress rule's own parser decides (one definition of a valid entry)."""
    from docket.guards.egress import parse_entry

    try:
        parse_entry(entry, "egress.allow")
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- value checks


_SIZE = re.compile(r"\s*([0-9]{1,15})\s*(B|KB|MB|GB|KiB|MiB|GiB)?\s*\Z")  # ASCII digits
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
}


def _show(value: Any) -> str:
    """A value as the user would have typed it in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return str(value)


def _alternatives(options) -> str:
    return " or ".join(f'"{o}"' for o in options)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Checker:
    """Value checks that raise PolicyError naming the file and the key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, reason: str):
        raise PolicyError(f"policy {self.source}: {path}: {reason}")

    def table(self, t: dict, path: str, known: tuple[str, ...]) -> None:
        for key in t:
            if key not in known:
                where = f"{path}.{key}" if path else key
                near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                hint = f" (did you mean {near[0]}?)" if near else f" (known: {', '.join(known)})"
                self.fail(where, "unknown key" + hint)

    def section(self, data: dict, name: str) -> dict:
        t = data.get(name, {})
        if not isinstance(t, dict):
            self.fail(name, f"must be a table ([{name}]), got {_show(t)}")
        return t

    def boolean(self, t: dict, path: str, default: bool) -> bool:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return default
        v = t[key]
        if not isinstance(v, bool):
            self.fail(path, f"must be true or false, got {_show(v)}")
        return v

    def integer(
        self, t: dict, path: str, default: int | None, minimum: int = 0, maximum: int | None = None
    ) -> int | None:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return default
        v = t[key]
        if not isinstance(v, int) or isinstance(v, bool):
            self.fail(path, f"must be a whole number, got {_show(v)}")
        if v < minimum or (maximum is not None and v > maximum):
            bound = (
                f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            )
            self.fail(path, f"must be {bound}, got {v}")
        return v

    def positive(self, t: dict, path: str, default: float | None) -> float | None:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return default
        v = t[key]
        if not _is_number(v) or not math.isfinite(v) or v <= 0:
            self.fail(path, f"must be a positive number, got {_show(v)}")
        return float(v)

    def fraction(self, t: dict, path: str, default: float) -> float:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return default
        v = t[key]
        if not _is_number(v) or not math.isfinite(v) or not 0 < v <= 1:
            self.fail(path, f"must be a number above 0 and at most 1, got {_show(v)}")
        return float(v)

    def usd(self, t: dict, path: str) -> Decimal | None:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return None
        v = t[key]
        if not _is_number(v) or not math.isfinite(v) or v <= 0:
            self.fail(path, f"must be a positive number, got {_show(v)}")
        # str() of a float is its shortest round-trip form: 10.1 stays 10.1, not 10.0999...
        amount = Decimal(str(v))
        if amount.as_tuple().exponent < -9:
            self.fail(path, f"has more than 9 decimal places (nano-USD is the unit), got {v}")
        # One spelling per value (10, 10.0 and 1E+1 are the same cap), so the digest is stable.
        return Decimal(format(amount.normalize(), "f"))

    def duration(self, t: dict, path: str, default: float | None) -> float | None:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return default
        v = t[key]
        # A number is seconds; a string needs its unit ("30" in quotes is a slip).
        seconds = parse_duration(v, bare=not isinstance(v, str))
        if seconds is None or seconds <= 0:
            self.fail(
                path,
                'must be a positive duration: seconds, or a string like "500ms", "30s", "5m", '
                f'"1h" (at most ten years); got {_show(v)}',
            )
        return seconds

    def size(self, t: dict, path: str, default: int, minimum: int) -> int:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return default
        v = t[key]
        size = None
        if isinstance(v, int) and not isinstance(v, bool):
            size = v
        elif isinstance(v, str) and (m := _SIZE.match(v)):
            size = int(m.group(1)) * _SIZE_UNITS[m.group(2)]
        if size is None:
            self.fail(
                path, f'must be bytes: a whole number or a string like "256MiB", got {_show(v)}'
            )
        if size < minimum:
            self.fail(path, f"must be at least {minimum} bytes, got {_show(v)}")
        return size

    def choice(
        self, t: dict, path: str, default: str | None, options: tuple[str, ...]
    ) -> str | None:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return default
        v = t[key]
        if not isinstance(v, str) or v not in options:
            self.fail(path, f"must be {_alternatives(options)}, got {_show(v)}")
        return v

    def string(self, t: dict, path: str, default: str, pattern: re.Pattern | None = None) -> str:
        key = path.rsplit(".", 1)[-1]
        if key not in t:
            return default
        v = t[key]
        if not isinstance(v, str) or not v:
            self.fail(path, f"must be a non-empty string, got {_show(v)}")
        if pattern is not None and not pattern.match(v):
            self.fail(path, f"is not a valid name, got {_show(v)}")
        return v

    def url(self, t: dict, path: str, default: str) -> str:
        v = self.string(t, path, default)
        problem = url_problem(v)
        if problem:
            self.fail(path, f"{problem}, got {_show(v)}")
        return v.rstrip("/")


_URL = re.compile(r"(https?)://([^/?#\s]+)(/[^?#\s]*)?\Z")


def url_problem(url: str) -> str | None:
    """Why `url` is not an upstream base URL (http(s)://host[:port][/path]), or None.

    Checked here, at load, by the same host rule the egress list uses, because every
    later reader (urlsplit's .port, the Host header, the egress entry) raises a bare
    ValueError on a port of 99999, "abc" or -1, or on "http://[::1".
    """
    m = _URL.match(url)
    if not m:
        return "must be an http:// or https:// URL with a host"
    authority = m.group(2)
    if "@" in authority:
        return "must not carry user:password@ (the key comes from key_env)"
    host, port = authority, None
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return "has an unclosed [ around its IPv6 address"
        host, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            return "must have :port, or nothing, after the ] of an IPv6 address"
        port = rest[1:] if rest else None
    elif authority.count(":") > 1:
        return "must put an IPv6 address in brackets (http://[::1]:8080)"
    elif ":" in authority:
        host, port = authority.split(":")
    if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return "must have a port from 1 to 65535"
    from docket.guards.egress import canonical_host

    try:
        canonical_host(host)
    except ValueError as exc:
        return f"has a host that is {exc}"
    return None


# ---------------------------------------------------------------- docket init


TEMPLATE_NAME = "docket.toml"


def template_text() -> str:
    """The commented docket.toml `docket init` writes (shipped as package data)."""
    return resources.files("docket").joinpath("data", TEMPLATE_NAME).read_text(encoding="utf-8")


def init_command(path: str, *, force: bool) -> int:
    """Write the commented template to path; an existing file is kept unless force."""
    target = Path(path)
    if target.is_dir():
        raise InputError(f"init {target}: is a directory; name the file to write")
    if "\x00" in path:
        raise InputError(f"init {path!r}: a file name cannot hold a NUL byte")
    if target.exists() and not force:
        raise InputError(f"init {target}: already exists (use --force to overwrite it)")
    if target.exists() and not target.is_file():
        # --force replaces a policy file, never a device, a FIFO or a socket (/dev/null)
        raise InputError(f"init {target}: not a regular file; name a file to write")
    if not target.parent.is_dir():
        raise InputError(f"init {target}: no such directory {target.parent}")
    text = template_text()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"init {target}: cannot write ({exc.strerror})") from None
    print(f"wrote {target}: every policy key, commented, at its default", file=sys.stdout)
    return 0
