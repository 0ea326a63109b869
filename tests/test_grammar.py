"""The fault grammar: the design's examples, every kind, canonical text, column-exact errors."""

from __future__ import annotations

import datetime as dt
import email.utils

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.faults import VALUE_TYPES
from chaos.faults.grammar import Fault, FaultSyntaxError, parse_fault
from chaos.faults.table import FAMILIES
from chaos.faults.values import (
    Chance,
    Duration,
    HttpDate,
    Instant,
    Ordinals,
    Rate,
    Size,
    Trigger,
    Window,
)
from docket.errors import EXIT_USAGE, InputError

DESIGN_EXAMPLES = {
    "upstream:status(503, retry_after=2s)@20%": Fault(
        "upstream",
        "status",
        (("code", 503), ("retry_after", Duration(2000))),
        Trigger((Chance(2000),)),
    ),
    "upstream:latency(2s, jitter=500ms)@call 5..": Fault(
        "upstream",
        "latency",
        (("delay", Duration(2000)), ("jitter", Duration(500))),
        Trigger((Ordinals("call", 5, None),)),
    ),
    "upstream:truncate(after=3)@10%": Fault(
        "upstream", "truncate", (("after", 3),), Trigger((Chance(1000),))
    ),
    "net:timeout(0)@t 1s..4s": Fault(
        "net", "timeout", (("timeout", Duration(0)),), Trigger((Window(1000, 4000),))
    ),
    "net:reset_peer@5%": Fault("net", "reset_peer", (), Trigger((Chance(500),))),
    "ledger:enospc@seq 40..": Fault("ledger", "enospc", (), Trigger((Ordinals("seq", 40, None),))),
    "clock:step(-30s)@t 2s": Fault(
        "clock", "step", (("by", Duration(-30_000)),), Trigger((Instant(2000),))
    ),
    "process:sigkill(supervisor)@seq 25": Fault(
        "process", "sigkill", (("who", "supervisor"),), Trigger((Ordinals("seq", 25, 25),))
    ),
}


@pytest.mark.parametrize("text", list(DESIGN_EXAMPLES))
def test_design_examples_parse_to_the_expected_fault_and_print_back_unchanged(text):
    fault = parse_fault(text)
    assert fault == DESIGN_EXAMPLES[text]
    assert fault.text == text


# One text per kind (every kind of every family), in canonical form.
EVERY_KIND = [
    'upstream:status(429, retry_after="Wed, 21 Oct 2015 07:28:00 GMT")@call 2',
    "upstream:rate_limited(retry_after=1s)@call 1..3",
    "upstream:overloaded@50%",
    "upstream:malformed_json@always",
    "upstream:truncate(after=1KiB)@10%",
    "upstream:cut_stream(after=4)@call 7",
    "upstream:slow_first_byte(3s)@call 1",
    "upstream:slow_tokens(50ms)@20%",
    "upstream:latency(250ms)@t 1s..",
    "upstream:missing_usage@call 2.. & 33.33%",
    "net:latency(100ms, jitter=10ms, stream=upstream)@20%",
    "net:bandwidth(64KB/s)@always",
    "net:slow_close(2s)@call 1",
    "net:timeout(5s)@call 3..",
    "net:reset_peer(100ms)@5%",
    "net:slicer(average_size=64, size_variation=16, delay=1ms)@always",
    "net:limit_data(2MiB, stream=upstream)@call 1",
    "net:down@t 1s..2s",
    "ledger:enospc@seq 3",
    "ledger:eio@seq 10.. & 5%",
    "ledger:ebadf@seq 7..9",
    "ledger:torn(40B)@seq 25",
    "clock:step(90s)@seq 4",
    "clock:pause(2m)@t 500ms",
    "process:sigterm(agent)@call 3",
    "process:sigkill(agent)@t 2s",
]


def test_every_kind_of_every_family_is_exercised():
    covered = {tuple(t.split("@")[0].split("(")[0].split(":")) for t in EVERY_KIND}
    declared = {(target, kind) for target, fam in FAMILIES.items() for kind in fam.kinds}
    assert covered == declared


@pytest.mark.parametrize("text", EVERY_KIND)
def test_every_kind_parses_and_prints_back_unchanged(text):
    fault = parse_fault(text)
    assert fault.text == text
    assert parse_fault(fault.text) == fault


@pytest.mark.parametrize(
    "given, canonical",
    [
        ("net:reset_peer(0)@5%", "net:reset_peer@5%"),  # a default is dropped
        ("net:reset_peer()@5%", "net:reset_peer@5%"),
        ("net:latency(100ms, stream=downstream)@20%", "net:latency(100ms)@20%"),
        ("net:latency(delay=0.1s)@20.0%", "net:latency(100ms)@20%"),
        ("upstream:latency(60000ms)@call 5..5", "upstream:latency(1m)@call 5"),
        (
            "upstream:status( 503 ,retry_after = 120s )@ 20% &call 5..",
            "upstream:status(503, retry_after=2m)@call 5.. & 20%",
        ),
        ("upstream:malformed_json", "upstream:malformed_json@always"),
        ("clock:step(+1.5s)@t 0..2s", "clock:step(1500ms)@t 0..2s"),
        ("net:limit_data(1024B)@call 1", "net:limit_data(1KiB)@call 1"),
        ("ledger:eio@7.5% & t 1s.. & seq 4..", "ledger:eio@seq 4.. & t 1s.. & 7.5%"),
    ],
)
def test_equivalent_texts_normalise_to_one_canonical_form(given, canonical):
    fault = parse_fault(given)
    assert fault.text == canonical
    assert parse_fault(canonical) == fault


def test_values_are_exact_integers_in_their_unit():
    fault = parse_fault("net:slicer(average_size=10, delay=1.25s)@always")
    assert fault.arg("delay") == Duration(1250)
    assert fault.arg("size_variation") == 0  # the default, left out of the text
    assert parse_fault("net:limit_data(3MiB)").arg("bytes") == Size(3 * 1024 * 1024)
    assert parse_fault("net:bandwidth(7KB/s)").arg("rate") == Rate(7)
    assert parse_fault("net:latency(1ms)").arg("stream") == "downstream"
    with pytest.raises(KeyError):
        parse_fault("net:down").arg("stream")


def test_the_counter_is_the_targets_default_unless_the_trigger_names_one():
    assert parse_fault("upstream:overloaded@20%").counter == "call"
    assert parse_fault("ledger:eio@20%").counter == "seq"
    assert parse_fault("process:sigterm(agent)@20%").counter == "seq"
    assert parse_fault("process:sigterm(agent)@call 4").counter == "call"


# (text, column, words the reason must contain)
MALFORMED = [
    ("upstream status(503)@20%", 9, "expected ':'"),  # missing colon
    ("stub:status(503)@20%", 1, "unknown target 'stub'"),
    ("upstream:teapot@20%", 10, "unknown upstream kind 'teapot'"),
    ("upstream:latency(2d)@20%", 19, "unknown duration unit 'd'"),
    ("upstream:status(503@20%", 24, "expected ',' or ')'"),  # unclosed paren
    ("upstream:overloaded@120%", 21, "at most 100%"),
    ("upstream:overloaded@call 9..3", 29, "range end 3 is before its start 9"),
    ("upstream:overloaded@20% junk", 25, "expected '&' or end of text"),  # trailing garbage
    ("upstream:overloaded junk", 21, "expected '@' or end of text"),
    ("ledger:eio@call 3", 12, "cannot count 'call'"),  # a counter the ledger cannot see
    ("upstream:status(200)@20%", 17, "at least 400"),
    ("upstream:status(503, colour=red)@20%", 22, "unknown argument 'colour'"),
    ("upstream:status(retry_after=2s)@20%", 31, "needs its 'code' argument"),
    ("upstream:latency(2s, 3s)@20%", 22, "positional"),
    ("upstream:latency(2s, delay=3s)@20%", 28, "given twice"),
    ("upstream:latency(2)@20%", 19, "expected a unit"),
    ("upstream:latency(-2s)@20%", 18, "takes no sign"),
    ("upstream:latency(1.0005s)@20%", 18, "whole number of milliseconds"),
    ("net:limit_data(12TB)@20%", 18, "unknown size unit 'TB'"),
    ("net:bandwidth(100)@20%", 15, "KB/s"),
    ("net:latency(1ms, stream=sideways)@20%", 25, "upstream, downstream"),
    ("process:sigkill(everyone)@seq 1", 17, "supervisor, agent"),
    ("clock:step(0)@seq 1", 12, "cannot be zero"),
    ('upstream:status(503, retry_after="soon")@1%', 34, "not an HTTP date"),
    ('upstream:status(503, retry_after="Wed)@1%', 34, "unclosed"),
    ("upstream:overloaded@20", 23, "expected '%'"),
    ("upstream:overloaded@12.345%", 21, "two decimal places"),
    ("upstream:overloaded@call 0", 26, "start at 1"),
    ("upstream:overloaded@call5", 25, "a space after 'call'"),
    ("upstream:overloaded@sometimes", 21, "expected a percentage"),
    ("upstream:overloaded@t 4s..1s", 27, "after its start"),
    ("upstream:overloaded@always & 5%", 21, "cannot be combined"),
    ("upstream:overloaded@5% & 6%", 26, "at most one condition of each kind"),
    ("upstream:overloaded@call 1 & seq 2", 21 + 9, "cannot count 'seq'"),
    ("", 1, "expected a target"),
]


@pytest.mark.parametrize("text, column, words", MALFORMED)
def test_malformed_faults_name_the_exact_column_and_what_was_wrong(text, column, words):
    with pytest.raises(FaultSyntaxError) as caught:
        parse_fault(text)
    err = caught.value
    assert err.column == column, str(err)
    assert words in err.reason
    message = str(err)
    assert message == f"fault {text!r}: column {column}: {err.reason}"
    assert "\n" not in message
    assert isinstance(err, InputError) and err.exit_code == EXIT_USAGE


@settings(deadline=None)
@given(st.text(alphabet='upstreamnetlegrclkoi:()@,=%&. 0123456789smKiBMGb-+"_/', max_size=40))
def test_arbitrary_text_either_parses_canonically_or_fails_with_one_line(text):
    try:
        fault = parse_fault(text)
    except FaultSyntaxError as err:
        assert 1 <= err.column <= len(text) + 1
        assert "\n" not in str(err)
    else:
        assert parse_fault(fault.text) == fault


# ---------------------------------------------------------------- round trip


def _value(kind: str, param) -> st.SearchStrategy:
    lowest = 1 if param.nonzero else 0
    if kind == "int":
        lo = param.minimum if param.minimum is not None else 0
        hi = param.maximum if param.maximum is not None else 10**9
        return st.integers(lo, hi)
    if kind == "duration":
        return st.integers(lowest, 10**8).map(Duration)
    if kind == "signed_duration":
        return st.integers(-(10**8), 10**8).filter(lambda n: n or not param.nonzero).map(Duration)
    if kind == "size":
        return st.integers(0, 2**40).map(Size)
    if kind == "rate":
        return st.integers(0, 10**7).map(Rate)
    if kind == "http_date":
        moments = st.datetimes(dt.datetime(1990, 1, 1), dt.datetime(2100, 1, 1))
        return moments.map(
            lambda m: HttpDate(
                email.utils.format_datetime(m.replace(microsecond=0, tzinfo=dt.UTC), usegmt=True)
            )
        )
    if kind == "choice":
        return st.sampled_from(param.choices)
    raise AssertionError(f"no strategy for {kind}")


def test_the_strategies_cover_every_value_type():
    used = {
        t
        for fam in FAMILIES.values()
        for k in fam.kinds.values()
        for p in k.params
        for t in p.types
    }
    assert used <= VALUE_TYPES
    for kind in VALUE_TYPES:
        assert _value(kind, FAMILIES["net"].kinds["latency"].params[0]) is not None


@st.composite
def triggers(draw, family) -> Trigger:
    conditions = []
    if draw(st.booleans()):
        counter = draw(st.sampled_from(family.counters))
        first = draw(st.integers(1 if counter == "call" else 0, 10**6))
        last = draw(st.one_of(st.none(), st.integers(first, first + 10**6)))
        conditions.append(Ordinals(counter, first, last))
    timed = draw(st.sampled_from(["none", "window", "instant"]))
    ms = st.integers(0, 10**7)
    if timed == "window":
        start = draw(ms)
        end = draw(st.one_of(st.none(), st.integers(start + 1, start + 10**7)))
        conditions.append(Window(start, end))
    elif timed == "instant":
        conditions.append(Instant(draw(ms)))
    if draw(st.booleans()):
        conditions.append(Chance(draw(st.integers(0, 10_000))))
    return Trigger(tuple(conditions))


@st.composite
def faults(draw) -> Fault:
    target = draw(st.sampled_from(sorted(FAMILIES)))
    family = FAMILIES[target]
    kind = draw(st.sampled_from(sorted(family.kinds)))
    args = []
    for param in family.kinds[kind].params:
        if param.required or draw(st.booleans()):
            value = draw(_value(draw(st.sampled_from(param.types)), param))
            if value != param.default:  # the canonical form leaves defaults out
                args.append((param.name, value))
    return Fault(target, kind, tuple(args), draw(triggers(family)))


@settings(deadline=None)
@given(faults())
def test_every_fault_prints_to_text_that_parses_back_to_the_same_fault(fault):
    text = fault.text
    assert parse_fault(text) == fault
    assert parse_fault(text).text == text
