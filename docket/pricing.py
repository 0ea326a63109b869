"""The price table and exact costs.

The table is a data file shipped in the package (docket/data/prices.json) with
its date and provenance: list prices in USD per million tokens, as decimal
strings, transcribed by hand. It is not live; `docket prices` warns when it is
more than 90 days old.

Costs are integers in nano-USD: tokens * price_per_Mtok * 1000. With at most 3
decimals in a price that product is a whole number, so sums are exact and a
cap compares integers; a table entry with more precision is refused.

Model lookup, in order:
1. the exact name, or an alias the table lists (claude-opus-4-0 -> claude-opus-4);
2. a dated snapshot of a listed model: the longest entry E such that the model
   is E-YYYY-MM-DD or E-YYYYMMDD (gpt-4o-2024-08-06 -> gpt-4o,
   claude-sonnet-4-5-20250929 -> claude-sonnet-4-5).
Only a date may follow the entry: o3-pro is not o3 and gpt-4o-realtime is not
gpt-4o (each costs several times its base), so a variant the table does not
list is unpriced, never priced as its cheaper base.

Cached input: OpenAI reports cached tokens as a subset of prompt tokens
(usage.prompt_tokens_details.cached_tokens); Anthropic reports cache reads and
cache writes apart from input_tokens (cache_read_input_tokens,
cache_creation_input_tokens). Usage.openai and Usage.anthropic normalise both
into disjoint counts, each charged at its own price.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, date, datetime
from decimal import Decimal
from importlib import resources
from types import MappingProxyType
from typing import NoReturn

from docket.clock import Clock
from docket.errors import InputError
from docket.inputs import read_text

FORMAT = "docket-prices-1"
STALE_AFTER_DAYS = 90
PRICE_FIELDS = ("input", "cached_input", "output", "cache_write_5m", "cache_write_1h")
ENTRY_FIELDS = ("provider", *PRICE_FIELDS, "note")
_PRICE = re.compile(r"(0|[1-9]\d{0,5})(\.\d{1,3})?\Z")
_SNAPSHOT = re.compile(r"\d{4}-\d{2}-\d{2}|\d{8}")


class PriceTableError(InputError):
    """A price table that cannot be used."""


@dataclass(frozen=True)
class Usage:
    """One call's tokens as disjoint counts, each charged at its own price."""

    input_tokens: int  # uncached input, charged at the input price
    output_tokens: int
    cached_tokens: int = 0  # cache reads
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0

    def __post_init__(self) -> None:
        for name in (
            "input_tokens",
            "output_tokens",
            "cached_tokens",
            "cache_write_5m_tokens",
            "cache_write_1h_tokens",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"usage {name} must be a whole number >= 0, got {value!r}")

    @property
    def total_tokens(self) -> int:
        """Every token of the call: what the max_tokens cap counts."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cached_tokens
            + self.cache_write_5m_tokens
            + self.cache_write_1h_tokens
        )

    @classmethod
    def openai(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        """From OpenAI's usage, where cached tokens are part of prompt_tokens."""
        if cached_tokens > prompt_tokens:
            raise ValueError(
                f"usage cached_tokens ({cached_tokens}) exceeds prompt_tokens ({prompt_tokens})"
            )
        return cls(prompt_tokens - cached_tokens, completion_tokens, cached_tokens)

    @classmethod
    def anthropic(
        cls,
        input_tokens: int,
        output_tokens: int,
        cache_read_input_tokens: int = 0,
        cache_creation_input_tokens: int = 0,
        *,
        ephemeral_5m_input_tokens: int | None = None,
        ephemeral_1h_input_tokens: int | None = None,
    ) -> Usage:
        """From Anthropic's usage, where cache reads and writes are apart from input_tokens.

        The 5m/1h split of cache writes (usage.cache_creation.*) is used when
        the response gives it; without it every write is charged at the 1h
        price, the higher of the two, so spend is never under-counted.
        """
        if ephemeral_5m_input_tokens is None and ephemeral_1h_input_tokens is None:
            w5, w1h = 0, cache_creation_input_tokens
        else:
            w5, w1h = ephemeral_5m_input_tokens or 0, ephemeral_1h_input_tokens or 0
            if w5 + w1h != cache_creation_input_tokens:
                raise ValueError(
                    f"usage cache writes split {w5}+{w1h} does not add up to "
                    f"cache_creation_input_tokens ({cache_creation_input_tokens})"
                )
        return cls(input_tokens, output_tokens, cache_read_input_tokens, w5, w1h)


def _nusd_per_token(price_per_mtok: Decimal) -> int:
    # USD per 1e6 tokens -> nano-USD per token: * 1e9 / 1e6 = * 1000 (exact for <= 3 decimals).
    return int(price_per_mtok * 1000)


@dataclass(frozen=True)
class ModelPrice:
    """One model's list prices, USD per million tokens."""

    model: str
    provider: str
    input: Decimal
    cached_input: Decimal
    output: Decimal
    cache_write_5m: Decimal | None = None
    cache_write_1h: Decimal | None = None
    note: str | None = None
    # Derived in __post_init__ (input, cached, output, write 5m, write 1h, dearest input).
    _nusd: tuple[int, int, int, int, int, int] = dataclass_field(
        init=False, repr=False, compare=False
    )
    _strings: Mapping[str, str] = dataclass_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The integer unit prices every call's reservation and settlement multiply by,
        # worked out once: Decimal arithmetic per call showed in the boundary's profile.
        # A cache write on a model with no write price is charged as plain input.
        w5 = self.cache_write_5m if self.cache_write_5m is not None else self.input
        w1h = self.cache_write_1h if self.cache_write_1h is not None else self.input
        nusd = tuple(_nusd_per_token(p) for p in (self.input, self.cached_input, self.output))
        dearest_input = max(
            _nusd_per_token(p)
            for p in (self.input, self.cached_input, self.cache_write_5m, self.cache_write_1h)
            if p is not None
        )
        strings = {
            "input": str(self.input),
            "cached_input": str(self.cached_input),
            "output": str(self.output),
        }
        object.__setattr__(
            self, "_nusd", (*nusd, _nusd_per_token(w5), _nusd_per_token(w1h), dearest_input)
        )
        object.__setattr__(self, "_strings", MappingProxyType(strings))

    def cost_nusd(
        self,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int = 0,
        *,
        cached_is_subset: bool,
    ) -> int:
        """Cost in nano-USD; cached_is_subset says whether input_tokens already counts the cached ones.

        True for OpenAI (cached_tokens is part of prompt_tokens), False for
        Anthropic (cache_read_input_tokens is apart from input_tokens). For
        Anthropic cache writes, build a Usage and use cost_of.
        """
        if cached_is_subset:
            usage = Usage.openai(input_tokens, output_tokens, cached_tokens)
        else:
            usage = Usage(input_tokens, output_tokens, cached_tokens)
        return self.cost_of(usage)

    def cost_of(self, usage: Usage) -> int:
        """The exact cost of a call, in nano-USD."""
        inp, cached, out, w5, w1h, _ = self._nusd
        return (
            usage.input_tokens * inp
            + usage.cached_tokens * cached
            + usage.output_tokens * out
            + usage.cache_write_5m_tokens * w5
            + usage.cache_write_1h_tokens * w1h
        )

    @property
    def max_input_nusd_per_token(self) -> int:
        """The dearest way an input token can be billed (a cache write can cost 2x input)."""
        return self._nusd[5]

    @property
    def output_nusd_per_token(self) -> int:
        return self._nusd[2]

    def as_strings(self) -> dict[str, str]:
        """input, cached_input and output prices as decimal strings (the events' unit_prices)."""
        return dict(self._strings)

    def to_dict(self) -> dict:
        out = {"provider": self.provider}
        for name in PRICE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = str(value)
        if self.note:
            out["note"] = self.note
        return out


def format_nusd(nusd: int) -> str:
    """Nano-USD as an exact dollar string: 2500 -> "$0.0000025", 5_000_000_000 -> "$5.00"."""
    sign = "-" if nusd < 0 else ""
    whole, frac = divmod(abs(nusd), 10**9)
    digits = f"{frac:09d}".rstrip("0")
    return f"{sign}${whole}.{digits.ljust(2, '0')}"


@dataclass(frozen=True)
class PriceTable:
    as_of: date
    provenance: str
    sources: tuple[str, ...]
    models: Mapping[str, ModelPrice]
    aliases: Mapping[str, str]
    not_listed: str
    digest: str  # sha256 of the file's bytes, for the receipt
    source: str  # where it was loaded from

    def lookup(self, model: str) -> ModelPrice | None:
        """The price for a model name as a request or response gives it (rules in the module doc)."""
        name = self.aliases.get(model, model)
        if name in self.models:
            return self.models[name]
        best: ModelPrice | None = None
        for i, ch in enumerate(model):
            if ch == "-" and _SNAPSHOT.fullmatch(model, i + 1):
                base = self.aliases.get(model[:i], model[:i])
                if base in self.models and (best is None or len(base) > len(best.model)):
                    best = self.models[base]
        return best

    def age_days(self, today: date) -> int:
        return (today - self.as_of).days

    def is_stale(self, today: date) -> bool:
        return self.age_days(today) > STALE_AFTER_DAYS

    @property
    def date(self) -> str:
        """as_of as YYYY-MM-DD (the session's pricing.table_date)."""
        return self.as_of.isoformat()

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "as_of": self.as_of.isoformat(),
            "provenance": self.provenance,
            "sources": list(self.sources),
            "digest": self.digest,
            "models": {name: p.to_dict() for name, p in self.models.items()},
            "aliases": dict(self.aliases),
            "not_listed": self.not_listed,
        }


def load_price_table(path: str | os.PathLike | None = None) -> PriceTable:
    """The price table in a file, or the one shipped with Docket when path is None."""
    if path is None:
        data = resources.files("docket").joinpath("data", "prices.json").read_bytes()
        return parse_price_table(data, source="docket/data/prices.json")
    read_text(path, "prices")  # one-line errors for missing, empty, binary files
    with open(path, "rb") as f:
        return parse_price_table(f.read(), source=str(path))


@functools.cache
def default_price_table() -> PriceTable:
    return load_price_table(None)


def parse_price_table(data: bytes, source: str = "<bytes>") -> PriceTable:
    def fail(path: str, reason: str):
        raise PriceTableError(f"prices {source}: {path}: {reason}")

    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PriceTableError(f"prices {source}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        fail("(top)", "must be a JSON object")
    if doc.get("format") != FORMAT:
        fail("format", f'must be "{FORMAT}", got {json.dumps(doc.get("format"))}')
    try:
        as_of = date.fromisoformat(doc.get("as_of", ""))
    except (TypeError, ValueError):
        fail("as_of", f"must be a date YYYY-MM-DD, got {json.dumps(doc.get('as_of'))}")
    provenance = doc.get("provenance")
    if not isinstance(provenance, str) or not provenance.strip():
        fail("provenance", "must say where the prices came from")
    sources = doc.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        fail("sources", "must be a list of strings")
    entries = doc.get("models")
    if not isinstance(entries, dict) or not entries:
        fail("models", "must be an object naming at least one model")
    models: dict[str, ModelPrice] = {}
    for name, entry in entries.items():
        path = f"models.{name}"
        if not isinstance(entry, dict):
            fail(path, "must be an object")
        unknown = sorted(set(entry) - set(ENTRY_FIELDS))
        if unknown:
            fail(f"{path}.{unknown[0]}", f"unknown field (known: {', '.join(ENTRY_FIELDS)})")
        if not isinstance(entry.get("provider"), str):
            fail(f"{path}.provider", "must be a string")
        prices: dict[str, Decimal | None] = {}
        for field in PRICE_FIELDS:
            raw = entry.get(field)
            if raw is None and field.startswith("cache_write"):
                prices[field] = None
                continue
            if not isinstance(raw, str) or not _PRICE.match(raw):
                fail(
                    f"{path}.{field}",
                    "must be a decimal string of USD per million tokens with at most 3 "
                    f"decimals (so nano-USD costs are whole), got {json.dumps(raw)}",
                )
            prices[field] = Decimal(raw)
        note = entry.get("note")
        if note is not None and not isinstance(note, str):
            fail(f"{path}.note", "must be a string")
        models[name] = ModelPrice(model=name, provider=entry["provider"], note=note, **prices)  # type: ignore[arg-type]  # input/cached_input/output are never None here
    aliases = doc.get("aliases", {})
    if not isinstance(aliases, dict):
        fail("aliases", "must be an object")
    for alias, target in aliases.items():
        if target not in models:
            fail(f"aliases.{alias}", f"names {json.dumps(target)}, which the table does not list")
    not_listed = doc.get("not_listed", "")
    if not isinstance(not_listed, str):
        fail("not_listed", "must be a string")
    return PriceTable(
        as_of=as_of,
        provenance=provenance,
        sources=tuple(sources),
        models=MappingProxyType(models),
        aliases=MappingProxyType(dict(aliases)),
        not_listed=not_listed,
        digest="sha256:" + hashlib.sha256(data).hexdigest(),
        source=source,
    )


# ---------------------------------------------------------------- a policy's [prices]

POLICY_PRICE_KEYS = ("input", "output", "cached_input", "provider", "source")
PRICE_SYNTAX = 'a price string of USD per million tokens with at most 3 decimals, e.g. "0.15"'


def policy_model_price(
    name: str, entry: Mapping, base: PriceTable, fail: Callable[[str, str], NoReturn]
) -> ModelPrice:
    """One [prices.MODEL] table of a policy as a ModelPrice; `fail(key, reason)` raises.

    input and output are required, cached_input defaults to input (cached tokens charged
    as input, as the shipped table does where no cached price is listed), provider to
    the shipped entry's (or "policy"), and `source` (where the price was read) is
    required: it goes into the run's pricing provenance."""
    unknown = sorted(set(entry) - set(POLICY_PRICE_KEYS))
    if unknown:
        fail(unknown[0], f"unknown key (known: {', '.join(POLICY_PRICE_KEYS)})")
    prices: dict[str, Decimal] = {}
    for key in ("input", "output", "cached_input"):
        raw = entry.get(key)
        if raw is None and key == "cached_input":
            prices[key] = prices["input"]
        elif raw is None:
            fail(key, f"is required ({PRICE_SYNTAX})")
        elif not isinstance(raw, str) or not _PRICE.match(raw):
            fail(key, f"must be {PRICE_SYNTAX}, got {json.dumps(raw, default=str)}")
        else:
            prices[key] = Decimal(raw)
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        fail("source", "is required: a string saying where this price was read")
    shipped = base.lookup(name)
    provider = entry.get("provider", shipped.provider if shipped is not None else "policy")
    if not isinstance(provider, str) or not provider:
        fail("provider", f"must be a string, got {json.dumps(provider, default=str)}")
    return ModelPrice(
        model=name, provider=provider, note=f"from the policy: {source.strip()}", **prices
    )


def with_policy_prices(
    base: PriceTable, prices: Mapping[str, ModelPrice], policy: str
) -> PriceTable:
    """The shipped table with a policy's [prices] over it: the policy wins for the models
    it names (an alias of the same name included), and the provenance says which and
    from where, first, so the run's session.start and receipt carry it."""
    if not prices:
        return base
    said = "; ".join(
        f"{name}: {p.note.removeprefix('from the policy: ')}"
        for name, p in prices.items()
        if p.note
    )
    replaced = sorted(name for name in prices if base.lookup(name) is not None)
    provenance = f"policy {policy} [prices] ({said})"
    if replaced:
        provenance += f", over the shipped price of {', '.join(replaced)}"
    provenance += f"; every other model: {base.provenance}"
    canonical = json.dumps(
        {name: p.to_dict() for name, p in sorted(prices.items())}, sort_keys=True
    ).encode("utf-8")
    return PriceTable(
        as_of=base.as_of,
        provenance=provenance,
        sources=base.sources,
        models=MappingProxyType({**base.models, **prices}),
        aliases=MappingProxyType({a: t for a, t in base.aliases.items() if a not in prices}),
        not_listed=base.not_listed,
        digest="sha256:" + hashlib.sha256(base.digest.encode() + b"\n" + canonical).hexdigest(),
        source=f"{base.source} + {policy} [prices]",
    )


# ---------------------------------------------------------------- docket prices


def prices_command(args, *, clock=None, table: PriceTable | None = None) -> int:
    """Print the table, its date and provenance; warn (stderr) when it is over 90 days old.
    `table`: another than the shipped one (`--policy`: a policy's [prices] over it)."""
    table = table or default_price_table()
    wall = (clock or Clock()).wall()
    today = datetime.fromtimestamp(wall, UTC).date()
    age = table.age_days(today)
    stale = table.is_stale(today)
    if getattr(args, "json", False):
        doc = table.to_dict()
        doc.update({"today": today.isoformat(), "age_days": age, "stale": stale})
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        _print_table(table)
    if stale:
        print(
            f"warning: the price table is {age} days old (as of {table.as_of.isoformat()}, "
            f"more than {STALE_AFTER_DAYS}): prices may have changed; check the sources",
            file=sys.stderr,
        )
    return 0


def _print_table(table: PriceTable) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    grid = Table(
        title=f"Docket price table, as of {table.as_of.isoformat()} "
        "(USD per million tokens, standard-tier list prices)",
        title_justify="left",
    )
    grid.add_column("model", no_wrap=True)
    grid.add_column("provider")
    for name in ("input", "cached input", "output", "cache write 5m", "cache write 1h"):
        grid.add_column(name, justify="right")
    for name, p in table.models.items():
        mark = " *" if p.note else ""
        if p.note and p.note.startswith("from the policy: "):
            mark = " (policy) *"
        grid.add_row(
            name + mark,
            p.provider,
            *(f"${v}" if v is not None else "-" for v in (getattr(p, f) for f in PRICE_FIELDS)),
        )
    console.print(grid)
    notes = [(name, p.note) for name, p in table.models.items() if p.note]
    if notes:
        console.print("* notes:")
        for name, note in notes:
            console.print(escape(f"  {name}: {note}"))
    if table.aliases:
        console.print("aliases: " + ", ".join(f"{a} -> {t}" for a, t in table.aliases.items()))
    console.print(
        "lookup: exact name or alias, else a dated snapshot of a listed model "
        "(gpt-4o-2024-08-06 -> gpt-4o); any other variant is unpriced."
    )
    console.print(escape(f"provenance: {table.provenance}"))
    for s in table.sources:
        console.print(f"source: {s}")
    if table.not_listed:
        console.print(f"not listed: {table.not_listed}")
    console.print(f"table digest: {table.digest}")
