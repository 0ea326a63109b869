"""The price table: lookup rules, exact integer costs, staleness, `docket prices`."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.clock import FakeClock
from docket.pricing import (
    PriceTableError,
    Usage,
    default_price_table,
    format_nusd,
    load_price_table,
    parse_price_table,
    prices_command,
)


def table_bytes(models: dict, aliases: dict | None = None, **top) -> bytes:
    doc = {
        "format": "docket-prices-1",
        "as_of": "2026-01-01",
        "provenance": "made up for a test",
        "sources": [],
        "models": models,
        "aliases": aliases or {},
    }
    doc.update(top)
    return json.dumps(doc).encode()


def price(i, c, o, **more):
    return {"provider": "openai", "input": i, "cached_input": c, "output": o, **more}


RULES = parse_price_table(
    table_bytes(
        {
            "gpt-4o": price("2.50", "1.25", "10.00"),
            "gpt-4o-mini": price("0.15", "0.075", "0.60"),
            "gpt-4o-2024-05-13": price("5.00", "5.00", "15.00"),
            "claude-sonnet-4": price("3.00", "0.30", "15.00"),
            "claude-sonnet-4-5": price("3.00", "0.30", "15.00"),
            "o3": price("2.00", "0.50", "8.00"),
        },
        aliases={"claude-sonnet-4-0": "claude-sonnet-4"},
    ),
    source="test",
)


@pytest.mark.parametrize(
    "model, entry",
    [
        ("gpt-4o", "gpt-4o"),  # exact
        ("claude-sonnet-4-0", "claude-sonnet-4"),  # alias
        ("gpt-4o-2024-08-06", "gpt-4o"),  # dated snapshot, YYYY-MM-DD
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),  # dated snapshot, YYYYMMDD
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),  # the longest entry wins
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),  # not gpt-4o
        ("gpt-4o-2024-05-13", "gpt-4o-2024-05-13"),  # an exact entry beats the snapshot rule
        ("o3-pro", None),  # a variant is not its base: o3-pro costs 10x o3
        ("o3-pro-2025-06-10", None),
        ("gpt-4o-realtime-preview", None),
        ("gpt-4o-2024", None),  # not a whole date
        ("gpt-4o-2024-08-06-extra", None),
        ("gpt-4", None),  # a prefix of an entry is not the entry
        ("GPT-4O", None),  # names are case-sensitive, as the providers' are
        ("", None),
    ],
)
def test_lookup_rules(model, entry):
    found = RULES.lookup(model)
    assert (found.model if found else None) == entry


def test_the_shipped_table_has_a_date_provenance_and_the_common_models():
    t = default_price_table()
    assert t.as_of == date(2026, 11, 29) and t.date == "2026-11-29"
    assert "not fetched live" in t.provenance and "Transcribed" in t.provenance
    assert any("anthropic" in s.lower() for s in t.sources)
    assert any("openai" in s.lower() for s in t.sources)
    for model in (
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4.1",
        "gpt-4.1-mini",
        "o3",
        "o4-mini",
        "claude-sonnet-4-5-20250929",
        "claude-haiku-4-5-20251001",
        "claude-opus-4-1-20250805",
    ):
        assert t.lookup(model) is not None, model
    assert t.lookup("gpt-4o").output == Decimal("10.00")
    assert t.lookup("claude-haiku-4-5-20251001").cache_write_1h == Decimal("2.00")
    assert t.digest.startswith("sha256:") and len(t.digest) == 71


def test_an_explicit_path_loads_the_same_table(tmp_path):
    path = tmp_path / "prices.json"
    path.write_bytes(table_bytes({"m": price("1", "0.5", "2")}))
    t = load_price_table(path)
    assert t.source == str(path) and t.lookup("m").input == Decimal("1")


# ---------------------------------------------------------------- exact costs


def test_a_cost_by_hand():
    gpt4o = RULES.lookup("gpt-4o")
    # 800 uncached input at 2.50, 200 cached at 1.25, 500 output at 10.00 per million tokens.
    expected = 800 * 2500 + 200 * 1250 + 500 * 10_000
    assert expected == 7_250_000  # $0.00725
    assert gpt4o.cost_nusd(1000, 500, 200, cached_is_subset=True) == expected
    assert gpt4o.cost_nusd(800, 500, 200, cached_is_subset=False) == expected
    assert gpt4o.cost_of(Usage.openai(1000, 500, 200)) == expected
    assert gpt4o.as_strings() == {"input": "2.50", "cached_input": "1.25", "output": "10.00"}
    assert format_nusd(expected) == "$0.00725"


def test_anthropic_cache_writes_are_charged_at_their_own_price():
    haiku = default_price_table().lookup("claude-haiku-4-5")
    split = Usage.anthropic(
        100, 10, 1000, 300, ephemeral_5m_input_tokens=200, ephemeral_1h_input_tokens=100
    )
    # input 1.00, output 5.00, reads 0.10, 5m writes 1.25, 1h writes 2.00
    assert haiku.cost_of(split) == 100 * 1000 + 10 * 5000 + 1000 * 100 + 200 * 1250 + 100 * 2000
    # Without the split every write is charged at the 1h price: never an under-count.
    unsplit = Usage.anthropic(100, 10, 1000, 300)
    assert unsplit.cache_write_1h_tokens == 300
    assert haiku.cost_of(unsplit) > haiku.cost_of(split)
    assert split.total_tokens == unsplit.total_tokens == 1410


def test_usage_that_cannot_be_is_refused():
    with pytest.raises(ValueError, match="exceeds prompt_tokens"):
        Usage.openai(10, 5, 11)
    with pytest.raises(ValueError, match="does not add up"):
        Usage.anthropic(1, 1, 0, 10, ephemeral_5m_input_tokens=3, ephemeral_1h_input_tokens=3)
    with pytest.raises(ValueError, match="whole number"):
        Usage(-1, 0)


prices_3dp = st.decimals(min_value=0, max_value=999, places=3).map(lambda d: format(d, "f"))
counts = st.integers(min_value=0, max_value=10**9)


@settings(deadline=None)
@given(prices_3dp, prices_3dp, prices_3dp, counts, counts, st.data())
def test_costs_are_exact_integers(p_in, p_cached, p_out, prompt, output, data):
    cached = data.draw(st.integers(min_value=0, max_value=prompt))
    table = parse_price_table(table_bytes({"m": price(p_in, p_cached, p_out)}))
    m = table.lookup("m")
    got = m.cost_nusd(prompt, output, cached, cached_is_subset=True)
    assert isinstance(got, int)
    # The same sum in exact decimal USD, converted to nano-USD at the end.
    usd = (
        (prompt - cached) * Decimal(p_in) + cached * Decimal(p_cached) + output * Decimal(p_out)
    ) / Decimal(10**6)
    assert Decimal(got) == usd * Decimal(10**9)
    # OpenAI's subset shape and Anthropic's separate shape agree once normalised.
    assert got == m.cost_nusd(prompt - cached, output, cached, cached_is_subset=False)


@pytest.mark.parametrize(
    "entry, expected",
    [
        (
            price("2.5001", "1", "1"),
            'models.m.input: must be a decimal string of USD per million tokens with at most 3 decimals (so nano-USD costs are whole), got "2.5001"',
        ),
        (price("1", "1", 10.0), "models.m.output: must be a decimal string"),
        (price("1", "-1", "1"), "models.m.cached_input: must be a decimal string"),
        (price("1", "1", "1", cache_write_5m="1.0005"), "models.m.cache_write_5m: must be"),
        ({"provider": "openai", "input": "1", "output": "1"}, "models.m.cached_input: must be"),
        (price("1", "1", "1", discount="5"), "models.m.discount: unknown field"),
        ({**price("1", "1", "1"), "provider": 3}, "models.m.provider: must be a string"),
    ],
)
def test_a_bad_table_entry_is_refused_by_path(entry, expected):
    with pytest.raises(PriceTableError) as info:
        parse_price_table(table_bytes({"m": entry}), source="p.json")
    assert str(info.value).startswith("prices p.json: ")
    assert expected in str(info.value)


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"{", "not valid JSON"),
        (table_bytes({"m": price("1", "1", "1")}, format="other"), "format: must be"),
        (table_bytes({"m": price("1", "1", "1")}, as_of="yesterday"), "as_of: must be a date"),
        (table_bytes({"m": price("1", "1", "1")}, provenance=""), "provenance: must say"),
        (table_bytes({}), "models: must be an object naming at least one model"),
        (table_bytes({"m": price("1", "1", "1")}, aliases={"a": "zz"}), 'aliases.a: names "zz"'),
    ],
)
def test_a_bad_table_is_refused(data, expected):
    with pytest.raises(PriceTableError, match=expected):
        parse_price_table(data, source="p.json")


# ---------------------------------------------------------------- staleness and `docket prices`


def test_staleness_is_more_than_90_days():
    t = default_price_table()
    assert not t.is_stale(t.as_of + timedelta(days=90))
    assert t.is_stale(t.as_of + timedelta(days=91))
    assert t.age_days(t.as_of - timedelta(days=3)) == -3


def clock_on(day: date) -> FakeClock:
    noon = datetime(day.year, day.month, day.day, 12, tzinfo=UTC).timestamp()
    return FakeClock(wall=noon)


def test_prices_warns_when_the_table_is_old(capsys):
    t = default_price_table()
    assert (
        prices_command(SimpleNamespace(json=True), clock=clock_on(t.as_of + timedelta(days=91)))
        == 0
    )
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["stale"] is True and doc["age_days"] == 91
    assert err.startswith("warning: the price table is 91 days old") and err.count("\n") == 1


def test_prices_does_not_warn_when_the_table_is_fresh(capsys):
    t = default_price_table()
    assert (
        prices_command(SimpleNamespace(json=False), clock=clock_on(t.as_of + timedelta(days=30)))
        == 0
    )
    out, err = capsys.readouterr()
    assert err == ""
    assert "as of 2026-11-29" in out and "gpt-4o-mini" in out


def run_prices(*args):
    return subprocess.run(
        [sys.executable, "-m", "docket", "prices", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_docket_prices_prints_the_table_date_and_provenance():
    result = run_prices()
    assert result.returncode == 0, result.stderr
    t = default_price_table()
    assert f"as of {t.as_of.isoformat()}" in result.stdout
    assert "provenance: Transcribed by hand" in result.stdout
    for name in ("gpt-4o-mini", "claude-haiku-4-5", "o4-mini"):
        assert name in result.stdout
    assert "$0.075" in result.stdout  # gpt-4o-mini's cached input, as a decimal, not a float
    today = datetime.now(UTC).date()
    assert ("warning: the price table is" in result.stderr) == t.is_stale(today)


def test_docket_prices_json_is_the_table():
    result = run_prices("--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    t = default_price_table()
    assert doc["as_of"] == t.as_of.isoformat() and doc["digest"] == t.digest
    assert doc["models"]["gpt-4o"] == {
        "provider": "openai",
        "input": "2.50",
        "cached_input": "1.25",
        "output": "10.00",
    }
    assert set(doc["models"]) == set(t.models)
    assert doc["stale"] == (doc["age_days"] > 90)
