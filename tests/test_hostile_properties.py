"""The input grammars, property-tested: any text gets a value or the grammar's own
error, never another exception; what a checker accepts, every later reader accepts.

Pure functions only (no sockets, no processes): the CLI table is
tests/test_hostile_inputs.py.
"""

from __future__ import annotations

import math
import os
import tempfile
from urllib.parse import urlsplit

from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.faults.grammar import FaultSyntaxError, parse_fault
from chaos.yamldoc import YamlError, loads
from docket.errors import InputError, one_line
from docket.guards.egress import provider_entry
from docket.http.client import Origin
from docket.policy import load_policy, url_problem
from docket.values import MAX_DURATION_SECONDS, ValueProblem, duration_seconds, duration_text

# Characters that matter to each grammar, plus the ones that broke them: digits that
# are not ASCII, line breaks, NUL, an escape.
HOSTILE = "0123456789５٣.:-+@[]()\"'&*%, \t\n\r\x00\x1bmshKiBMGTaz=#{}!|?"
texts = st.text(alphabet=st.sampled_from(HOSTILE) | st.characters(), max_size=80)


@settings(deadline=None)
@given(texts)
def test_parse_duration_is_none_or_a_bounded_number(text):
    # as a file's string (a unit needed), and as a flag's text (a bare number is seconds)
    try:
        as_flag: float | None = duration_text(text).seconds
    except ValueProblem:
        as_flag = None
    for seconds in (duration_seconds(text), as_flag):
        assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION_SECONDS)
        if seconds is not None:
            assert text.isascii(), text


@settings(deadline=None)
@given(st.one_of(st.floats(allow_nan=True), st.integers(), st.booleans()))
def test_parse_duration_of_a_number(value):
    seconds = duration_seconds(value)
    assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION_SECONDS)


url_texts = st.builds(
    lambda scheme, authority, path: f"{scheme}://{authority}{path}",
    st.sampled_from(["http", "https", "ftp", "HTTP"]),
    st.text(alphabet=st.sampled_from("ab1.:[]-@_5５%"), max_size=20),
    st.sampled_from(["", "/", "/v1", "/a?b", "#x"]),
)


@settings(deadline=None)
@given(st.one_of(url_texts, texts))
def test_a_url_the_policy_accepts_every_later_reader_accepts(text):
    problem = url_problem(text)
    if problem is None:
        parts = urlsplit(text)
        assert parts.port is None or 1 <= parts.port <= 65535
        Origin.parse(text)
        provider_entry("p", text)


@settings(deadline=None)
@given(texts)
def test_any_fault_text_parses_or_is_one_fault_syntax_error(text):
    try:
        fault = parse_fault(text)
    except FaultSyntaxError as exc:
        assert "\n" not in one_line(str(exc))
        return
    assert parse_fault(fault.text) == fault  # what it accepts, it prints back


yaml_texts = st.text(alphabet=st.sampled_from("ab: -[]{}&*\n\"'!0.9５,"), max_size=60)


@settings(deadline=None)
@given(yaml_texts)
def test_any_yaml_text_loads_or_is_one_yaml_error(text):
    try:
        loads(text, "f.yaml")
    except YamlError as exc:
        assert str(exc).startswith("f.yaml:")


toml_texts = st.text(alphabet=st.sampled_from('ab=[]{}"\n .:5５-caps_ledgerhost'), max_size=60)


@settings(deadline=None)
@given(toml_texts)
def test_any_policy_text_loads_or_is_one_policy_error(text):
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False, encoding="utf-8") as f:
        f.write(text)
    try:
        load_policy(f.name)
    except InputError as exc:  # PolicyError, or the file-level refusals (empty)
        assert str(exc).startswith("policy ") and "\n" not in one_line(str(exc))
    finally:
        os.unlink(f.name)
