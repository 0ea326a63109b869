"""The policy: docket.toml read into frozen dataclasses, every key checked.

Every key Docket will ever read is declared here with its default, so an
unknown key is always a mistake (named, with the nearest known key) and a bad
value is always refused with its key path and the reason, never a traceback.
The resolved policy has a stable digest that the receipt carries, so a reader
can tell which rules a run was held to.

Durations, sizes, money and shares are read by docket.values, the one grammar
every config reader shares: a duration is seconds (a number) or a string with a
unit ("500ms", "30s", "5m", "1h"); a size is bytes (an integer) or a string with
a unit ("16MiB", "1GB"); a share is a number or a percentage ("80%"). TOML has no
null, so a key whose default is "none" is simply left out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from decimal import Decimal
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from docket.cache.config import CACHE_KEYS, CachePolicy, cache_policy
from docket.errors import InputError
from docket.fields import Fields, alternatives, show
from docket.guards.egress import canonical_host, parse_entry
from docket.inputs import read_text
from docket.ledger.limits import LedgerLimits
from docket.pricing import (
    ModelPrice,
    PriceTable,
    default_price_table,
    policy_model_price,
    with_policy_prices,
)
from docket.reading.thresholds import KEYS as EXPLAIN_KEYS
from docket.reading.thresholds import read_thresholds
from docket.values import is_ip, nano_usd

MiB = 1024 * 1024

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
        return None if self.max_usd is None else nano_usd(self.max_usd)

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
    # The whole upstream call (connect, send, answer or stream), however its bytes
    # trickle: a stream that sends a byte every upstream_timeout - 1 s ends here.
    upstream_total_timeout: float = 600.0
    connect_timeout: float = 10.0
    # Agent connections open at once; past it a new one is closed at once (counted, one
    # connection.pressure event per episode). Below the soft NOFILE docket run raises.
    max_connections: int = 256
    # The longest a request head (request line and headers) may take to arrive, in total:
    # a client trickling a header every few seconds is answered 408 and closed.
    request_head_timeout: float = 10.0


@dataclass(frozen=True)
class ResiliencePolicy:
    breaker_threshold: int = 5
    breaker_cooldown_seconds: float = 30.0
    breaker_max_cooldown_seconds: float = 300.0
    breaker_failure_rate: float = 0.5
    breaker_min_calls: int = 20
    # None: as long as breaker_min_calls (the window the rate is read over).
    breaker_window_calls: int | None = None
    # Calls the window must hold before breaker_threshold consecutive failures open it.
    breaker_consecutive_min_calls: int = 1
    # None: no call counts as slow (docket/guards/breaker.py says why that is the default).
    breaker_slow_call_ms: int | None = None
    breaker_slow_call_rate: float = 1.0
    breaker_half_open_probes: int = 1
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


@dataclass(frozen=True)
class SnapshotPolicy:
    # What `docket run --snapshot` leaves out (docket.snapshot.scan): a pattern without
    # "/" matches a name at any depth, one with "/" the path from the snapshot's root.
    exclude: tuple[str, ...] = (".git",)


@dataclass(frozen=True)
class ExportPolicy:
    # Where a run's record goes when the run ends (docket.export, docs/export.md): an
    # OTLP/HTTP base URL. The headers (a collector's token) are never in this file:
    # otlp_headers_env names the variable that holds them, as k=v,k2=v2.
    otlp_endpoint: str | None = None
    otlp_headers_env: str | None = None
    otlp_timeout: float = 10.0
    otlp_metrics: bool = True  # false for a backend that takes traces only (Langfuse)


@dataclass(frozen=True)
class FleetPolicy:
    """A budget shared by many runs in PostgreSQL (docs/fleet.md); off unless `budget`."""

    budget: str | None = None  # the budget's name in the database
    dsn: str | None = None  # a libpq connection string without a password
    dsn_env: str | None = None  # or the environment variable holding one (may hold a password)
    slice_usd: Decimal | None = None  # per exchange; none: a twentieth of the cap
    slice_tokens: int | None = None
    slice_calls: int | None = None
    lease_seconds: float = 30.0
    low_water: float = 0.5  # ask for more once less than this share of a slice is free
    timeout: float = 2.0  # the longest one exchange with the database may take

    @property
    def enabled(self) -> bool:
        return self.budget is not None


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
    snapshot: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    cache: CachePolicy = field(default_factory=CachePolicy)  # docket/cache/config.py
    # [prices]: model -> its price, over the shipped table (docket.pricing.with_policy_prices)
    prices: Mapping[str, ModelPrice] = field(default_factory=dict, hash=False)
    # Not in to_dict, so not in the digest: where the record is sent after the run is
    # not a rule the run was held to (as [explain] is not).
    export: ExportPolicy = field(default_factory=ExportPolicy)
    fleet: FleetPolicy = field(default_factory=FleetPolicy)  # docs/fleet.md
    # Where it came from; not part of the digest (the same rules from two files are the same policy).
    source: str = field(default="defaults", compare=False)

    def provider(self, name: str) -> ProviderPolicy | None:
        return self.providers.get(name)

    def price_table(self) -> PriceTable:
        """The price table a run under this policy uses: the shipped one, its [prices] over it."""
        return with_policy_prices(default_price_table(), self.prices, self.source)

    def ledger_limits(self):
        """The [ledger] ceilings as the writer takes them (docket.ledger.limits.LedgerLimits).

        record_bodies is not the writer's to enforce (nor is min_free_bytes at
        start; the writer records evidence.low_disk when the volume drops below
        it); read them from self.ledger.
        """
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
            "snapshot": section(self.snapshot),
        }
        if self.cache.enabled:  # only then: a policy without it keeps its digest
            out["cache"] = self.cache.to_dict()
        if self.prices:  # likewise
            out["prices"] = {name: p.to_dict() for name, p in self.prices.items()}
        if self.fleet.enabled:  # likewise; the DSN's text is where the budget is, not a rule
            out["fleet"] = {
                k: v for k, v in section(self.fleet).items() if k not in ("dsn", "dsn_env")
            }
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
    policy = policy_from_dict(data, source=source)
    if policy.cache.dir is not None:  # a shared cache store's folder: relative to this file
        folder = Path(path).parent / policy.cache.dir
        policy = dataclasses.replace(
            policy, cache=dataclasses.replace(policy.cache, dir=str(folder.absolute()))
        )
    return policy


def policy_from_dict(data: dict, source: str = "<dict>") -> Policy:
    """Check and resolve parsed TOML (or any dict of the same shape) into a Policy."""
    c = _Checker(source)
    c.fields(
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
            "snapshot",
            "explain",
            "cache",
            "prices",
            "export",
            "fleet",
        ),
    )
    ledger = _ledger(c, c.section(data, "ledger"))
    caps = _caps(c, c.section(data, "caps"))
    providers = _providers(c, data.get("providers"))
    boundary = _boundary(c, c.section(data, "boundary"))
    resilience = _resilience(c, c.section(data, "resilience"))
    egress = _egress(c, c.section(data, "egress"))
    secrets = _secrets(c, c.section(data, "secrets"))
    snapshot = _snapshot(c, c.section(data, "snapshot"))
    cache = cache_policy(c.fields(c.section(data, "cache"), "cache", CACHE_KEYS))
    prices = _prices(c, c.section(data, "prices"))
    export = _export(c, c.section(data, "export"))
    fleet = _fleet(c, c.section(data, "fleet"))
    # Checked here so that `docket run` refuses a mistyped [explain] as explain would;
    # not kept: the thresholds tune what `docket explain` names, never what a run does.
    read_thresholds(c.fields(c.section(data, "explain"), "explain", EXPLAIN_KEYS))
    return Policy(
        ledger=ledger,
        caps=caps,
        providers=providers,
        boundary=boundary,
        resilience=resilience,
        egress=egress,
        secrets=secrets,
        snapshot=snapshot,
        cache=cache,
        prices=prices,
        export=export,
        fleet=fleet,
        source=source,
    )


def _keys(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _ledger(c: _Checker, t: dict) -> LedgerPolicy:
    f = c.fields(t, "ledger", _keys(LedgerPolicy))
    d = LedgerPolicy()
    return LedgerPolicy(
        max_ledger_bytes=f.size("max_ledger_bytes", d.max_ledger_bytes, minimum=4096),
        max_events=f.integer("max_events", None, minimum=1),
        fail_fast_evidence=f.boolean("fail_fast_evidence", d.fail_fast_evidence),
        min_free_bytes=f.size("min_free_bytes", d.min_free_bytes, minimum=0),
        record_bodies=f.boolean("record_bodies", d.record_bodies),
        fallback_dir=f.string("fallback_dir", None),
    )


def _caps(c: _Checker, t: dict) -> CapsPolicy:
    f = c.fields(t, "caps", _keys(CapsPolicy))
    d = CapsPolicy()
    caps = CapsPolicy(
        max_usd=f.usd("max_usd"),
        max_tokens=f.integer("max_tokens", None, minimum=1),
        max_model_calls=f.integer("max_model_calls", None, minimum=1),
        max_wall_seconds=f.duration("max_wall_seconds", None),
        warn_at=f.fraction("warn_at", d.warn_at),
        on_breach=f.choice("on_breach", d.on_breach, ON_BREACH),
        on_unpriced=f.choice("on_unpriced", d.on_unpriced, ON_UNPRICED),
        budget_mode=f.choice("budget_mode", d.budget_mode, BUDGET_MODES),
        default_max_output_tokens=f.integer(
            "default_max_output_tokens", d.default_max_output_tokens, minimum=1
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
        c.fail("providers", f"must be a table of [providers.NAME] tables, got {show(t)}")
    if not t:
        c.fail("providers", "names no provider; remove the [providers] table to use the defaults")
    out = {}
    for name, entry in t.items():
        path = f"providers.{name}"
        if not _PROVIDER_NAME.match(name):
            c.fail(path, "a provider name is letters, digits, '-' and '_' (at most 64)")
        if not isinstance(entry, dict):
            c.fail(path, f"must be a table ([{path}]), got {show(entry)}")
        f = c.fields(entry, path, ("kind", "base_url", "key_env"))
        default_kind = name if name in PROVIDER_KINDS else None
        kind = f.choice("kind", default_kind, PROVIDER_KINDS)
        if kind is None:
            c.fail(f"{path}.kind", f"is required (one of {alternatives(PROVIDER_KINDS)})")
        url_default, env_default = PROVIDER_DEFAULTS[kind]
        out[name] = ProviderPolicy(
            name=name,
            kind=kind,
            base_url=_url(f, "base_url", url_default),
            key_env=f.string("key_env", env_default, pattern=_ENV_NAME),
        )
    return MappingProxyType(out)


def _boundary(c: _Checker, t: dict) -> BoundaryPolicy:
    f = c.fields(t, "boundary", _keys(BoundaryPolicy))
    d = BoundaryPolicy()
    host = f.string("host", d.host)
    if host != "localhost" and not is_ip(host):
        c.fail("boundary.host", f'must be an IP address or "localhost", got {show(host)}')
    return BoundaryPolicy(
        host=host,
        port=f.integer("port", d.port, minimum=0, maximum=65535),
        upstream_timeout=f.duration("upstream_timeout", d.upstream_timeout),
        upstream_total_timeout=f.duration("upstream_total_timeout", d.upstream_total_timeout),
        connect_timeout=f.duration("connect_timeout", d.connect_timeout),
        max_connections=f.integer("max_connections", d.max_connections, minimum=1),
        request_head_timeout=f.duration("request_head_timeout", d.request_head_timeout),
    )


def _resilience(c: _Checker, t: dict) -> ResiliencePolicy:
    f = c.fields(t, "resilience", _keys(ResiliencePolicy))
    d = ResiliencePolicy()
    r = ResiliencePolicy(
        breaker_threshold=f.integer("breaker_threshold", d.breaker_threshold, minimum=1),
        breaker_cooldown_seconds=f.duration("breaker_cooldown_seconds", d.breaker_cooldown_seconds),
        breaker_max_cooldown_seconds=f.duration(
            "breaker_max_cooldown_seconds", d.breaker_max_cooldown_seconds
        ),
        breaker_failure_rate=f.fraction("breaker_failure_rate", d.breaker_failure_rate),
        breaker_min_calls=f.integer("breaker_min_calls", d.breaker_min_calls, minimum=1),
        breaker_window_calls=f.integer("breaker_window_calls", None, minimum=1),
        breaker_consecutive_min_calls=f.integer(
            "breaker_consecutive_min_calls", d.breaker_consecutive_min_calls, minimum=1
        ),
        breaker_slow_call_ms=f.integer("breaker_slow_call_ms", None, minimum=1),
        breaker_slow_call_rate=f.fraction("breaker_slow_call_rate", d.breaker_slow_call_rate),
        breaker_half_open_probes=f.integer(
            "breaker_half_open_probes", d.breaker_half_open_probes, minimum=1
        ),
        max_calls_per_second=f.positive("max_calls_per_second", None),
        max_calls_per_minute=f.integer("max_calls_per_minute", None, minimum=1),
        max_concurrent_upstream=f.integer("max_concurrent_upstream", None, minimum=1),
        max_queue=f.integer("max_queue", None, minimum=0),
    )
    if r.breaker_max_cooldown_seconds < r.breaker_cooldown_seconds:
        c.fail(
            "resilience.breaker_max_cooldown_seconds",
            f"must be at least breaker_cooldown_seconds ({r.breaker_cooldown_seconds:g}), "
            f"got {r.breaker_max_cooldown_seconds:g}",
        )
    window = r.breaker_min_calls if r.breaker_window_calls is None else r.breaker_window_calls
    if window < r.breaker_min_calls:
        c.fail(
            "resilience.breaker_window_calls",
            f"must be at least breaker_min_calls ({r.breaker_min_calls}), got {window}",
        )
    if r.breaker_consecutive_min_calls > window:
        c.fail(
            "resilience.breaker_consecutive_min_calls",
            f"must be at most the window's length ({window} calls: breaker_window_calls, "
            f"else breaker_min_calls), got {r.breaker_consecutive_min_calls}",
        )
    return r


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*\Z")


def _egress(c: _Checker, t: dict) -> EgressPolicy:
    c.fields(t, "egress", _keys(EgressPolicy))
    allow = t.get("allow", [])
    if not isinstance(allow, list):
        c.fail("egress.allow", f'must be a list of "host" or "host:port", got {show(allow)}')
    out = []
    for i, entry in enumerate(allow):
        path = f"egress.allow[{i}]"
        if not isinstance(entry, str):
            c.fail(path, f'must be "host" or "host:port", got {show(entry)}')
        if not _valid_egress(entry):
            c.fail(path, f'must be "host" or "host:port" (port 1-65535), got {show(entry)}')
        out.append(entry.lower())
    return EgressPolicy(allow=tuple(out))


def _secrets(c: _Checker, t: dict) -> SecretsPolicy:
    c.fields(t, "secrets", _keys(SecretsPolicy))
    names = t.get("drop_env", [])
    if not isinstance(names, list):
        c.fail(
            "secrets.drop_env", f"must be a list of environment variable names, got {show(names)}"
        )
    for i, name in enumerate(names):
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            c.fail(
                f"secrets.drop_env[{i}]", f"must be an environment variable name, got {show(name)}"
            )
    return SecretsPolicy(drop_env=tuple(names))


def _snapshot(c: _Checker, t: dict) -> SnapshotPolicy:
    c.fields(t, "snapshot", _keys(SnapshotPolicy))
    patterns = t.get("exclude", list(SnapshotPolicy().exclude))
    if not isinstance(patterns, list):
        c.fail(
            "snapshot.exclude", f'must be a list of patterns, e.g. [".git"], got {show(patterns)}'
        )
    for i, p in enumerate(patterns):
        if not isinstance(p, str) or not p.strip("/") or "\0" in p or ".." in p.split("/"):
            c.fail(
                f"snapshot.exclude[{i}]",
                f"must be a non-empty pattern without '..', got {show(p)}",
            )
    return SnapshotPolicy(exclude=tuple(patterns))


def _prices(c: _Checker, t: dict) -> Mapping[str, ModelPrice]:
    """[prices.MODEL] tables: input, output (cached_input) price strings and a source."""
    out = {}
    for name, entry in t.items():
        path = f"prices.{name}"
        if not name.strip():
            c.fail("prices", "a model name cannot be empty")
        if not isinstance(entry, dict):
            c.fail(path, f'must be a table ([prices."{name}"]), got {show(entry)}')

        def fail(key: str, reason: str, path: str = path) -> NoReturn:
            c.fail(f"{path}.{key}", reason)

        out[name] = policy_model_price(name, entry, default_price_table(), fail)
    return MappingProxyType(out)


def _export(c: _Checker, t: dict) -> ExportPolicy:
    f = c.fields(t, "export", _keys(ExportPolicy))
    endpoint = f.string("otlp_endpoint", None)
    if endpoint is not None:
        problem = url_problem(endpoint)
        if problem:
            f.fail("otlp_endpoint", f"{problem}, got {show(endpoint)}")
    return ExportPolicy(
        otlp_endpoint=endpoint,
        otlp_headers_env=f.string("otlp_headers_env", None, pattern=_ENV_NAME),
        otlp_timeout=f.duration("otlp_timeout", ExportPolicy().otlp_timeout),
        otlp_metrics=f.boolean("otlp_metrics", ExportPolicy().otlp_metrics),
    )


_BUDGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
# A password in a libpq string: key=value form (password=...), or a URI's user:pass@.
_DSN_PASSWORD = re.compile(r"(^|\s)password\s*=|^postgres(ql)?://[^/@?]*:[^/@?]*@", re.IGNORECASE)


def _fleet(c: _Checker, t: dict) -> FleetPolicy:
    f = c.fields(t, "fleet", _keys(FleetPolicy))
    d = FleetPolicy()
    if not t:
        return d
    budget = f.string("budget", "", _BUDGET_NAME)
    if not budget:
        c.fail("fleet.budget", 'must name the budget (letters, digits, _ . -), e.g. "team-a"')
    dsn, dsn_env = f.string("dsn", None), f.string("dsn_env", None, _ENV_NAME)
    if (dsn is None) == (dsn_env is None):
        c.fail("fleet", "must have one of dsn or dsn_env (the variable that holds the DSN)")
    if dsn is not None and _DSN_PASSWORD.search(dsn):
        c.fail(
            "fleet.dsn",
            "must not hold a password: put the DSN in dsn_env's variable, or use .pgpass",
        )
    fleet = FleetPolicy(
        budget=budget,
        dsn=dsn,
        dsn_env=dsn_env,
        slice_usd=f.usd("slice_usd"),
        slice_tokens=f.integer("slice_tokens", None, minimum=1),
        slice_calls=f.integer("slice_calls", None, minimum=1),
        lease_seconds=f.duration("lease_seconds", d.lease_seconds),
        low_water=f.fraction("low_water", d.low_water),
        timeout=f.duration("timeout", d.timeout),
    )
    if fleet.lease_seconds < 2:
        c.fail("fleet.lease_seconds", f"must be at least 2 s, got {fleet.lease_seconds:g}")
    if fleet.timeout >= fleet.lease_seconds / 2:
        c.fail(
            "fleet.timeout",
            "must be under half of lease_seconds (a renewal must fit before expiry)",
        )
    return fleet


def _valid_egress(entry: str) -> bool:
    """The egress rule's own parser decides (one definition of a valid entry)."""
    try:
        parse_entry(entry, "egress.allow")
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- value checks


class _Checker:
    """Where a policy problem is: the file and the key path. The checks themselves are
    docket.fields' (one wording for every config reader), the grammars docket.values'."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, path: str, reason: str) -> PolicyError:
        return PolicyError(f"policy {self.source}: {path}: {reason}")

    def fail(self, path: str, reason: str) -> NoReturn:
        raise self.error(path, reason)

    def fields(self, t: Mapping[str, Any], path: str, known: Sequence[str]) -> Fields:
        """The table at `path`, its keys checked against `known`."""
        f = Fields(t, lambda key, reason: self.error(f"{path}.{key}" if path else key, reason))
        f.known(known)
        return f

    def section(self, data: Mapping[str, Any], name: str) -> dict:
        t = data.get(name, {})
        if not isinstance(t, dict):
            self.fail(name, f"must be a table ([{name}]), got {show(t)}")
        return t


def _url(f: Fields, key: str, default: str) -> str:
    v = f.string(key, default)
    problem = url_problem(v)
    if problem:
        f.fail(key, f"{problem}, got {show(v)}")
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
