"""docket.values: the one grammar for durations, sizes, money, percentages and addresses.

Properties: every value prints to text that parses back to the same value; junk,
non-ASCII digits, NaN/inf, negatives (where unsigned) and huge values are refused
with a ValueProblem (never another exception); and each reader (policy, scenario,
phase, stub flag, fault argument, agent setting) reads a duration the same way.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.values import (
    DURATION_UNITS,
    MAX_BYTES,
    MAX_DURATION_SECONDS,
    SIZE_UNITS,
    Duration,
    ValueProblem,
    duration_seconds,
    format_duration,
    format_percent,
    format_size,
    host_problem,
    parse_duration,
    parse_fraction,
    parse_percent,
    parse_size,
    parse_usd,
)

MAX_PS = MAX_DURATION_SECONDS * 10**12

# ---------------------------------------------------------------- durations


@given(st.integers(min_value=-MAX_PS, max_value=MAX_PS))
def test_a_duration_prints_to_text_that_parses_back_to_it(ps):
    d = Duration(ps)
    assert parse_duration(format_duration(d), signed=True) == d
    assert d.text == format_duration(d)


@given(
    st.integers(min_value=0, max_value=10**4),  # 10**4 h is under ten years
    st.text(alphabet="0123456789", max_size=9),
    st.sampled_from(sorted(DURATION_UNITS)),
    st.sampled_from(["", " "]),
)
def test_written_durations_read_exactly(whole, decimals, unit, space):
    text = f"{whole}{'.' + decimals if decimals else ''}{space}{unit}"
    d = parse_duration(text)
    # exact: picoseconds are the number times the unit, with no float in between
    assert d.ps * 10 ** len(decimals) == int(f"{whole}{decimals}") * DURATION_UNITS[unit]
    assert parse_duration(d.text) == d


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_number_is_seconds_or_refused(value):
    try:
        d = parse_duration(value)
    except ValueProblem:
        assert not math.isfinite(value) or value < 0 or value > MAX_DURATION_SECONDS
        return
    assert math.isfinite(value) and 0 <= value <= MAX_DURATION_SECONDS
    assert math.isclose(d.seconds, value, rel_tol=1e-12, abs_tol=1e-12)


JUNK = "0123456789５٣.:-+ \t\nmshdMSH%KiBG/\x00e_"


@settings()
@given(st.one_of(st.text(alphabet=JUNK, max_size=30), st.text(max_size=30)))
def test_any_text_is_a_bounded_duration_or_a_value_problem(text):
    try:
        d = parse_duration(text)
    except ValueProblem as exc:
        assert 0 <= exc.offset <= len(text)
        return
    assert text.isascii() and 0 <= d.ps <= MAX_PS
    assert 0 <= d.seconds <= MAX_DURATION_SECONDS


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("30", "expected a unit (ms, s, m or h) after '30'"),
        ("5d", "unknown duration unit 'd'"),
        ("-5s", "takes no sign"),
        (-1, "takes no sign"),
        (float("nan"), "not a finite number"),
        (float("inf"), "not a finite number"),
        (True, "not a duration"),
        (None, "not a duration"),
        ("１s", "not a number with a unit"),  # fullwidth digit
        ("٣s", "not a number with a unit"),  # Arabic-Indic digit
        ("1" * 20 + "s", "more than 19 digits"),
        ("1.0000000001s", "more than 9 decimal places"),
        ("87601h", "at most ten years"),
        (10.0**300, "at most ten years"),
        ("5.s", "a digit must follow the '.'"),
        ("", "not a number with a unit"),
    ],
)
def test_refusals_name_the_problem(value, reason):
    with pytest.raises(ValueProblem, match=None) as info:
        parse_duration(value)
    assert reason in info.value.reason


def test_the_units_and_zero():
    assert [parse_duration(t).seconds for t in ("500ms", "30s", "1.5m", "1h", " 2 s ", "0")] == [
        0.5,
        30,
        90,
        3600,
        2,
        0,
    ]
    assert parse_duration("-30s", signed=True).seconds == -30
    assert parse_duration(MAX_DURATION_SECONDS).seconds == MAX_DURATION_SECONDS
    assert parse_duration("87600h").seconds == MAX_DURATION_SECONDS
    assert format_duration(Duration(1)) == "0.000000001ms"  # a picosecond, the finest step
    assert format_duration(parse_duration("90s")) == "90s"
    assert format_duration(parse_duration("120s")) == "2m"


# ---------------------------------------------------------------- sizes


@given(st.integers(min_value=0, max_value=MAX_BYTES))
def test_a_size_prints_to_text_that_parses_back_to_it(n):
    assert parse_size(format_size(n)) == n


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(SIZE_UNITS)))
def test_written_sizes_read_exactly(n, unit):
    assert parse_size(f"{n}{unit}") == n * SIZE_UNITS[unit]
    assert parse_size(f" {n} {unit} ") == n * SIZE_UNITS[unit]


@settings()
@given(st.one_of(st.text(alphabet=JUNK, max_size=30), st.integers(), st.floats(), st.none()))
def test_any_value_is_a_bounded_size_or_a_value_problem(value):
    try:
        n = parse_size(value)
    except ValueProblem:
        return
    assert isinstance(n, int) and 0 <= n <= MAX_BYTES


@pytest.mark.parametrize(
    "value", ["1.5MiB", "-1KiB", "5TB", "lots", "１KiB", 2**63, "9999999999GiB", 1.0, True]
)
def test_sizes_refused(value):
    with pytest.raises(ValueProblem):
        parse_size(value)


# ---------------------------------------------------------------- money and shares


@given(st.decimals(min_value=Decimal("0.000000001"), max_value=Decimal(10**6), places=9))
def test_usd_is_exact_to_the_nano(amount):
    parsed = parse_usd(float(amount))
    assert parsed == Decimal(str(float(amount))).normalize()
    assert parsed.as_tuple().exponent >= -9 or parsed == parsed.to_integral()


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 1e-10, "5", True, 1e16])
def test_usd_refused(value):
    with pytest.raises(ValueProblem):
        parse_usd(value)


def test_usd_has_one_spelling():
    assert str(parse_usd(10)) == str(parse_usd(10.0)) == "10"
    assert str(parse_usd(10.1)) == "10.1"


@given(st.integers(min_value=0, max_value=10_000))
def test_a_percentage_prints_to_text_that_parses_back_to_it(bp):
    assert parse_percent(format_percent(bp)) == bp


@pytest.mark.parametrize("text", ["101%", "5", "1.234%", "５%", "-5%", "1" * 20 + "%"])
def test_percentages_refused(text):
    assert parse_percent("0100%") == parse_percent("100%") == 10_000
    with pytest.raises(ValueProblem):
        parse_percent(text)


def test_fractions_take_a_number_or_a_percentage():
    assert [parse_fraction(v) for v in (0.8, 1, "80%", "100%")] == [0.8, 1.0, 0.8, 1.0]
    for bad in (0, 1.5, "0%", float("nan"), True, None):
        with pytest.raises(ValueProblem):
            parse_fraction(bad)


# ---------------------------------------------------------------- addresses


def test_hosts():
    assert host_problem("127.0.0.1") is None
    assert host_problem("::1") is None
    assert host_problem("stage-1.example.com") is None
    for bad in ("", "-x", "a b", None, 5, "x" * 300):
        assert host_problem(bad) is not None


# ---------------------------------------------------------------- one grammar everywhere


def test_every_reader_takes_an_hour(tmp_path):
    """A bug once: `1h` was accepted in docket.toml and refused in a scenario,
    a phase's budget, a stub flag and a fault argument. Now each reads it as 3600 s."""
    from chaos.faults.grammar import parse_fault
    from chaos.scenario import scenario_from_data
    from chaos.stub.cli import parse_duration as stub_duration
    from chaos.yamldoc import loads
    from docket.agent.config import config_from
    from docket.inputs import seconds_arg
    from docket.policy import policy_from_dict

    policy = policy_from_dict({"boundary": {"upstream_timeout": "1h"}})
    assert policy.boundary.upstream_timeout == 3600
    data, where = loads("max_wall_clock: 1h\nprobe_every: 1h\n", "s.yaml")
    assert scenario_from_data(data, where).max_wall_clock == 3600
    assert stub_duration("1h", "--latency") == 3600
    assert seconds_arg("1h") == seconds_arg("3600") == 3600
    assert dict(parse_fault("upstream:latency(1h)@20%").args)["delay"].ms == 3_600_000
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:1/v1", "OPENAI_API_KEY": "k"}
    assert config_from({**env, "DOCKET_AGENT_TIMEOUT": "1h"}).timeout == 3600
    # and a number is seconds in every file format
    data, where = loads("max_wall_clock: 30\n", "s.yaml")
    assert scenario_from_data(data, where).max_wall_clock == 30


def test_whole_numbers_as_text():
    from docket.values import parse_whole

    assert parse_whole("0042") == 42
    for bad in ("", "-1", "1.0", "５", "٣", "1" * 16, " 1"):
        with pytest.raises(ValueProblem, match="not a whole number"):
            parse_whole(bad)
    assert parse_whole("1" * 20, max_digits=20) == int("1" * 20)


def test_text_durations_from_a_flag_or_a_variable():
    from docket.values import duration_text

    texts = ("30", "0.5", ".5", "5.", "1e-06", "1.5e3", "2m", " 7 ")
    assert [duration_text(t).seconds for t in texts] == [30, 0.5, 0.5, 5, 1e-06, 1500, 120, 7]
    for bad in ("1e999", "-1", "30x", "٣"):
        with pytest.raises(ValueProblem):
            duration_text(bad)
    assert duration_text("-1", signed=True).seconds == -1


def test_a_scenario_agent_timeout_reaches_the_agent_as_plain_seconds():
    from chaos.scenario import AgentSpec

    assert AgentSpec(timeout=1e-06).settings()["DOCKET_AGENT_TIMEOUT"] == "0.000001"
    assert AgentSpec(timeout=2e6).settings()["DOCKET_AGENT_TIMEOUT"] == "2000000"
    assert AgentSpec(timeout=2.0).settings()["DOCKET_AGENT_TIMEOUT"] == "2"


DURATION_TEXTS = st.one_of(
    st.builds(
        lambda n, d, sp, u: f"{n}{'.' + d if d else ''}{sp}{u}",
        st.integers(min_value=0, max_value=10**6),
        st.text(alphabet="0123456789", max_size=10),
        st.sampled_from(["", " "]),
        st.sampled_from(["ms", "s", "m", "h", "d", "", "S", "min"]),
    ),
    st.text(alphabet=JUNK, max_size=12),
)


@settings(deadline=None)
@given(DURATION_TEXTS)
def test_every_file_reader_reads_a_duration_text_alike(text):
    """Policy, scenario and phase agree on every text: the same seconds, or all refuse."""
    from chaos.gameday.phase import parse_duration as phase_duration
    from chaos.scenario import scenario_from_data
    from chaos.yamldoc import Where
    from docket.errors import InputError
    from docket.policy import PolicyError, policy_from_dict

    expected = duration_seconds(text)
    if expected is not None and expected <= 0:
        return  # each reader has its own floor above zero: alike only on positive values
    try:
        policy = policy_from_dict({"boundary": {"upstream_timeout": text}})
        by_policy = policy.boundary.upstream_timeout
    except PolicyError:
        by_policy = None
    try:
        by_scenario = scenario_from_data({"max_wall_clock": text}, Where("s.yaml")).max_wall_clock
    except InputError:
        by_scenario = None
    assert by_policy == by_scenario == phase_duration(text) == expected


@pytest.mark.parametrize("text", ["\u30005s", "\u20005", "5s\u2000", "\x1c5s"])
def test_only_ascii_blanks_surround_a_value(text):
    from docket.values import duration_text

    with pytest.raises(ValueProblem):
        parse_duration(text)
    with pytest.raises(ValueProblem):
        duration_text(text)
