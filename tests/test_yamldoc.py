"""chaos.yamldoc: hand-edited YAML is reported as FILE:LINE: reason, and only the safe subset is read."""

from __future__ import annotations

import pytest
from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.yamldoc import YamlError, load, loads
from docket.errors import InputError

DOC = """\
seed: 7
faults:
  - "upstream:status(503)@20%"
  - "net:reset_peer@5%"
agents:
  - name: a
    mode: loop
"""


def test_values_and_the_line_of_every_path():
    data, where = loads(DOC, "s.yaml")
    assert data == {
        "seed": 7,
        "faults": ["upstream:status(503)@20%", "net:reset_peer@5%"],
        "agents": [{"name": "a", "mode": "loop"}],
    }
    assert where.line(("seed",)) == 1
    assert where.line(("faults", 1)) == 4
    assert where.line(("agents", 0, "mode")) == 7
    # a key that is not there is reported where its parent is
    assert where.line(("agents", 0, "calls")) == 6


def test_an_error_names_file_line_and_path():
    _, where = loads(DOC, "s.yaml")
    err = where.error(("agents", 0, "mode"), "unknown mode 'lop'")
    assert isinstance(err, InputError)
    assert str(err) == "s.yaml:7: at agents[0].mode unknown mode 'lop'"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: 1\nb: 2\na: 3\n", "s.yaml:3: key 'a' repeated"),
        ("a: [1, 2\n", "s.yaml:2: not valid YAML"),
        ("", "s.yaml:1: empty document"),
        ("# only a comment\n", "s.yaml:1: empty document"),
        ("a: !!python/object/apply:os.system [true]\n", "s.yaml:1: not valid YAML"),
        ("a: 1\n---\nb: 2\n", "s.yaml:2: not valid YAML"),
        ("a: \x07\n", "s.yaml:1: not valid YAML"),
    ],
)
def test_malformed_documents_are_one_line_errors(text, expected):
    with pytest.raises(YamlError) as info:
        loads(text, "s.yaml")
    assert str(info.value).startswith(expected)
    assert "\n" not in str(info.value)


def test_files_missing_empty_binary_or_huge_are_refused(tmp_path):
    cases = {
        "missing.yaml": None,
        "empty.yaml": b"",
        "binary.yaml": b"a: 1\x00\n",
        "huge.yaml": b"a: " + b"x" * (2 * 1024 * 1024) + b"\n",
        "latin1.yaml": "a: caf\u00e9\n".encode("latin-1"),
    }
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(InputError) as info:
            load(path)
        assert str(path) in str(info.value)


@settings(max_examples=io_examples(), deadline=None)
@given(
    st.recursive(
        # integers the reader takes: a number of more than 32 characters is refused
        # (chaos/yamldoc.py), which a 33-character -10**31 found once in a thousand runs
        st.none() | st.booleans() | st.integers(-(10**31) + 1, 10**31 - 1) | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=3)
        ),
        max_leaves=8,
    )
)
def test_round_trips_what_pyyaml_writes(value):
    import yaml

    text = yaml.safe_dump({"v": value})
    data, _ = loads(text, "h.yaml")
    assert data == {"v": value}
